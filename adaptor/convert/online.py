"""Online conversion: fill a live Megatron model from a Hugging Face directory, and write one from it.

Used by ``--hf-load-dir`` / ``--hf-save-dir`` (patches/hf/online_conversion.py) and tools/check_hf_parity.py.
Loading reads, on each rank, only the tensors that rank holds (:func:`megatron_rank_tensors`, mmap).
Saving hands each rank's state over as one safetensors file in a hidden directory beside the target
(no pickle); rank 0 reads them back tensor by tensor into the one HF writer
(:func:`adaptor.convert.hf_writer.write_hf_dir`). With LoRA layers, loading leaves the adapters alone,
and saving writes either the adapters alone (a PEFT directory) or each rank's weights with them merged
(:mod:`adaptor.convert.lora`); :func:`load_peft_adapter` reads a PEFT directory into the adapters.
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from adaptor.convert.config_check import normalized_value
from adaptor.lora import is_lora_name
from adaptor.log import notice

def _unwrapped(model):
    from megatron.core.utils import unwrap_model

    return unwrap_model(model if isinstance(model, list) else [model])


def copy_into(module, tensors, what: str, select=None) -> int:
    """Copy (name, tensor) pairs into ``module``'s parameters; every parameter (``select(name)`` true) must be given."""
    import torch

    from adaptor.convert.errors import ConversionError

    target = {n: t for n, t in module.state_dict(keep_vars=True).items()
              if not n.endswith("_extra_state") and (select is None or select(n))}
    copied = set()
    with torch.no_grad():
        for name, tensor in tensors:
            if name.endswith("_extra_state") or tensor is None:
                continue
            if name not in target:
                raise ConversionError(f"tensor {name} has no place in the {what}")
            if tuple(target[name].shape) != tuple(tensor.shape):
                raise ConversionError(f"tensor {name}: shape {tuple(tensor.shape)} in the checkpoint, "
                                      f"{tuple(target[name].shape)} in the {what}")
            target[name].data.copy_(tensor)
            copied.add(name)
    missing = sorted(set(target) - copied)
    if missing:
        raise ConversionError(f"the checkpoint gives no value for {missing[0]}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return len(copied)


def load_hf_weights(model, args) -> int:
    """Copy this rank's tensors of the HF directory into ``model``; returns how many were copied."""
    from megatron.core import mpu

    from adaptor.convert.errors import ConversionError
    from adaptor.convert.hf_directory import HfCheckpoint
    from adaptor.convert.layout import Layout
    from adaptor.convert.tensors import megatron_rank_tensors

    chunks = _unwrapped(model)
    layout = Layout.of(args)
    if len(chunks) != layout.vpp:
        raise ConversionError(f"{len(chunks)} model chunks on this rank, {layout.vpp} virtual pipeline stages")
    hf = HfCheckpoint(args.hf_load_dir)
    count = 0
    for vp_stage, chunk in enumerate(chunks):  # Megatron's model list: one chunk per virtual stage, in order
        tensors = megatron_rank_tensors(
            hf, args.model_type_hf, layout, mpu.get_tensor_model_parallel_rank(),
            mpu.get_pipeline_model_parallel_rank(), mpu.get_expert_model_parallel_rank(), vp_stage=vp_stage,
            padded_vocab_size=args.padded_vocab_size)
        # LoRA adapters keep their own start (or --lora-load's): the base checkpoint has none.
        what = "this rank's model" if len(chunks) == 1 else f"model chunk {vp_stage} of this rank"
        count += copy_into(chunk, tensors, what, select=lambda n: not is_lora_name(n))
    return count


def load_peft_adapter(model, args, adapter_dir) -> int:
    """Copy this rank's part of a PEFT LoRA adapter directory into the model's ``lora_A`` / ``lora_B``.

    The model's base architecture comes from ``--hf-load-dir``'s config.json, or from the flags
    (``--model-type-hf``); the adapter's r and lora_alpha must be the flags'. Returns the tensors copied.
    """
    from megatron.core import mpu

    from adaptor.convert.errors import ConversionError
    from adaptor.convert.layout import Layout
    from adaptor.convert.lora import PeftAdapter, peft_rank_tensors, settings_from_args

    chunks = _unwrapped(model)
    settings = settings_from_args(args)
    if settings is None:
        raise ConversionError("a PEFT adapter needs LoRA layers (--lora-r)")
    hf_config = _hf_config(args)
    layout = Layout.of(args)
    if len(chunks) != layout.vpp:
        raise ConversionError(f"{len(chunks)} model chunks on this rank, {layout.vpp} virtual pipeline stages")
    adapter = PeftAdapter(adapter_dir)
    count = 0
    for vp_stage, chunk in enumerate(chunks):
        wanted = {n for n in chunk.state_dict() if is_lora_name(n)}
        # each chunk as a pipeline rank of its own: the same placement (Layout.flat)
        tensors = peft_rank_tensors(adapter, args.model_type_hf, hf_config, layout.flat(),
                                    mpu.get_tensor_model_parallel_rank(),
                                    layout.stage(mpu.get_pipeline_model_parallel_rank(), vp_stage),
                                    mpu.get_expert_model_parallel_rank(), settings, wanted)
        what = "this rank's LoRA adapter" if len(chunks) == 1 else f"LoRA adapter of model chunk {vp_stage}"
        count += copy_into(chunk, tensors, what, select=is_lora_name)
    return count


def lora_scalings(module) -> dict[str, float | None]:
    """Each LoRA-adapted linear of ``module`` (by state-dict prefix) and its scaling alpha / r (None where
    the adapters are merged into the weight already)."""
    return {name: None if getattr(m, "lora_merged", False) else float(m.lora_scaling)
            for name, m in module.named_modules()
            if getattr(m, "lora_A", None) is not None and getattr(m, "lora_B", None) is not None}


def load_peft_lora(model, optimizer, args) -> None:
    """``--lora-load DIR`` where DIR is a PEFT adapter directory: fill the adapters (fresh optimizer state,
    iteration unchanged); a problem is one line."""

    from adaptor.convert.errors import ConversionError
    from adaptor.errors import fail

    try:
        count = load_peft_adapter(model, args, args.lora_load)
    except (ConversionError, OSError) as exc:
        fail(f"--lora-load {args.lora_load}: {exc}")
    if optimizer is not None:
        optimizer.reload_model_params()
    notice(f"rank 0 loaded its {count} LoRA tensors from PEFT adapter {args.lora_load}")


def write_rank_state(model, args, directory: Path, lora: str | None = None) -> None:
    """This rank's model state as ``directory/mp_rank_TT[_PPP][_EEE]/model.safetensors`` (Megatron's rank
    directory names; :class:`~adaptor.convert.torch_legacy.RankStates` reads them back). With virtual
    pipeline stages each model chunk is written as a pipeline rank of its own, of ``Layout.of(args).flat()``.

    ``lora="merged"``: adapted weights are written merged (``W + scaling * B @ A``), without the adapter
    tensors; ``lora="adapter"``: only the adapter tensors are written.
    """
    from megatron.core import mpu

    from adaptor.convert.layout import Layout
    from adaptor.convert.lora import merge_lora_state
    from adaptor.convert.torch_legacy import STATE_FILE, rank_dir_name
    from adaptor.safetensors_file import write_file

    layout = Layout.of(args)
    for vp_stage, chunk in enumerate(_unwrapped(model)):
        state = {name: tensor.detach().cpu() for name, tensor in chunk.state_dict().items()
                 if not name.endswith("_extra_state")}
        if lora == "merged":
            state = merge_lora_state(state, lora_scalings(chunk))
        elif lora == "adapter":
            state = {name: tensor for name, tensor in state.items() if is_lora_name(name)}
        rank_dir = directory / rank_dir_name(
            mpu.get_tensor_model_parallel_rank(), layout.stage(mpu.get_pipeline_model_parallel_rank(), vp_stage),
            mpu.get_expert_model_parallel_rank(), layout.stages, args.expert_model_parallel_size)
        rank_dir.mkdir(parents=True, exist_ok=True)
        write_file(rank_dir / STATE_FILE, list(state.items()))


def _get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope_parameters(args) -> dict:
    """transformers' rope_parameters for a standard-attention model: plain, linear or YaRN RoPE."""
    rope = {"rope_type": "default", "rope_theta": float(args.rotary_base)}
    if args.position_embedding_type == "yarn":
        factor = float(args.rotary_scaling_factor)
        rope.update(rope_type="yarn", factor=factor,
                    original_max_position_embeddings=args.yarn_original_max_position_embeddings or 4096,
                    beta_fast=float(args.yarn_beta_fast or 32.0), beta_slow=float(args.yarn_beta_slow or 1.0))
        if (args.mscale, args.mscale_all_dim) != (1.0, 0.0):  # transformers' default is get_mscale(factor, 1)
            rope["attention_factor"] = _get_mscale(factor, args.mscale) / _get_mscale(factor, args.mscale_all_dim)
        if args.yarn_correction_range_round_to_int is False:
            rope["truncate"] = False
    elif args.rotary_seq_len_interpolation_factor:
        rope.update(rope_type="linear", factor=float(args.rotary_seq_len_interpolation_factor))
    elif getattr(args, "use_rope_scaling", False):
        from adaptor.convert.rope import LLAMA3_FIXED

        rope.update(rope_type="llama3", factor=float(args.rope_scaling_factor), **LLAMA3_FIXED)
    return rope


def hf_config_from_args(args) -> dict:
    """A transformers config.json for the model the flags build (a family of adaptor.convert.models)."""
    if getattr(args, "layernorm_zero_centered_gamma", False):
        from adaptor.convert.config_check import ZERO_CENTRED_GAMMA

        raise ValueError(ZERO_CENTRED_GAMMA)
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
                "rope_theta": float(args.rotary_base), "rope_parameters": _rope_parameters(args)}
    if args.model_type_hf in ("qwen3-moe", "mixtral"):
        return _routed_moe_config(args, common)
    if args.model_type_hf in ("llama2", "qwen2"):
        config = {**common, "intermediate_size": args.ffn_hidden_size,
                  "num_key_value_heads": args.num_query_groups if args.group_query_attention
                  else args.num_attention_heads,
                  "head_dim": args.kv_channels, "rope_theta": float(args.rotary_base),
                  "rope_parameters": _rope_parameters(args)}
        if args.model_type_hf == "qwen2":
            return {**config, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                    "use_sliding_window": False}
        return {**config, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "attention_bias": False, "mlp_bias": False}
    freq = normalized_value("moe_layer_freq", args.moe_layer_freq, args)
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


def _routed_moe_config(args, common: dict) -> dict:
    """config.json of a Qwen3-MoE or Mixtral model the flags build; ValueError for what neither expresses."""
    if not args.num_experts:
        raise ValueError(f"{args.model_type_hf} needs --num-experts")
    if args.moe_shared_expert_intermediate_size:
        raise ValueError(f"{args.model_type_hf} has no shared experts (--moe-shared-expert-intermediate-size)")
    if args.moe_router_score_function != "softmax" or args.moe_router_topk_scaling_factor not in (None, 1.0) \
            or args.moe_router_enable_expert_bias or args.moe_router_num_groups:
        raise ValueError(f"{args.model_type_hf}'s router is a plain softmax top-k (no --moe-router-score-function "
                         f"sigmoid, --moe-router-topk-scaling-factor, expert bias or groups)")
    freq = normalized_value("moe_layer_freq", args.moe_layer_freq, args)
    kv_heads = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    attention = {"num_key_value_heads": kv_heads, "head_dim": args.kv_channels,
                 "rope_theta": float(args.rotary_base), "rope_parameters": _rope_parameters(args),
                 "num_experts_per_tok": args.moe_router_topk, "sliding_window": None}
    if args.model_type_hf == "mixtral":
        if not all(freq) or args.qk_layernorm or args.moe_router_pre_softmax \
                or args.moe_ffn_hidden_size != args.ffn_hidden_size:
            raise ValueError("mixtral has every layer MoE with --moe-ffn-hidden-size = --ffn-hidden-size, no "
                             "--qk-layernorm and renormalised top-k weights (no --moe-router-pre-softmax)")
        return {**common, **attention, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "intermediate_size": args.ffn_hidden_size, "num_local_experts": args.num_experts,
                "router_jitter_noise": 0.0}
    if not args.qk_layernorm:
        raise ValueError("qwen3-moe normalises q and k (--qk-layernorm)")
    dense = [i for i, f in enumerate(freq) if not f]
    return {**common, **attention, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "intermediate_size": args.ffn_hidden_size, "moe_intermediate_size": args.moe_ffn_hidden_size,
            "num_experts": args.num_experts, "norm_topk_prob": not args.moe_router_pre_softmax,
            "decoder_sparse_step": 1, "mlp_only_layers": dense, "use_sliding_window": False,
            "attention_bias": bool(args.add_qkv_bias)}


def _hf_config(args) -> dict:
    """The config.json of the model: --hf-load-dir's, else written from the flags (--model-type-hf)."""
    from adaptor.convert.errors import ConversionError

    if args.hf_load_dir is not None:
        return json.loads((Path(args.hf_load_dir) / "config.json").read_text())
    if getattr(args, "model_type_hf", None):
        return hf_config_from_args(args)
    raise ConversionError("the base architecture is unknown: pass --model-type-hf (qwen3, llama2, qwen2, ...)")


def hf_tokenizer_source(args) -> Path | None:
    """Where ``--hf-save-dir`` takes the tokenizer from without ``--hf-load-dir``: the run's own Hugging
    Face tokenizer (``--tokenizer-model``, a directory or a tokenizer.json), so the directory loads whole."""
    if args.tokenizer_type not in ("HuggingFaceTokenizer", "PretrainedFromHF") or not args.tokenizer_model:
        return None
    path = Path(args.tokenizer_model)
    return path if path.is_dir() or path.name == "tokenizer.json" and path.is_file() else None


def save_hf_dir(model, args, iteration: int, write=None) -> None:
    """Gather the model from all ranks and write ``--hf-save-dir`` (rank 0), all or nothing.

    The ranks (expert-data-parallel rank 0 of each model part) write their states into a hidden
    directory beside ``--hf-save-dir``, on a filesystem they share; a failure on any rank is one error
    line, and the hidden directory is removed whatever happens. ``write(rank_dir, final)``, when given,
    makes the directory from the ranks' files instead of the text families' writer (models that are not
    a GPTModel, such as the Qwen-VL ones).
    """
    import torch
    from megatron.core import mpu

    from adaptor.convert.hf_writer import write_hf_dir
    from adaptor.convert.layout import Layout
    from adaptor.convert.lora import peft_adapter_from_rank_files, settings_from_args
    from adaptor.convert.torch_legacy import RankStates

    lora = settings_from_args(args)
    mode = (getattr(args, "hf_save_lora", None) or "adapter") if lora else None
    final = Path(args.hf_save_dir).absolute()
    work = final.parent / f".{final.name}.ranks-partial"
    rank = torch.distributed.get_rank()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    torch.distributed.barrier()
    error = None
    try:
        if mpu.get_expert_data_parallel_rank() == 0:
            write_rank_state(model, args, work, lora=mode)
    except Exception as exc:  # noqa: BLE001  (reported once, by rank 0, below)
        error = f"rank {rank}: {type(exc).__name__}: {exc}"
    errors = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(errors, error)
    error = next((e for e in errors if e), None)
    if rank == 0:
        try:
            if error is None and write is not None:
                write(work, final)
            elif error is None:
                layout, hf_config = Layout.of(args).flat(), _hf_config(args)  # as write_rank_state wrote
                if mode == "adapter":
                    peft_adapter_from_rank_files(work, final, args.model_type_hf, hf_config, layout, lora,
                                                 None if args.hf_load_dir is None else str(args.hf_load_dir),
                                                 flag="--hf-save-dir")
                else:
                    write_hf_dir(final, RankStates(work, layout), args.model_type_hf, hf_config, layout,
                                 args.padded_vocab_size, side_files=args.hf_load_dir,
                                 tokenizer=hf_tokenizer_source(args), flag="--hf-save-dir")
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
        what = {"adapter": "PEFT LoRA adapter", "merged": "Hugging Face directory (LoRA merged)"}.get(
            mode, "Hugging Face directory")
        print(f"> wrote {what} {final} (iteration {iteration})", flush=True)
