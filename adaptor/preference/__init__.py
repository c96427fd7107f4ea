"""Preference training (DPO): pairwise datasets, the reference model, the losses and what they log.

The entry file ``posttrain_gpt.py`` joins these pieces into Megatron's forward step; the flags and
their checks live in ``patches/finetune/preference_training.py``."""
