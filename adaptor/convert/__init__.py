"""Hugging Face <-> Megatron checkpoint conversion (qwen3, deepseek3, qwen3-moe, mixtral), streaming tensor by tensor.

- :class:`HfCheckpoint`: zero-copy (mmap) reads of a Hub-style safetensors directory.
- :func:`model_mapping`: the name/layout rules of one architecture; :class:`Layout`: TP/PP/EP sizes.
- :func:`megatron_rank_tensors`: the state dict one rank of Megatron's local-spec GPTModel holds.
- :func:`hf_tensors_from_megatron`: the inverse, HF tensors one at a time from the per-rank state dicts.
- :func:`write_hf_dir`: the one Hugging Face directory writer (:mod:`adaptor.convert.hf_writer`).
- :func:`megatron_args_from_hf_config`: the pretrain_gpt.py flags that build the same architecture.
- :func:`convert_hf_to_megatron` / :func:`convert_megatron_to_hf`: whole directories (tools/convert_ckpt.py).

Modules of this package import each other by submodule, never through this file.
"""
from adaptor.convert.errors import ConversionError
from adaptor.convert.hf_directory import HfCheckpoint
from adaptor.convert.hf_writer import write_hf_dir
from adaptor.convert.layout import Layout, padded_vocab_size
from adaptor.convert.mapping import ModelMapping
from adaptor.convert.models import MODELS, model_mapping
from adaptor.convert.megatron_args import megatron_args_from_hf_config
from adaptor.convert.offline import MegatronCheckpoint, convert_hf_to_megatron, convert_megatron_to_hf
from adaptor.convert.tensors import hf_tensors_from_megatron, megatron_rank_tensors

__all__ = [
    "ConversionError", "HfCheckpoint", "write_hf_dir", "Layout", "padded_vocab_size",
    "ModelMapping", "MODELS", "model_mapping", "megatron_args_from_hf_config", "MegatronCheckpoint",
    "megatron_rank_tensors", "hf_tensors_from_megatron", "convert_hf_to_megatron", "convert_megatron_to_hf",
]
