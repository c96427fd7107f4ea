"""Inference: ``inference.py``'s flags and checks (greedy generation from a Megatron checkpoint)."""
