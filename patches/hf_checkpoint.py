"""``--hf-load-dir`` / ``--hf-save-dir``: train from, and save to, a Hugging Face directory (online conversion).

Upstream functions wrapped:

* ``megatron.training.training.setup_model_and_optimizer`` builds the model and the optimizer and
  calls ``load_checkpoint`` when ``--load`` is given. When no ``--load`` checkpoint exists, the
  wrapper fills each rank's own model shard from the Hugging Face safetensors
  (:func:`adaptor.convert.megatron_rank_tensors`: mmap reads of only the tensors this rank holds,
  no temporary Megatron checkpoint), then ``optimizer.reload_model_params()`` refreshes the fp32
  main params / distributed-optimizer shards; training starts at iteration 0. A ``--load``
  checkpoint that exists wins (resume).
* ``megatron.training.training.train`` runs the training loop. After it returns, every rank with
  expert-data-parallel rank 0 writes its model state to a temporary legacy (``--ckpt-format
  torch``) checkpoint beside ``--hf-save-dir``; rank 0 converts it tensor by tensor
  (:func:`adaptor.convert.convert_megatron_to_hf`, i.e. ``hf_tensors_from_megatron``) into
  config.json + safetensors shards (+ index) and renames the finished directory into place; a
  failure leaves nothing at ``--hf-save-dir``. The ranks must share a filesystem for this
  directory. config.json (and tokenizer files) come from ``--hf-load-dir``, or are written from
  the flags (``--model-type-hf`` names the architecture). With ``--bf16`` the saved tensors are
  the bf16 model weights, and loading copies into them (the fp32 main params are then refreshed
  from those copies).
* ``megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size``: with ``--hf-load-dir``
  the padded vocabulary is at least the HF ``vocab_size`` (rounded up to a multiple of TP), so a
  checkpoint whose embedding has more rows than the tokenizer's padded vocabulary (Qwen3: 151936
  rows, tokenizer 151669) loads whole; a tokenizer larger than the checkpoint's vocabulary is an
  error.
* ``megatron.training.arguments.validate_args``: after Megatron derives its values, the HF config
  must describe the model the flags build (layers, hidden, heads, query groups, kv channels, MLA
  dims, experts, ...): the flags :func:`adaptor.convert.megatron_args_from_hf_config` gives are
  compared with the command line, and the first difference is one line naming the flag.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from adaptor.features import ArgumentError, Feature

OWNER = "patches.hf_checkpoint"
HF_MODEL_TYPES = {"qwen3": "qwen3", "deepseek_v3": "deepseek3"}
# Flags of megatron_args_from_hf_config that do not describe the weights: not compared.
NOT_COMPARED = {
    "vocab_size", "padded_vocab_size", "make_vocab_size_divisible_by", "max_position_embeddings",
    "seq_length", "tokenizer_type", "tokenizer_model", "attention_dropout", "hidden_dropout",
    "init_method_std", "bf16", "fp16", "moe_aux_loss_coeff", "moe_router_load_balancing_type",
    "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_router_dtype", "mtp_loss_scaling_factor",
    "moe_z_loss_coeff", "moe_router_bias_update_rate", "use_mcore_models", "transformer_impl",
}
# Architecture switches compared even when the HF-derived flags leave them out (then: off).
ARCHITECTURE_SWITCHES = (
    "qk_layernorm", "multi_latent_attention", "untie_embeddings_and_output_weights", "swiglu",
    "add_qkv_bias", "moe_router_enable_expert_bias", "rotary_interleaved",
)


def hf_model_type(config: dict, given: str | None, where: str) -> str:
    """``--model-type-hf`` or the one config.json's ``model_type`` names."""
    if given:
        return given
    found = config.get("model_type")
    if found not in HF_MODEL_TYPES:
        raise ArgumentError(f"{where}: config.json has model_type {found!r}; supported: "
                            f"{', '.join(sorted(HF_MODEL_TYPES))} (or pass --model-type-hf qwen3|deepseek3)")
    return HF_MODEL_TYPES[found]


def read_hf_config(directory: str, flag: str) -> dict:
    path = Path(directory)
    if not path.is_dir():
        raise ArgumentError(f"{flag} {directory}: no such directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ArgumentError(f"{flag} {directory}: no config.json in the directory")
    try:
        return json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ArgumentError(f"{flag} {config_file}: not a JSON file ({exc})") from None


def model_flags(model_type: str, config: dict) -> list[str]:
    """The pretrain_gpt.py model flags that build what config.json describes."""
    from adaptor.convert import megatron_args_from_hf_config

    return list(megatron_args_from_hf_config(model_type, config))


def _option_strings(parser) -> dict[str, str]:
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


def megatron_namespace(flags: list[str]):
    """Parse Megatron flags with Megatron's own parser (defaults for the rest)."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(add_help=False, allow_abbrev=False))
    namespace, _ = parser.parse_known_args(flags)
    given = {a.split("=", 1)[0] for a in flags if a.startswith("--")}
    dests = {a.dest for a in parser._actions if any(o in given for o in a.option_strings)}
    return namespace, dests, _option_strings(parser)


def _normalized(dest: str, value, args):
    if dest == "moe_layer_freq" and isinstance(value, int):
        return [1 if i % value == 0 else 0 for i in range(args.num_layers)]
    if isinstance(value, tuple):
        return list(value)
    return value


def _query_groups(ns) -> int | None:
    if getattr(ns, "multi_latent_attention", False):
        return None
    return ns.num_query_groups if getattr(ns, "group_query_attention", False) else ns.num_attention_heads


def config_mismatch(args, hf_flags: list[str]) -> str | None:
    """The first setting where ``args`` differs from the model ``hf_flags`` describe, as a phrase."""
    hf, given, options = megatron_namespace(hf_flags)
    compared = (given | set(ARCHITECTURE_SWITCHES)) - NOT_COMPARED
    if not getattr(hf, "group_query_attention", False):
        compared.discard("num_query_groups")
    first = ("num_layers", "hidden_size", "multi_latent_attention", "num_attention_heads", "num_experts")
    for dest in sorted(compared, key=lambda d: (first.index(d) if d in first else len(first), d)):
        if dest == "num_query_groups" or dest == "group_query_attention":
            mine, theirs = _query_groups(args), _query_groups(hf)
        else:
            mine = _normalized(dest, getattr(args, dest, None), args)
            theirs = _normalized(dest, getattr(hf, dest, None), args)
        if dest == "kv_channels" and getattr(hf, "multi_latent_attention", False):
            continue
        same = mine == theirs
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) and not isinstance(mine, bool):
            same = math.isclose(float(mine), float(theirs), rel_tol=1e-9, abs_tol=0.0)
        if not same:
            flag = options.get(dest, "--" + dest.replace("_", "-"))
            if dest in ("num_query_groups", "group_query_attention"):
                flag = "--num-query-groups (--group-query-attention)"
            return f"{flag} is {mine!r} on the command line but {theirs!r} in the Hugging Face config"
    return None


# ----------------------------------------------------------------------------- loading
def _unwrapped(model):
    from megatron.core.utils import unwrap_model

    return unwrap_model(model if isinstance(model, list) else [model])


def _layout(args):
    from adaptor.convert import Layout

    tp, etp = args.tensor_model_parallel_size, getattr(args, "expert_tensor_parallel_size", None)
    return Layout(tp=tp, pp=args.pipeline_model_parallel_size, ep=args.expert_model_parallel_size,
                  etp=None if etp in (None, tp) else etp)


def load_hf_weights(model, args) -> int:
    """Copy this rank's tensors of the HF directory into ``model``; returns how many were copied."""
    import torch
    from megatron.core import mpu

    from adaptor.convert import ConversionError, HfCheckpoint, megatron_rank_tensors

    chunks = _unwrapped(model)
    if len(chunks) != 1:
        raise ConversionError("virtual pipeline stages are not supported by --hf-load-dir")
    target = {name: tensor for name, tensor in chunks[0].state_dict(keep_vars=True).items()
              if not name.endswith("_extra_state")}
    hf = HfCheckpoint(args.hf_load_dir)
    copied = set()
    tensors = megatron_rank_tensors(
        hf, args.model_type_hf, _layout(args), mpu.get_tensor_model_parallel_rank(),
        mpu.get_pipeline_model_parallel_rank(), mpu.get_expert_model_parallel_rank(),
        padded_vocab_size=args.padded_vocab_size)
    with torch.no_grad():
        for name, tensor in tensors:
            if name not in target:
                raise ConversionError(f"tensor {name} has no place in this rank's model")
            if tuple(target[name].shape) != tuple(tensor.shape):
                raise ConversionError(f"tensor {name}: shape {tuple(tensor.shape)} from the checkpoint, "
                                      f"{tuple(target[name].shape)} in the model")
            target[name].data.copy_(tensor)
            copied.add(name)
    missing = sorted(set(target) - copied)
    if missing:
        raise ConversionError(f"the checkpoint gives no value for {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return len(copied)


def _setup_model_and_optimizer(wrapped, instance, args_, kwargs):
    from megatron.training import get_args, print_rank_0
    from megatron.training.checkpointing import checkpoint_exists

    from adaptor.convert import ConversionError
    from adaptor.errors import fail

    args = get_args()
    resume = checkpoint_exists(args.load)
    model, optimizer, scheduler = wrapped(*args_, **kwargs)
    if args.hf_load_dir is None:
        return model, optimizer, scheduler
    if resume:
        print_rank_0(f"> --load {args.load} has a checkpoint: resuming from it, not from --hf-load-dir")
        return model, optimizer, scheduler
    try:
        count = load_hf_weights(model, args)
    except (ConversionError, OSError) as exc:
        fail(f"--hf-load-dir {args.hf_load_dir}: {exc}")
    if optimizer is not None:
        optimizer.reload_model_params()
    args.iteration = 0
    args.num_floating_point_operations_so_far = 0
    print_rank_0(f"> rank 0 loaded its {count} tensors from Hugging Face directory {args.hf_load_dir} "
                 f"({args.model_type_hf}); training starts at iteration 0")
    return model, optimizer, scheduler


# ----------------------------------------------------------------------------- saving
def write_rank_state(model, args, legacy_dir: Path, iteration: int) -> None:
    """This rank's model state as one file of a legacy ``--ckpt-format torch`` release checkpoint."""
    import torch
    from megatron.core import mpu
    from megatron.training.checkpointing import get_checkpoint_name

    state = {name: tensor.detach().cpu() for name, tensor in _unwrapped(model)[0].state_dict().items()
             if not name.endswith("_extra_state")}
    path = get_checkpoint_name(
        str(legacy_dir), iteration, release=True,
        pipeline_parallel=args.pipeline_model_parallel_size > 1,
        tensor_rank=mpu.get_tensor_model_parallel_rank(), pipeline_rank=mpu.get_pipeline_model_parallel_rank(),
        expert_parallel=args.expert_model_parallel_size > 1, expert_rank=mpu.get_expert_model_parallel_rank())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"model": state, "checkpoint_version": 3.0, "iteration": iteration}, path)


def hf_config_from_args(args) -> dict:
    """A transformers config.json for the model the flags build (qwen3 or deepseek3)."""
    common = {
        "vocab_size": args.padded_vocab_size or args.vocab_size, "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_attention_heads,
        "max_position_embeddings": args.max_position_embeddings, "rms_norm_eps": args.layernorm_epsilon,
        "tie_word_embeddings": not args.untie_embeddings_and_output_weights, "hidden_act": "silu",
        "torch_dtype": "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32",
    }
    if args.model_type_hf == "qwen3":
        return {**common, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "intermediate_size": args.ffn_hidden_size,
                "num_key_value_heads": args.num_query_groups if args.group_query_attention
                else args.num_attention_heads,
                "head_dim": args.kv_channels, "attention_bias": bool(args.add_qkv_bias),
                "rope_theta": float(args.rotary_base),
                "rope_parameters": {"rope_type": "default", "rope_theta": float(args.rotary_base)}}
    freq = _normalized("moe_layer_freq", args.moe_layer_freq, args)
    first_dense = next((i for i, f in enumerate(freq) if f), args.num_layers)
    rope = {"rope_type": "default", "rope_theta": float(args.rotary_base)}
    if getattr(args, "rope_type", None) == "yarn" or (args.rope_type is None and args.multi_latent_attention):
        rope = {"rope_type": "yarn", "rope_theta": float(args.rotary_base),
                "factor": float(args.rotary_scaling_factor), "mscale": float(args.mscale),
                "mscale_all_dim": float(args.mscale_all_dim),
                "original_max_position_embeddings": args.yarn_original_max_position_embeddings
                or args.max_position_embeddings,
                "beta_fast": float(args.yarn_beta_fast or 32.0), "beta_slow": float(args.yarn_beta_slow or 1.0)}
    return {**common, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "intermediate_size": args.ffn_hidden_size, "moe_intermediate_size": args.moe_ffn_hidden_size,
            "num_key_value_heads": args.num_attention_heads, "n_routed_experts": args.num_experts,
            "n_shared_experts": (args.moe_shared_expert_intermediate_size or 0) // args.moe_ffn_hidden_size,
            "num_experts_per_tok": args.moe_router_topk,
            "routed_scaling_factor": float(args.moe_router_topk_scaling_factor or 1.0),
            "n_group": args.moe_router_num_groups or 1, "topk_group": args.moe_router_group_topk or 1,
            "norm_topk_prob": True, "scoring_func": args.moe_router_score_function,
            "topk_method": "noaux_tc", "first_k_dense_replace": first_dense,
            "q_lora_rank": args.q_lora_rank, "kv_lora_rank": args.kv_lora_rank,
            "qk_nope_head_dim": args.qk_head_dim, "qk_rope_head_dim": args.qk_pos_emb_head_dim,
            "v_head_dim": args.v_head_dim, "rope_interleave": True,
            "num_nextn_predict_layers": args.mtp_num_layers or 0, "attention_bias": False,
            "rope_theta": float(args.rotary_base), "rope_parameters": rope}


def save_hf_dir(model, args, iteration: int) -> None:
    """Gather the model from all ranks and write ``--hf-save-dir`` (rank 0), all or nothing."""
    import torch
    from megatron.core import mpu

    from adaptor.convert import convert_megatron_to_hf

    final = Path(args.hf_save_dir).absolute()
    work = final.parent / f".{final.name}.megatron-partial"
    rank = torch.distributed.get_rank()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    torch.distributed.barrier()
    error = None
    try:
        if mpu.get_expert_data_parallel_rank() == 0:
            write_rank_state(model, args, work / "megatron", iteration)
    except Exception as exc:  # noqa: BLE001  (reported once, by rank 0, below)
        error = f"rank {rank}: {type(exc).__name__}: {exc}"
    errors = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(errors, error)
    error = next((e for e in errors if e), None)
    if rank == 0:
        try:
            if error is None:
                (work / "megatron" / "latest_checkpointed_iteration.txt").write_text("release")
                config_dir = args.hf_load_dir
                if config_dir is None:
                    config_dir = work / "config"
                    config_dir.mkdir()
                    (config_dir / "config.json").write_text(json.dumps(hf_config_from_args(args), indent=2) + "\n")
                convert_megatron_to_hf(work / "megatron", final, args.model_type_hf, hf_config_dir=config_dir,
                                       layout=_layout(args))
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    status = [error]
    torch.distributed.broadcast_object_list(status, src=0)
    if status[0]:
        from adaptor.errors import fail

        fail(f"--hf-save-dir {args.hf_save_dir}: {status[0]}")
    if rank == 0:
        print(f"> wrote Hugging Face directory {final} (iteration {iteration})", flush=True)


def _train(wrapped, instance, args_, kwargs):
    from megatron.training import get_args

    result = wrapped(*args_, **kwargs)
    args = get_args()
    if args.hf_save_dir is not None:
        model = args_[1] if len(args_) > 1 else kwargs["model"]
        save_hf_dir(model, args, result[0])
    return result


# ----------------------------------------------------------------------------- arguments
def _set_padded_vocab_size(wrapped, instance, args_, kwargs):
    args = args_[0] if args_ else kwargs["args"]
    tokenizer = args_[1] if len(args_) > 1 else kwargs.get("tokenizer")
    explicit = getattr(args, "padded_vocab_size", None) is not None
    result = wrapped(*args_, **kwargs)
    if args.hf_load_dir is not None:
        from adaptor.errors import fail

        hf_vocab = json.loads((Path(args.hf_load_dir) / "config.json").read_text())["vocab_size"]
        if tokenizer is not None and tokenizer.vocab_size > hf_vocab:
            fail(f"--hf-load-dir {args.hf_load_dir}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                 f"checkpoint's vocab_size is {hf_vocab}; use the checkpoint's tokenizer")
        if not explicit:
            tp = args.tensor_model_parallel_size
            args.padded_vocab_size = max(args.padded_vocab_size, -(-hf_vocab // tp) * tp)
    return result


def _validate_args(wrapped, instance, args_, kwargs):
    from adaptor.convert import ConversionError
    from adaptor.errors import fail

    result = wrapped(*args_, **kwargs)
    args = args_[0] if args_ else kwargs["args"]
    if args.hf_load_dir is not None:
        where = f"--hf-load-dir {args.hf_load_dir}"
        config = json.loads((Path(args.hf_load_dir) / "config.json").read_text())
    else:
        where = "--hf-save-dir"
        try:
            config = hf_config_from_args(args)
        except (TypeError, ValueError, AttributeError) as exc:
            fail(f"--hf-save-dir: cannot describe this model as {args.model_type_hf}: {exc}")
    try:
        mismatch = config_mismatch(args, model_flags(args.model_type_hf, config))
    except ConversionError as exc:
        fail(f"{where}: {exc}")
    if mismatch:
        if args.hf_load_dir is not None:
            fail(f"{where}: config.json does not match the command line: {mismatch}")
        fail(f"--hf-save-dir: a {args.model_type_hf} config cannot describe this model: {mismatch}")
    return result


class HfCheckpointFlags(Feature):
    name = "hf_checkpoint"

    def add_arguments(self, group) -> None:
        group.add_argument("--hf-load-dir", default=None, dest="hf_load_dir", metavar="DIR",
                           help="Start training from this Hugging Face directory (config.json + safetensors): "
                                "each rank reads its own shard; a --load checkpoint that exists wins.")
        group.add_argument("--hf-save-dir", default=None, dest="hf_save_dir", metavar="DIR",
                           help="At the end of training write the model as a Hugging Face directory here.")
        group.add_argument("--model-type-hf", default=None, dest="model_type_hf",
                           choices=sorted(set(HF_MODEL_TYPES.values())),
                           help="Architecture of --hf-load-dir/--hf-save-dir (default: config.json's model_type).")

    def enabled(self, ctx) -> bool:
        flags = ctx.flags
        return super().enabled(ctx) and bool(getattr(flags, "hf_load_dir", None) or getattr(flags, "hf_save_dir", None))

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.training.setup_model_and_optimizer", _setup_model_and_optimizer, OWNER)
        pm.register_wrapper("megatron.training.training.train", _train, OWNER)
        pm.register_wrapper("megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size",
                            _set_padded_vocab_size, OWNER)
        pm.register_wrapper("megatron.training.arguments.validate_args", _validate_args, OWNER)

    def validate(self, args, ctx) -> None:
        if args.hf_load_dir is not None:
            config = read_hf_config(args.hf_load_dir, "--hf-load-dir")
            args.model_type_hf = hf_model_type(config, args.model_type_hf, f"--hf-load-dir {args.hf_load_dir}")
            from adaptor.convert import ConversionError, HfCheckpoint

            try:
                HfCheckpoint(args.hf_load_dir).names()
            except ConversionError as exc:
                raise ArgumentError(f"--hf-load-dir {args.hf_load_dir}: {exc}") from None
            if getattr(args, "pretrained_checkpoint", None):
                raise ArgumentError("--hf-load-dir and --pretrained-checkpoint both give initial weights; pass one")
            explicit_padded = getattr(args, "padded_vocab_size", None)
            if explicit_padded is not None and explicit_padded < config.get("vocab_size", 0):
                raise ArgumentError(f"--padded-vocab-size {explicit_padded} is smaller than vocab_size "
                                    f"{config['vocab_size']} of --hf-load-dir {args.hf_load_dir}")
        if args.hf_save_dir is not None:
            if args.model_type_hf is None:
                raise ArgumentError("--hf-save-dir without --hf-load-dir needs --model-type-hf qwen3|deepseek3")
            final = Path(args.hf_save_dir)
            if final.exists() and (not final.is_dir() or any(final.iterdir())):
                raise ArgumentError(f"--hf-save-dir {args.hf_save_dir} exists and is not an empty directory")
            if not final.absolute().parent.is_dir():
                raise ArgumentError(f"--hf-save-dir {args.hf_save_dir}: parent directory does not exist")
        vpp = getattr(args, "num_layers_per_virtual_pipeline_stage", None) or getattr(
            args, "num_virtual_stages_per_pipeline_rank", None)
        uneven = [flag for flag, dest in (("--decoder-first-pipeline-num-layers", "decoder_first_pipeline_num_layers"),
                                          ("--decoder-last-pipeline-num-layers", "decoder_last_pipeline_num_layers"),
                                          ("--pipeline-model-parallel-layout", "pipeline_model_parallel_layout"))
                  if getattr(args, dest, None)]
        if vpp or uneven:
            what = f"{uneven[0]} is" if uneven else "virtual pipeline stages are"
            raise ArgumentError(f"--hf-load-dir/--hf-save-dir split layers evenly over pipeline stages; "
                                f"{what} not supported with them")
        if args.num_layers and args.num_layers % args.pipeline_model_parallel_size:
            raise ArgumentError(f"--num-layers {args.num_layers} is not divisible by "
                                f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}")
