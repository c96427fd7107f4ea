"""Fine-tuning: supervised fine-tuning on instruction data, preference training (DPO), and LoRA adapters.

They train with Megatron's own loop; what changes is the data (conversations with a loss on the
assistant's turns only, or preference pairs) and, with LoRA, which parameters learn."""
