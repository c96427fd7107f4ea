"""Generate text from a Megatron checkpoint (greedy search): MindSpeed-LLM's entry.

    torchrun --nproc_per_node N inference.py <the model flags of pretrain_gpt.py> \\
        --load CKPT | --hf-load-dir HF_DIR  --tokenizer-type HuggingFaceTokenizer --tokenizer-model TOK \\
        (--prompt TEXT | --input-file prompts.jsonl --output-file out.jsonl) \\
        [--max-new-tokens N] [--max-length N] [--use-kv-cache] [--add-eos-token TOKEN ...]

The model is ``pretrain_gpt.py``'s (its ``model_provider``), built by Megatron's ``get_model`` at the
layout the flags give (TP, PP) and filled by Megatron's ``load_checkpoint`` (any format the training
writes: safetensors, torch_dist, torch; no optimizer state) or from a Hugging Face directory
(``--hf-load-dir``, the training's online conversion). The generation loop is ``adaptor.inference``;
the flags are ``patches.inference.generation``'s. ``--micro-batch-size`` prompts (8 unless given) go together in one
batch. With ``--input-file`` rank 0 writes one JSON object per prompt, in order; ``--prompt`` prints
the generated text.
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import json
import sys
from pathlib import Path

from adaptor.inference import running_inference


def read_prompts(path: str) -> list[str]:
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
            prompt = record["prompt"]
        except (ValueError, KeyError, TypeError) as exc:
            what = "not valid JSON" if isinstance(exc, ValueError) else 'no "prompt" key'
            fail(f"--input-file {path}, line {number}: {what}")
        if not isinstance(prompt, str):
            fail(f"--input-file {path}, line {number}: \"prompt\" is not a string")
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

    if args.load is None and args.hf_load_dir is None:
        fail(f"{entry} needs weights: --load CKPT or --hf-load-dir HF_DIR")
    if args.load is not None and not checkpoint_exists(args.load):
        fail(f"--load {args.load}: no checkpoint there (no latest_checkpointed_iteration.txt)")
    model = get_model(model_provider, ModelType.encoder_or_decoder, wrap_with_ddp=False)
    if args.load is not None:
        args.no_load_optim, args.no_load_rng = True, True
        load_checkpoint(model, None, None, strict=True)
    else:
        try:
            load_hf_weights(model, args)
        except (ConversionError, OSError) as exc:
            fail(f"--hf-load-dir {args.hf_load_dir}: {exc}")
    for chunk in model:
        chunk.eval()
    return model


def main():
    running_inference()
    from megatron.training import get_args, get_tokenizer
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.initialize import initialize_megatron

    from adaptor.errors import fail
    from adaptor.inference import greedy_batch, stop_ids

    # --micro-batch-size: prompts generated together (8 unless given)
    parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer", "micro_batch_size": 8})
    initialize_megatron()
    args = get_args()
    tokenizer = get_tokenizer()
    texts = [args.prompt] if args.prompt is not None else read_prompts(args.input_file)
    max_length = args.max_length or args.seq_length
    prompts = []
    for number, text in enumerate(texts, 1):
        ids = list(tokenizer.tokenize(text))
        where = "--prompt" if args.prompt is not None else f"--input-file {args.input_file}, prompt {number}"
        if not ids:
            fail(f"{where}: empty prompt")
        if len(ids) >= max_length:
            limit = "--seq-length" if max_length == args.seq_length else "--max-length"
            fail(f"{where} is {len(ids)} tokens; {limit} {max_length} leaves no room to generate")
        prompts.append(ids)
    try:
        stops = stop_ids(tokenizer, args.add_eos_token)
    except ValueError as exc:
        fail(str(exc))
    model = build_and_load(args)
    vocab = min(tokenizer.vocab_size, args.padded_vocab_size)
    results = []
    for first in range(0, len(prompts), args.micro_batch_size):
        results += greedy_batch(model, prompts[first: first + args.micro_batch_size],
                                max_new_tokens=args.max_new_tokens, max_length=max_length, stops=stops,
                                vocab_size=vocab, use_kv_cache=args.use_kv_cache)
    import torch

    if torch.distributed.get_rank() == 0:
        records = []
        for text, result in zip(texts, results):
            kept = result.token_ids[:-1] if result.stopped else result.token_ids
            records.append({"prompt": text, "text": tokenizer.detokenize(kept), "token_ids": result.token_ids})
        if args.output_file is not None:
            out = Path(args.output_file)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
            tmp.replace(out)
            print(f"inference.py: wrote {len(records)} generations to {out}", flush=True)
        else:
            sys.stdout.write(records[0]["text"] + "\n")
            sys.stdout.flush()
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
