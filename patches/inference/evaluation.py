"""``evaluation.py``'s flags: lm-eval benchmarks on a checkpoint, with MindSpeed-LLM's names where it has them.

No upstream function is changed; the flags join Megatron's parser like every feature's and are read
only by ``evaluation.py`` (:mod:`adaptor.evaluation`). Given to another entry, any of them is one line.

* ``--task NAME [NAME ...]``: lm-eval task (or group) names; the flag itself is
  ``patches.inference.generation``'s, shared with inference.py, and checked here for evaluation.py;
* ``--task-data-path DIR``: for ``--task mmlu``, MMLU's CSV files (:mod:`adaptor.evaluation.mmlu`);
* ``--include-path DIR``: lm-eval's own option, task YAML files with local data;
* ``--num-fewshot N`` (default 0), ``--limit N`` (the first N documents of each task),
  ``--eval-output-file results.json`` (metrics and each request's scores, written by rank 0).
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature

DESTS = ("task_data_path", "include_path", "num_fewshot", "limit", "eval_output_file")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class Evaluation(Feature):
    name = "evaluation"

    def add_arguments(self, group) -> None:
        group.add_argument("--task-data-path", default=None, metavar="DIR",
                           help="evaluation.py: MMLU's CSV files for --task mmlu (<subject>_test.csv, "
                                "<subject>_dev.csv; rows question,A,B,C,D,answer, no header)")
        group.add_argument("--include-path", default=None, metavar="DIR",
                           help="evaluation.py: more lm-eval task YAML files (lm-eval's --include_path)")
        group.add_argument("--num-fewshot", type=int, default=0, metavar="N",
                           help="evaluation.py: few-shot examples before each question (default 0)")
        group.add_argument("--limit", type=int, default=None, metavar="N",
                           help="evaluation.py: only the first N documents of each task")
        group.add_argument("--eval-output-file", default=None, metavar="JSON",
                           help="evaluation.py: lm-eval's metrics and each request's scores, as JSON")

    def validate(self, args, ctx) -> None:
        from adaptor.inference import ENTRY

        if not ENTRY["evaluation"]:
            given = [d for d in DESTS if d in ctx.explicit]
            if given:
                raise ArgumentError(f"{_flag(given[0])} is read by evaluation.py, which runs lm-eval; this "
                                    f"entry does not: drop it")
            return
        if not args.task:
            raise ArgumentError("evaluation.py needs --task NAME [NAME ...] (lm-eval task names)")
        args.task = [args.task] if isinstance(args.task, str) else list(args.task)
        if args.num_fewshot < 0:
            raise ArgumentError(f"--num-fewshot must be 0 or more, not {args.num_fewshot}")
        if args.limit is not None and args.limit < 1:
            raise ArgumentError(f"--limit must be at least 1, not {args.limit}")
        if (args.context_parallel_size or 1) > 1:
            raise ArgumentError("evaluation.py runs with --context-parallel-size 1")
        if args.sequence_parallel:
            from adaptor.log import notice_once

            notice_once("evaluation.py: --sequence-parallel off (requests have any length; the weights are the same)")
            args.sequence_parallel = False
