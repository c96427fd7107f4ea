"""Supervised fine-tuning through Megatron's loop: MindSpeed-LLM's ``--stage sft --is-instruction-dataset``
and Megatron's own ``--sft``.

Flags: ``--stage sft`` (MindSpeed-LLM's ``posttrain_gpt.py`` stage; ``dpo`` is
patches/finetune/preference_training.py's, other preference and reward stages are refused), ``--is-instruction-dataset`` (datasets from ``tools/preprocess_data.py``'s instruction
handlers, :mod:`adaptor.finetune.instruction_dataset`), ``--prompt-type`` (checked against the
dataset's template), ``--variable-seq-lengths`` / ``--no-pad-to-seq-lengths``
(:mod:`adaptor.finetune.batches`). Megatron's ``--sft`` keeps its own ``SFTDataset``/``SFTTokenizer``.
The entry files choose the dataset and pass conversation boundaries; the loss is Megatron's masked one.

Upstream change: ``megatron.training.datasets.sft_dataset.SFTLowLevelDataset.__init__`` (replaced)
loads JSONL through the Hugging Face ``datasets`` library, a large dependency; here it is read line
by line with the same result, and a bad line is one line naming file and line.
"""
from __future__ import annotations

import json
import sys

from adaptor.features import ArgumentError, Feature

OWNER = __name__
SFT_LOW_LEVEL_INIT = "megatron.training.datasets.sft_dataset.SFTLowLevelDataset.__init__"
STAGES = ("sft", "dpo")  # dpo: patches/finetune/preference_training.py owns its flags and checks
OTHER_STAGES = ("simpo", "orm", "prm", "ppo", "grpo", "trl_ppo", "ray_ppo", "ray_grpo", "ray_online_dpo")


def _read_jsonl_conversations(self, dataset_path: str) -> None:
    rows = []
    with open(dataset_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                messages = record["messages"]
            except (ValueError, KeyError, TypeError) as exc:
                from adaptor.errors import fail

                what = "no 'messages' key" if isinstance(exc, (KeyError, TypeError)) else "not valid JSON"
                fail(f"--sft data {dataset_path}, line {number}: {what}")
            rows.append({"messages": messages})
    self.dataset = rows


class SupervisedFineTuning(Feature):
    name = "supervised_fine_tuning"

    def add_arguments(self, group) -> None:
        group.add_argument("--stage", default=None, metavar="STAGE",
                           help="MindSpeed-LLM's post-training stage: sft (supervised fine-tuning) or dpo "
                                "(preference training, with --is-pairwise-dataset)")
        group.add_argument("--is-instruction-dataset", action="store_true",
                           help="--data-path names instruction datasets from tools/preprocess_data.py "
                                "(PREFIX_packed_{input_ids,labels,attention_mask}_document): loss on the "
                                "assistant turns only, conversations never attend to each other")
        group.add_argument("--prompt-type", default=None, metavar="TYPE",
                           help="the chat template the dataset was built with (checked against the dataset's "
                                "PREFIX_packed_meta.json)")
        group.add_argument("--variable-seq-lengths", "--no-pad-to-seq-lengths", dest="variable_seq_lengths_sft",
                           action="store_true",
                           help="fine-tuning micro-batches drop the padding after their longest sample instead of "
                                "padding to --seq-length (one pipeline stage; same loss)")

    def register_patches(self, pm, ctx) -> None:
        argv = ctx.argv if ctx.argv is not None else sys.argv[1:]
        if "--sft" in argv:
            pm.register_replacement(SFT_LOW_LEVEL_INIT, _read_jsonl_conversations, OWNER)

    def validate(self, args, ctx) -> None:
        from adaptor.log import notice_once

        stage = args.stage
        if stage is not None and stage not in STAGES:
            kind = "a known MindSpeed-LLM stage" if stage in OTHER_STAGES else "not a stage MindSpeed-LLM knows"
            raise ArgumentError(f"--stage {stage} ({kind}) is not implemented; supervised fine-tuning "
                                f"(--stage sft) and DPO (--stage dpo) are")
        instruction = args.is_instruction_dataset
        if instruction and args.sft:
            raise ArgumentError("--sft (Megatron's JSONL conversations) and --is-instruction-dataset "
                                "(preprocessed instruction datasets) read different data; give one")
        if (instruction or args.sft) and args.mock_data:
            raise ArgumentError(f"{'--sft' if args.sft else '--is-instruction-dataset'} trains on conversations; "
                                "--mock-data has none, so give --data-path")
        if args.sft and args.tokenizer_type != "SFTTokenizer":
            raise ArgumentError(f"--sft tokenizes conversations with Megatron's SFTTokenizer; pass --tokenizer-type "
                                f"SFTTokenizer (with --tokenizer-model and --sft-tokenizer-prompt-format), not "
                                f"{args.tokenizer_type}")
        if args.tokenizer_type == "SFTTokenizer" and not args.sft:
            raise ArgumentError("--tokenizer-type SFTTokenizer tokenizes Megatron's --sft conversations; add --sft, "
                                "or use a text tokenizer such as HuggingFaceTokenizer")
        if stage == "sft" and not (instruction or args.sft):
            notice_once("--stage sft without --is-instruction-dataset: --data-path is pretraining text, so every "
                        "token is in the loss")
        pairs = stage == "dpo" and not (instruction or args.sft)  # DPO's pairs: the preference feature checks them
        if not (instruction or args.sft or pairs):
            if args.variable_seq_lengths_sft:
                raise ArgumentError("--variable-seq-lengths applies to fine-tuning data (--is-instruction-dataset, "
                                    "--sft or --stage dpo's pairs); pretraining samples fill --seq-length")
            return
        pp, cp = args.pipeline_model_parallel_size, args.context_parallel_size or 1
        if args.variable_seq_lengths_sft and pp > 1:
            notice_once("--variable-seq-lengths: pipeline stages exchange fixed shapes, so micro-batches stay "
                        "padded to --seq-length")
            args.variable_seq_lengths_sft = False
        if pairs:
            return
        if pp > 1 and cp > 1:
            raise ArgumentError("fine-tuning with context parallelism needs --pipeline-model-parallel-size 1: "
                                "conversation boundaries reach context-parallel attention as THD, which pipeline "
                                "stages do not receive")
        if instruction:
            self._check_datasets(args, pp)

    @staticmethod
    def _check_datasets(args, pp: int) -> None:
        from adaptor.finetune.instruction_dataset import read_meta
        from adaptor.preflight.data_sources import blend_prefixes, sources

        for flag, words in sources(args):
            for prefix in blend_prefixes(words):
                meta = read_meta(prefix) or {}
                built = meta.get("prompt_type")
                if args.prompt_type and built and built != args.prompt_type:
                    raise ArgumentError(f"--prompt-type {args.prompt_type}: {flag} {prefix} was built with "
                                        f"--prompt-type {built}; preprocess it again or pass --prompt-type {built}")
                if pp > 2 and meta.get("pack"):
                    raise ArgumentError(f"{flag} {prefix} packs several conversations per sample, and middle "
                                        f"pipeline stages receive no batch to keep them apart; use "
                                        f"--pipeline-model-parallel-size 2 or less, or preprocess without --pack")
