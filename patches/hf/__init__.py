"""Hugging Face: tokenizers read from ``tokenizer.json``, and training from and to a HF directory."""
