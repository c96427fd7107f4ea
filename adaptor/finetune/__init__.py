"""Supervised fine-tuning: instruction datasets and their batches (LoRA lives in :mod:`adaptor.lora`)."""
