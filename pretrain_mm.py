"""Pretrain a vision-language model (LLaVA-shaped, Qwen2.5-VL or Qwen3-VL) with Megatron's own loop.

    torchrun --nproc_per_node N pretrain_mm.py --mm-model model.json --mm-data data.json <Megatron arguments>

As pretrain_gpt.py: ``import adaptor`` first, then what Megatron asks of a training script — a
model provider, a forward step with its loss, and a dataset provider — handed to
``megatron.training.pretrain()``. model.json's ``model_id`` picks them (:mod:`adaptor.mm.builders`):
``llava`` is megatron-core's ``LLaVAModel`` on JSONL image-text records, ``qwen2_5vl``/``qwen3vl`` the
Qwen-VL model of :mod:`adaptor.mm.qwen_vl`. model.json describes the parts (and fills the decoder's
Megatron flags), data.json the records and image preprocessing.
"""
import adaptor  # noqa: F401  (first: patches megatron for this machine)

import warnings

from megatron.core import mpu
from megatron.core.enums import ModelType
from megatron.training import get_args, pretrain, print_rank_0
from megatron.training.argument_utils import pretrain_cfg_container_from_args
from megatron.training.arguments import core_transformer_config_from_args, parse_and_validate_args

from adaptor import run_state
from adaptor.errors import fail
from adaptor.mm.builders import builder
from adaptor.mm.config import run_model_config
from adaptor.mm.qwen_vl.data_config import cached_mm_data_config


def model_provider(pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None):
    """The model model.json's model_id names, with the initial weights it names."""
    args = get_args()
    model_cfg = run_model_config(args)
    print_rank_0(f"building {model_cfg.model_id} model ...")
    config = config or core_transformer_config_from_args(args)
    parts = builder(model_cfg)
    model = parts.build_model(args, model_cfg, config, pre_process, post_process, vp_stage, pg_collection)
    parts.load_weights(model, model_cfg, args)
    return model


def forward_step(data_iterator, model):
    """The forward step of model.json's model (its batch, its per-token loss under the loss mask)."""
    return builder(run_model_config(get_args())).forward_step(data_iterator, model)


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    """The training records of data.json (built on TP rank 0; no validation split)."""
    args = get_args()
    if mpu.get_tensor_model_parallel_rank() != 0:
        return None, None, None
    data_cfg = cached_mm_data_config(args.mm_data)
    model_cfg = run_model_config(args)
    train = builder(model_cfg).train_dataset(args, data_cfg, model_cfg, train_val_test_num_samples[0])
    return train, None, None


train_valid_test_datasets_provider.is_distributed = True


def main():
    if not run_state.context().flags.mm_model:  # before Megatron asks for the --num-layers model.json gives
        fail("pretrain_mm.py needs --mm-model model.json and --mm-data data.json")
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "HuggingFaceTokenizer"})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ModelConfig.*model provider.*")
        cfg = pretrain_cfg_container_from_args(args)
    pretrain(cfg, train_valid_test_datasets_provider, ModelType.encoder_or_decoder, forward_step,
             model_provider=model_provider)


if __name__ == "__main__":
    main()
