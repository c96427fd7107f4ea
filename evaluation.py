"""Evaluate a Megatron checkpoint on lm-eval benchmarks: MindSpeed-LLM's entry name, lm-eval as the engine.

    torchrun --nproc_per_node N evaluation.py <the model flags of pretrain_gpt.py> \\
        --load CKPT | --hf-load-dir HF_DIR  --tokenizer-type HuggingFaceTokenizer --tokenizer-model TOK \\
        --task NAME [NAME ...] [--include-path DIR] [--task-data-path MMLU_DIR] \\
        [--num-fewshot N] [--limit N] [--eval-output-file results.json] [--hf-chat-template | --prompt-type T]

The model is built and loaded as inference.py does (``pretrain_gpt.py``'s ``model_provider`` at the
layout the flags give; ``--load`` in any format the training writes, or ``--hf-load-dir``), then
lm-eval's ``simple_evaluate`` runs the tasks on it through :class:`adaptor.evaluation.lm.MegatronLM`.
Every rank runs every request (TP and PP ranks work on each batch together); rank 0 prints lm-eval's
table and writes ``--eval-output-file``. With ``--hf-chat-template`` (the tokenizer's chat template) or
``--prompt-type`` (the tokenizer's template, else that built-in one), MindSpeed-LLM's switches for
instruction-tuned models, every request is rendered as a conversation (lm-eval's ``apply_chat_template``). The flags are ``patches.inference.evaluation``'s; lm-eval is
an optional dependency (``pip install -e ".[eval]"``).
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import json
from pathlib import Path

from adaptor.evaluation import import_lm_eval, running_evaluation


def write_results(path: str, results: dict) -> None:
    """lm-eval's metrics and, per task, each document's requests with their scores (rank 0)."""
    samples = {}
    for task, docs in (results.get("samples") or {}).items():
        samples[task] = [{"doc_id": d["doc_id"], "target": d.get("target"),
                          "arguments": [list(a) for a in d.get("arguments", [])],
                          "responses": d.get("filtered_resps")} for d in docs]
    record = {key: results.get(key) for key in ("results", "groups", "versions", "n-shot", "higher_is_better")}
    record["samples"] = samples
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str, ensure_ascii=False), encoding="utf-8")
    tmp.replace(out)


def main():
    running_evaluation()
    from megatron.training import get_args, get_tokenizer
    from megatron.training.arguments import parse_and_validate_args
    from megatron.training.initialize import initialize_megatron

    from adaptor.errors import fail

    # --micro-batch-size: requests scored together (8 unless given)
    parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer", "micro_batch_size": 8})
    import_lm_eval()
    from adaptor.evaluation.tasks import TaskError, resolve

    args = get_args()
    try:
        manager, tasks = resolve(args.task, args.include_path, args.task_data_path)
    except TaskError as exc:
        fail(str(exc))
    initialize_megatron()
    tokenizer = get_tokenizer()
    from inference import build_and_load

    render = None
    if args.hf_chat_template or args.prompt_type:  # MindSpeed-LLM's switches for instruction-tuned models
        from inference import chat_renderer

        render = chat_renderer(args, need="--prompt-type")
    model = build_and_load(args, entry="evaluation.py")

    import torch
    from lm_eval import evaluator
    from lm_eval.utils import make_table

    from adaptor.evaluation.lm import MegatronLM

    lm = MegatronLM(model, tokenizer, vocab_size=min(tokenizer.vocab_size, args.padded_vocab_size),
                    max_length=args.seq_length, batch_size=args.micro_batch_size, render=render)
    results = evaluator.simple_evaluate(model=lm, tasks=tasks, num_fewshot=args.num_fewshot, limit=args.limit,
                                        apply_chat_template=render is not None,
                                        task_manager=manager, log_samples=args.eval_output_file is not None,
                                        random_seed=args.seed, numpy_random_seed=args.seed,
                                        torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    if torch.distributed.get_rank() == 0:
        print(make_table(results), flush=True)
        if results.get("groups"):
            print(make_table(results, "groups"), flush=True)
        if args.eval_output_file is not None:
            write_results(args.eval_output_file, results)
            print(f"evaluation.py: wrote {args.eval_output_file}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
