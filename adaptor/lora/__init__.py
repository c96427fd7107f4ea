"""LoRA adapters on Megatron's column- and row-parallel linears (``patches/finetune/lora.py`` turns them on).

* :mod:`adaptor.lora.layers`: ``LoraColumnParallelLinear`` / ``LoraRowParallelLinear``, subclasses of
  megatron-core's linears that the layer spec builds in their place. A linear whose
  ``tp_comm_buffer_name`` names a targeted module gets ``lora_A`` / ``lora_B`` (state-dict keys
  ``<linear>.lora_A.weight`` / ``<linear>.lora_B.weight``), ``lora_r``, ``lora_alpha`` and
  ``lora_scaling = alpha / r``; every other one is the upstream linear unchanged.
* :mod:`adaptor.lora.model`: freezing everything but the adapters, the model's adapted linears,
  merged weights for exporters.
* :mod:`adaptor.lora.checkpoint`: base-only / adapters-only views of Megatron's checkpoint state.
"""
from __future__ import annotations

ADAPTER_PARTS = ("lora_A", "lora_B")
#: Megatron's ``tp_comm_buffer_name`` of a linear -> the module name ``--lora-target-modules`` uses.
TARGETS = {
    "qkv": "linear_qkv", "proj": "linear_proj", "fc1": "linear_fc1", "fc2": "linear_fc2",
    "q_proj": "linear_q_proj", "q_down_proj": "linear_q_down_proj", "q_up_proj": "linear_q_up_proj",
    "kv_down_proj": "linear_kv_down_proj", "kv_up_proj": "linear_kv_up_proj",
}
DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def is_lora_name(name: str) -> bool:
    """A parameter or state-dict key of an adapter (``...linear_qkv.lora_A.weight``)."""
    return any(part in ADAPTER_PARTS for part in name.split("."))
