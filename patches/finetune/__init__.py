"""Fine-tuning: supervised fine-tuning on instruction data, and LoRA adapters.

Both train with Megatron's own loop; what changes is the data (conversations with a loss on the
assistant's turns only) and, with LoRA, which parameters learn."""
