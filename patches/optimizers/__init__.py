"""Optimizers that Megatron builds from packages not installed here."""
