"""Generate text from a Megatron checkpoint: MindSpeed-LLM's entry.

    torchrun --nproc_per_node N inference.py <the model flags of pretrain_gpt.py> \\
        --load CKPT | --hf-load-dir HF_DIR  --tokenizer-type HuggingFaceTokenizer --tokenizer-model TOK \\
        (--prompt TEXT [--stream] | --input-file prompts.jsonl --output-file out.jsonl) \\
        [--task greedy_search|greedy_search_with_sampling|do_sample|return_output_log_probs|beam_search|
                beam_search_with_sampling|chat] \\
        [--temperature T --top-k K --top-p P --seed S] [--num-beams N] \\
        [--max-new-tokens N] [--max-length N] [--use-kv-cache] [--add-eos-token TOKEN ...]

The model is ``pretrain_gpt.py``'s (its ``model_provider``), built by Megatron's ``get_model`` at the
layout the flags give (TP, PP) and filled by Megatron's ``load_checkpoint`` (any format the training
writes: safetensors, torch_dist, torch; no optimizer state) or from a Hugging Face directory
(``--hf-load-dir``, the training's online conversion), or, with ``--mm-model model.json``, the
LLaVAModel of a ``pretrain_mm.py`` checkpoint, whose language model then generates from text; then LoRA adapters where ``--lora-load`` names them
(a PEFT directory or a Megatron adapters checkpoint, as fine-tuning loads them; ``--lora-r`` and the other
LoRA flags describe them). The generation loop is ``adaptor.inference``;
the flags are ``patches.inference.generation``'s. ``--micro-batch-size`` prompts (8 unless given) go together in one
batch; beam search takes one prompt at a time, its beams being the batch. Sampling draws from a generator
seeded with ``--seed``, the same on every rank. ``--task chat`` renders conversations with the tokenizer's
chat template (else ``--prompt-type``'s built-in one; tools/chat_template.py, the renderer the instruction
datasets use) and the generation prompt; without ``--prompt`` or ``--input-file`` it talks on the
terminal, keeping the conversation, until an empty line or end of input. With ``--input-file`` rank 0 writes
one JSON object per prompt, in order; ``--prompt`` prints the generated text. ``return_output_log_probs``
samples as ``greedy_search_with_sampling`` (``do_sample`` is MindSpeed-LLM's other name for it) and adds
``log_probs``: each generated token's log-probability under the model's own softmax.
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import json
import sys
from pathlib import Path

from adaptor.inference import running_inference


def read_prompts(path: str, key: str = "prompt") -> list:
    """The ``key`` of every JSON line: prompt texts, or (``messages``) conversations."""
    from adaptor.errors import fail

    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        fail(f"--input-file {path}: {exc.strerror or exc}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            prompt = record[key]
        except (ValueError, KeyError, TypeError) as exc:
            what = "not valid JSON" if isinstance(exc, ValueError) else f'no "{key}" key'
            fail(f"--input-file {path}, line {number}: {what}")
        wanted = str if key == "prompt" else list
        if not isinstance(prompt, wanted):
            fail(f"--input-file {path}, line {number}: \"{key}\" is not a {'string' if wanted is str else 'list'}")
        prompts.append(prompt)
    if not prompts:
        fail(f"--input-file {path}: no prompts")
    return prompts


def build_and_load(args, entry: str = "inference.py"):
    """The model at this layout, in eval mode, with the checkpoint's (or the HF directory's) weights
    (evaluation.py's too: ``entry`` names the script in the error)."""
    from megatron.core.enums import ModelType
    from megatron.training.checkpointing import checkpoint_exists, load_checkpoint
    from megatron.training.training import get_model

    from adaptor.convert import ConversionError
    from adaptor.convert.online import load_hf_weights
    from adaptor.errors import fail
    from pretrain_gpt import model_provider

    multimodal = getattr(args, "mm_model", None) is not None
    if multimodal and (args.load is None or getattr(args, "lora_load", None)):
        fail(f"{entry} --mm-model runs the language model of a pretrain_mm.py checkpoint: give it as --load "
             f"(no --lora-load)")
    if args.load is None and args.hf_load_dir is None:
        fail(f"{entry} needs weights: --load CKPT or --hf-load-dir HF_DIR")
    if args.load is not None and not checkpoint_exists(args.load):
        fail(f"--load {args.load}: no checkpoint there (no latest_checkpointed_iteration.txt)")
    model = get_model(_multimodal_provider if multimodal else model_provider, ModelType.encoder_or_decoder,
                      wrap_with_ddp=False)
    if args.load is not None:
        args.no_load_optim, args.no_load_rng = True, True
        load_checkpoint(model, None, None, strict=True)
    else:
        try:
            load_hf_weights(model, args)
        except (ConversionError, OSError) as exc:
            fail(f"--hf-load-dir {args.hf_load_dir}: {exc}")
    if getattr(args, "lora_load", None):  # LoRA adapters on the base weights, as fine-tuning loads them
        from adaptor.convert.lora import is_peft_adapter
        from adaptor.convert.online import load_peft_lora

        if is_peft_adapter(args.lora_load):
            load_peft_lora(model, None, args)
        else:
            if not checkpoint_exists(args.lora_load):
                fail(f"--lora-load {args.lora_load}: no adapter checkpoint there (no latest_checkpointed_iteration.txt)")
            load_checkpoint(model, None, None, load_arg="lora_load", strict=False)
    if multimodal:  # the checkpoint holds the whole LLaVAModel; text runs through its language model
        from megatron.core.utils import unwrap_model

        model = [unwrap_model(chunk).language_model for chunk in model]
    for chunk in model:
        chunk.eval()
    return model


def _multimodal_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """pretrain_mm.py's LLaVAModel from --mm-model, without the initial weights model.json names (the
    --load checkpoint replaces every tensor)."""
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    from adaptor.mm.config import run_model_config
    from adaptor.mm.model import build_llava_model

    args = get_args()
    config = config or core_transformer_config_from_args(args)
    return build_llava_model(args, run_model_config(args), config, pre_process, post_process, vp_stage,
                             pg_collection)


def chat_renderer(args, need: str = "--task chat"):
    """``render(messages, add_generation_prompt=True) -> text``: the conversation (and the generation
    prompt), as transformers' ``apply_chat_template`` writes it: the tokenizer's template, else
    ``--prompt-type``'s built-in one; with ``--hf-chat-template`` the tokenizer's, or one line."""
    from adaptor.errors import fail

    sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
    import chat_template

    directory = chat_template.tokenizer_directory(args.tokenizer_model)
    try:
        kind = chat_template.prompt_type(args.prompt_type) if args.prompt_type else None
        template = chat_template.find_template(directory, kind or chat_template.PROMPT_TYPES["chatml"])
        if template.source.startswith("built-in") and getattr(args, "hf_chat_template", False):
            fail(f"--hf-chat-template: the tokenizer ({directory}) has no chat template (chat_template.jinja or "
                 f"tokenizer_config.json's chat_template); drop it and give --prompt-type "
                 f"({', '.join(chat_template.PROMPT_TYPES)})")
        if template.source.startswith("built-in") and kind is None:
            fail(f"{need} needs a chat template: the tokenizer ({directory}) has none (chat_template.jinja "
                 f"or tokenizer_config.json's chat_template); give --prompt-type "
                 f"({', '.join(chat_template.PROMPT_TYPES)})")
        compiled = chat_template.compile_template(template.text)
        variables = chat_template.special_token_variables(chat_template.read_config(directory))
    except chat_template.ChatTemplateError as exc:
        fail(str(exc))

    def render(messages: list, add_generation_prompt: bool = True) -> str:
        try:
            return compiled.render(messages=chat_template.normalize_messages(messages), tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables)
        except Exception as exc:  # the template's own raise_exception, or odd messages
            raise ValueError(f"the chat template failed: {chat_template._one_line(exc)}") from None

    render.template_text = template.text  # lm-eval records which template scored
    return render


def _streamer(tokenizer):
    """Print the text of the generated ids as it grows: each step, what the new ids add to it."""
    shown = [""]

    def on_step(ids: list[int]) -> None:
        text = tokenizer.detokenize(ids)
        if text.startswith(shown[0]) and not text.endswith("\ufffd"):  # a whole character more
            sys.stdout.write(text[len(shown[0]):])
            sys.stdout.flush()
            shown[0] = text

    return on_step


def prompt_ids(args, tokenizer, render, text, number: int) -> list[int]:
    """The ids of one prompt (a conversation rendered first for --task chat); one line if it cannot fit."""
    from adaptor.errors import fail

    where = ("--prompt" if args.prompt is not None else f"--input-file {args.input_file}, prompt {number}"
             if args.input_file is not None else "the demonstration prompt")
    if render is not None:
        try:
            text = render(text)
        except ValueError as exc:
            fail(f"{where}: {exc}")
    ids = list(tokenizer.tokenize(text))
    max_length = args.max_length or args.seq_length
    if not ids:
        fail(f"{where}: empty prompt")
    if len(ids) >= max_length:
        limit = "--seq-length" if max_length == args.seq_length else "--max-length"
        fail(f"{where} is {len(ids)} tokens; {limit} {max_length} leaves no room to generate")
    return ids


def converse(args, tokenizer, render, model) -> None:
    """A conversation on the terminal, with MindSpeed-LLM's commands: rank 0 reads each user turn and every
    rank answers it (greedy); ``clear`` or ``new`` starts over, ``q``, ``quit``, ``exit`` or end of input
    ends it, an empty line is skipped."""
    import torch

    from adaptor.errors import fail
    from adaptor.inference import Sampling, greedy_batch, stop_ids

    vocab = min(tokenizer.vocab_size, args.padded_vocab_size)
    max_length = args.max_length or args.seq_length
    stops = stop_ids(tokenizer, args.add_eos_token)
    sampling = Sampling(args.temperature, args.top_k, args.top_p) if args.chat_samples else None
    generator = torch.Generator(device=next(model[0].parameters()).device).manual_seed(args.seed)
    messages = []
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        print("inference.py chat: 'clear' or 'new' starts over; 'q', 'quit', 'exit' or end of input ends", flush=True)
    while True:
        line = [None]
        if rank0:
            try:
                line[0] = input("\nuser> ").strip()
            except EOFError:
                line[0] = "quit"
        torch.distributed.broadcast_object_list(line, src=0)
        if line[0] in ("q", "quit", "exit"):
            break
        if line[0] in ("clear", "new") or not line[0]:
            messages = [] if line[0] else messages
            continue
        messages.append({"role": "user", "content": line[0]})
        ids = list(tokenizer.tokenize(render(messages)))
        if len(ids) >= max_length:
            fail(f"the conversation is {len(ids)} tokens; --seq-length {max_length} leaves no room to answer")
        if rank0:
            sys.stdout.write("assistant> ")
        [reply] = greedy_batch(model, [ids], max_new_tokens=args.max_new_tokens, max_length=max_length, stops=stops,
                               vocab_size=vocab, use_kv_cache=args.use_kv_cache, sampling=sampling,
                               generator=generator, on_step=_streamer(tokenizer) if rank0 else None)
        kept = reply.token_ids[:-1] if reply.stopped else reply.token_ids
        messages.append({"role": "assistant", "content": tokenizer.detokenize(kept)})
        if rank0:
            sys.stdout.write("\n")
            sys.stdout.flush()
    torch.distributed.barrier()


def run_task(args, task: str, tokenizer, model, texts: list, prompts: list[list[int]], several: bool) -> None:
    """One task on ``texts`` (prompts, or conversations for chat; ``prompts`` their ids): printed, or
    written to --output-file."""
    import time

    import torch

    from adaptor.errors import fail
    from adaptor.inference import SAMPLING_TASKS, Sampling, beam_search, greedy_batch, stop_ids

    chat = task == "chat"
    try:
        stops = stop_ids(tokenizer, args.add_eos_token)
    except ValueError as exc:
        fail(str(exc))
    vocab = min(tokenizer.vocab_size, args.padded_vocab_size)
    samples = task in SAMPLING_TASKS or (chat and args.chat_samples)
    sampling = Sampling(args.temperature, args.top_k, args.top_p) if samples else None
    log_probs = task == "return_output_log_probs"
    device = next(model[0].parameters()).device
    generator = torch.Generator(device=device).manual_seed(args.seed)
    limits = dict(max_new_tokens=args.max_new_tokens, max_length=args.max_length or args.seq_length, stops=stops,
                  vocab_size=vocab, use_kv_cache=args.use_kv_cache, sampling=sampling, generator=generator)
    rank0 = torch.distributed.get_rank() == 0
    if rank0 and several:
        print(f"== {task} ==", flush=True)
    results = []
    started = time.perf_counter()
    if task.startswith("beam_search"):
        for ids in prompts:
            results.append(beam_search(model, ids, num_beams=args.num_beams, **limits))
    else:
        on_step = _streamer(tokenizer) if args.stream and rank0 else None
        for first in range(0, len(prompts), args.micro_batch_size):
            results += greedy_batch(model, prompts[first: first + args.micro_batch_size], on_step=on_step,
                                    log_probs=log_probs, **limits)
    elapsed = time.perf_counter() - started
    if rank0:
        generated = sum(len(r.token_ids) for r in results)
        print(f"inference.py: generated {generated} tokens for {len(results)} prompts in {elapsed:.3f} s "
              f"({generated / max(elapsed, 1e-9):.1f} tokens/s)", file=sys.stderr, flush=True)
        records = []
        for text, result in zip(texts, results):
            kept = result.token_ids[:-1] if result.stopped else result.token_ids
            record = {"messages": text, "prompt_token_ids": result.prompt_ids} if chat else {"prompt": text}
            records.append({**record, "text": tokenizer.detokenize(kept), "token_ids": result.token_ids})
            if log_probs:
                records[-1]["log_probs"] = result.log_probs
        if args.output_file is not None:
            out = Path(args.output_file)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
            tmp.replace(out)
            print(f"inference.py: wrote {len(records)} generations to {out}", flush=True)
        elif args.stream and not task.startswith("beam_search"):
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            sys.stdout.write(records[0]["text"] + "\n")
            if log_probs:
                sys.stdout.write(json.dumps({"token_ids": records[0]["token_ids"],
                                             "log_probs": records[0]["log_probs"]}) + "\n")
            sys.stdout.flush()
    torch.distributed.barrier()


def main():
    running_inference()
    from megatron.training import get_args, get_tokenizer
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.initialize import initialize_megatron

    from adaptor.inference import DEMONSTRATION_PROMPT

    # --micro-batch-size: prompts generated together (8 unless given)
    parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer", "micro_batch_size": 8})
    initialize_megatron()
    args = get_args()
    tokenizer = get_tokenizer()
    tasks = args.task  # a list, in order (patches.inference.generation)
    render = chat_renderer(args) if "chat" in tasks else None
    if args.input_file is not None:
        texts = read_prompts(args.input_file, "messages" if tasks == ["chat"] else "prompt")
    else:  # --prompt, or MindSpeed-LLM's demonstration prompt when a script gives neither
        texts = [args.prompt if args.prompt is not None else DEMONSTRATION_PROMPT]
    jobs = []  # (task, its texts, their ids), every prompt checked before the model loads
    for task in tasks:
        if task == "chat" and args.input_file is None:
            if args.prompt is None:
                jobs.append((task, None, None))  # the terminal conversation
                continue
            task_texts = [[{"role": "user", "content": args.prompt}]]
        else:
            task_texts = texts
        ids = [prompt_ids(args, tokenizer, render if task == "chat" else None, text, number)
               for number, text in enumerate(task_texts, 1)]
        jobs.append((task, task_texts, ids))
    model = build_and_load(args)
    import torch

    for task, task_texts, ids in jobs:
        if task_texts is None:
            if len(tasks) > 1 and torch.distributed.get_rank() == 0:
                print(f"== {task} ==", flush=True)
            converse(args, tokenizer, render, model)
        else:
            run_task(args, task, tokenizer, model, task_texts, ids, len(tasks) > 1)


if __name__ == "__main__":
    main()
