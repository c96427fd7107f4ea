"""``inference.py``'s flags: MindSpeed-LLM's names for greedy generation from a checkpoint.

No upstream function is changed; the flags join Megatron's parser like every feature's, and are read
only by ``inference.py`` (:mod:`adaptor.inference`). Given to another entry (``pretrain_gpt.py``), any
of them is one line: that entry generates nothing.

* ``--task greedy_search`` (the only task built so far; MindSpeed-LLM's other tasks are one line).
  ``--task`` is defined here once for both entries that read it: evaluation.py takes lm-eval task
  names (``patches.inference.evaluation`` checks those), inference.py exactly one of its tasks;
* ``--max-new-tokens N``, ``--max-length N`` (prompt plus generated tokens, at most ``--seq-length``),
  ``--add-eos-token TOKEN ...`` (more tokens that end a sequence, besides the tokenizer's EOS);
* ``--use-kv-cache``: keys and values kept in megatron-core's ``StaticInferenceContext`` (same tokens);
* ``--input-file prompts.jsonl --output-file out.jsonl`` or ``--prompt TEXT`` (to stdout);
  ``--micro-batch-size`` prompts are generated together.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

TASKS = ("greedy_search",)
# MindSpeed-LLM's other tasks: known, not yet built here.
LATER_TASKS = ("greedy_search_with_sampling", "beam_search", "beam_search_with_sampling", "chat", "do_sample")
DESTS = ("task", "max_new_tokens", "max_length", "add_eos_token", "use_kv_cache", "input_file", "output_file",
         "prompt")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class Generation(Feature):
    name = "generation"

    def add_arguments(self, group) -> None:
        group.add_argument("--task", nargs="+", default=None, metavar="TASK",
                           help="inference.py: what to generate, greedy_search (the default) is built; "
                                "evaluation.py: lm-eval task names (mmlu with --task-data-path)")
        group.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                           help="inference.py: at most N tokens generated per prompt")
        group.add_argument("--max-length", type=int, default=None, metavar="N",
                           help="inference.py: at most N tokens per sequence, prompt included (default and upper "
                                "bound: --seq-length)")
        group.add_argument("--add-eos-token", nargs="+", default=[], metavar="TOKEN",
                           help="inference.py: more tokens (text or id) that end a sequence besides the tokenizer's "
                                "EOS")
        group.add_argument("--use-kv-cache", action="store_true",
                           help="inference.py: keep keys and values between steps (megatron-core's "
                                "StaticInferenceContext); the same tokens as without")
        group.add_argument("--input-file", default=None, metavar="JSONL",
                           help='inference.py: prompts, one JSON object per line {"prompt": TEXT}')
        group.add_argument("--output-file", default=None, metavar="JSONL",
                           help='inference.py: one JSON object per prompt {"prompt", "text", "token_ids"}')
        group.add_argument("--prompt", default=None, metavar="TEXT",
                           help="inference.py: one prompt; the generated text is printed")

    def validate(self, args, ctx) -> None:
        from adaptor.inference import ENTRY

        if not ENTRY["inference"]:
            # evaluation.py reads --task (its own feature checks the names) and nothing else here.
            given = [d for d in DESTS if d in ctx.explicit and not (ENTRY["evaluation"] and d == "task")]
            if given:
                readers = "inference.py and evaluation.py" if given[0] == "task" else "inference.py"
                raise ArgumentError(f"{_flag(given[0])} is read by {readers}; this entry does not: drop it")
            return
        tasks = [args.task] if isinstance(args.task, str) else list(args.task or ["greedy_search"])
        if len(tasks) != 1:
            raise ArgumentError(f"inference.py runs one --task, not {len(tasks)}")
        task = tasks[0]
        if task in LATER_TASKS:
            raise ArgumentError(f"--task {task} is not built yet; greedy_search is")
        if task not in TASKS:
            raise ArgumentError(f"--task {task} is not a task inference.py knows; greedy_search is built")
        args.task = task
        if (args.prompt is None) == (args.input_file is None):
            raise ArgumentError("inference.py needs one of --prompt TEXT or --input-file prompts.jsonl")
        if args.input_file is not None and args.output_file is None:
            raise ArgumentError("--input-file needs --output-file out.jsonl")
        if args.output_file is not None and args.input_file is None:
            raise ArgumentError("--output-file is written for --input-file's prompts; give --input-file")
        if args.max_new_tokens < 1:
            raise ArgumentError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
        if args.max_length is not None and not 1 <= args.max_length <= args.seq_length:
            raise ArgumentError(f"--max-length {args.max_length} must be between 1 and --seq-length "
                                f"{args.seq_length}")
        if (args.context_parallel_size or 1) > 1:
            raise ArgumentError("inference.py runs with --context-parallel-size 1 (decoding steps are one token)")
        if args.sequence_parallel:
            from adaptor.log import notice_once

            notice_once("inference.py: --sequence-parallel off (a decoding step is one token; the weights are the same)")
            args.sequence_parallel = False
