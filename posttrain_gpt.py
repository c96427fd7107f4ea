"""Fine-tune a GPT model (Qwen3, Llama, ...) with Megatron's own training loop: MindSpeed-LLM's entry.

    torchrun --nproc_per_node N posttrain_gpt.py <Megatron-LM arguments> \\
        --stage sft --is-instruction-dataset --prompt-type qwen3 --finetune --load <base> \\
        [--lora-r 16 --lora-alpha 32 --lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2]

The model provider, forward step and dataset provider are ``pretrain_gpt.py``'s: a fine-tuning run
is a training run whose data are conversations (``--is-instruction-dataset``: datasets from
``tools/preprocess_data.py --handler-name ...InstructionHandler``, the loss on assistant turns only;
or Megatron's ``--sft`` JSONL conversations) and, with LoRA, whose trainable parameters are the
adapters. ``--stage`` defaults to ``sft`` here; other MindSpeed-LLM stages are refused in one line.
"""
import sys

import adaptor  # noqa: F401  (first: patches megatron for this machine)

from pretrain_gpt import main


def _default_stage(argv: list[str]) -> list[str]:
    """``--stage sft`` unless the command line names a stage (MindSpeed-LLM's scripts always do)."""
    if any(a == "--stage" or a.startswith("--stage=") for a in argv):
        return argv
    return [*argv, "--stage", "sft"]


if __name__ == "__main__":
    sys.argv[1:] = _default_stage(sys.argv[1:])
    main()
