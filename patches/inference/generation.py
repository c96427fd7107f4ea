"""``inference.py``'s flags: MindSpeed-LLM's names for generation from a checkpoint.

No upstream function is changed; the flags join Megatron's parser like every feature's, and are read
only by ``inference.py`` (:mod:`adaptor.inference`). Given to another entry (``pretrain_gpt.py``), any
of them is one line: that entry generates nothing.

* ``--task greedy_search`` (the default with a prompt; ``greedy``), ``greedy_search_with_sampling`` (or
  ``do_sample``), ``return_output_log_probs`` (sampling, with each token's log-probability), ``beam_search``,
  ``beam_search_with_sampling``, ``chat``; several run in order; with no task and no prompt, MindSpeed-LLM's
  generation scripts' behaviour: every task on its demonstration prompt, then the chat (the tokenizer's chat template, else ``--prompt-type``'s;
  a terminal conversation without ``--prompt``/``--input-file``, greedy);
* ``--temperature``, ``--top-k``, ``--top-p`` (the sampling tasks; drawn with ``--seed``), ``--num-beams``
  (the beam tasks), ``--stream`` (one ``--prompt``'s text printed as it is generated; not for beams);
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
from adaptor.inference import (
    BEAM_TASKS, DEMONSTRATION_PROMPT, DEMONSTRATION_TASKS, SAMPLING_TASKS, TASK_ALIASES, TASKS,
)

SAMPLING_DESTS = ("temperature", "top_k", "top_p")
DESTS = ("task", "max_new_tokens", "max_length", "add_eos_token", "use_kv_cache", "input_file", "output_file",
         "prompt", "stream", "num_beams", "hf_chat_template", *SAMPLING_DESTS)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class Generation(Feature):
    name = "generation"

    def add_arguments(self, group) -> None:
        group.add_argument("--task", nargs="+", default=None, metavar="TASK",
                           help="inference.py, in order: greedy_search (the default), greedy_search_with_sampling (or "
                                "do_sample), return_output_log_probs (sampling, with each generated token's "
                                "log-probability), beam_search, beam_search_with_sampling or chat; evaluation.py: "
                                "lm-eval task names (mmlu with --task-data-path)")
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
                           help='inference.py: prompts, one JSON object per line {"prompt": TEXT} (--task chat: '
                                '{"messages": [{"role": ..., "content": ...}, ...]})')
        group.add_argument("--output-file", default=None, metavar="JSONL",
                           help='inference.py: one JSON object per prompt {"prompt", "text", "token_ids"}')
        group.add_argument("--prompt", default=None, metavar="TEXT",
                           help="inference.py: one prompt; the generated text is printed")
        group.add_argument("--stream", action="store_true",
                           help="inference.py: print --prompt's continuation as it is generated")
        group.add_argument("--temperature", type=float, default=1.0,
                           help="inference.py, sampling tasks: divide the logits by this")
        group.add_argument("--top-k", type=int, default=0, metavar="K",
                           help="inference.py, sampling tasks: draw among the K most likely tokens (0: all)")
        group.add_argument("--top-p", type=float, default=1.0, metavar="P",
                           help="inference.py, sampling tasks: draw among the fewest most likely tokens whose "
                                "probability reaches P (1.0: all)")
        group.add_argument("--hf-chat-template", action="store_true",
                           help="inference.py (chat) and evaluation.py: render conversations with the tokenizer's own "
                                "chat template (one line if it has none); evaluation.py then applies it to every "
                                "request, as --prompt-type's template does")
        group.add_argument("--num-beams", type=int, default=4, metavar="N",
                           help="inference.py, beam tasks: beams kept per prompt")

    def validate(self, args, ctx) -> None:
        from adaptor.inference import ENTRY

        if not ENTRY["inference"]:
            # evaluation.py reads --task (its own feature checks the names) and --hf-chat-template only.
            given = [d for d in DESTS if d in ctx.explicit
                     and not (ENTRY["evaluation"] and d in ("task", "hf_chat_template"))]
            if given:
                readers = ("inference.py and evaluation.py" if given[0] in ("task", "hf_chat_template")
                           else "inference.py")
                raise ArgumentError(f"{_flag(given[0])} is read by {readers}; this entry does not: drop it")
            return
        given_tasks = [args.task] if isinstance(args.task, str) else list(args.task or [])
        tasks = [TASK_ALIASES.get(task, task) for task in given_tasks]
        for task in tasks:
            if task not in TASKS:
                raise ArgumentError(f"--task {task} is not a task inference.py knows; it knows {', '.join(TASKS)}")
        prompted = args.prompt is not None or args.input_file is not None
        if not tasks:
            # MindSpeed-LLM's generation scripts give neither --task nor a prompt: they run every task.
            tasks = ["greedy_search"] if prompted else list(DEMONSTRATION_TASKS)
            if not prompted:
                from adaptor.log import notice_once

                notice_once(f"inference.py: no --task and no --prompt/--input-file: as MindSpeed-LLM's inference.py, "
                            f"every task ({', '.join(tasks)}) on {DEMONSTRATION_PROMPT!r}, then the terminal chat")
        if len(tasks) > 1 and args.input_file is not None:
            raise ArgumentError(f"--input-file prompts go through one --task, not {len(tasks)}; run one task at a time")
        args.task = tasks
        named = " ".join(tasks)
        # chat answers greedily unless a sampling flag is given (MindSpeed-LLM's chat scripts give them)
        args.chat_samples = "chat" in tasks and any(dest in ctx.explicit for dest in SAMPLING_DESTS)
        for dest in SAMPLING_DESTS:
            if dest in ctx.explicit and not set(tasks) & {*SAMPLING_TASKS, "chat"}:
                raise ArgumentError(f"{_flag(dest)} is read by the sampling tasks ({', '.join(SAMPLING_TASKS)}) "
                                    f"and chat; "
                                    f"--task {named} does not sample: drop it or choose one of them")
        if "num_beams" in ctx.explicit and not set(tasks) & set(BEAM_TASKS):
            raise ArgumentError(f"--num-beams is read by the beam tasks ({' and '.join(BEAM_TASKS)}); --task {named} "
                                f"keeps one sequence per prompt: drop it or choose one of them")
        if not args.temperature > 0:
            raise ArgumentError(f"--temperature must be above 0, not {args.temperature}")
        if args.top_k < 0:
            raise ArgumentError(f"--top-k must be 0 (every token) or more, not {args.top_k}")
        if not 0 < args.top_p <= 1:
            raise ArgumentError(f"--top-p must be in (0, 1], not {args.top_p}")
        if args.num_beams < 1:
            raise ArgumentError(f"--num-beams must be at least 1, not {args.num_beams}")
        if args.stream and (args.prompt is None or set(tasks) <= set(BEAM_TASKS)):
            raise ArgumentError("--stream prints one --prompt's text as it is generated; it takes --prompt, and "
                                "not the beam tasks, whose best sequence is known only at the end")
        if args.prompt is not None and args.input_file is not None:
            raise ArgumentError("inference.py needs one of --prompt TEXT or --input-file prompts.jsonl, not both")
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
