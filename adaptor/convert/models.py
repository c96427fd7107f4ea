"""The model families we convert, by ``--model-type-hf`` name: a new family is one row of MODELS.

The family modules import the base classes of :mod:`adaptor.convert.mapping`; this table imports
the families, so nothing imports back.
"""
from __future__ import annotations

from adaptor.convert.deepseek3 import DeepSeek3Mapping
from adaptor.convert.errors import ConversionError
from adaptor.convert.llama import LlamaMapping
from adaptor.convert.mapping import ModelMapping
from adaptor.convert.mixtral import MixtralMapping
from adaptor.convert.qwen2 import Qwen2Mapping
from adaptor.convert.qwen3 import Qwen3Mapping
from adaptor.convert.qwen3_moe import Qwen3MoeMapping

MODELS: dict[str, type[ModelMapping]] = {
    "qwen3": Qwen3Mapping,
    "deepseek3": DeepSeek3Mapping,
    "llama2": LlamaMapping,   # Llama 2 and 3.x (MindSpeed-LLM's name for both)
    "qwen2": Qwen2Mapping,    # Qwen2 / Qwen2.5: Llama's layers with q/k/v bias
    "qwen3-moe": Qwen3MoeMapping,
    "mixtral": MixtralMapping,
}


def model_mapping(model_type: str, hf_config: dict) -> ModelMapping:
    """The mapping of family ``model_type`` built from a Hugging Face config dict."""
    if model_type not in MODELS:
        raise ConversionError(f"--model-type-hf {model_type!r} is not supported (choose {', '.join(MODELS)})")
    return MODELS[model_type](hf_config)
