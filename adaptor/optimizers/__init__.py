"""Optimizers Megatron names whose upstream implementation is not installable here."""
