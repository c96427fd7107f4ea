"""Does a ``--load`` checkpoint fit the model these flags build? Its padded vocabulary, its recorded
architecture, and one line for any tensor shape it cannot load into.

An HF embedding often has more rows than the tokenizer has tokens (Qwen3: 151,936 vs 151,669), but
Megatron pads the *tokenizer's* size, so loads failed with a raw ``size mismatch`` (``torch``) or
silently left rows at zero (``torch_dist``/``safetensors`` allow vocabulary shape mismatches). So:

* without ``--padded-vocab-size``, the value a ``--load`` checkpoint records (``hf/conversion.json``
  from ``tools/convert_ckpt.py``, or a safetensors ``common.json``) is used and logged;
* ``megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size``: the result must cover
  the tokenizer and divide by TP;
* ``megatron.core.dist_checkpointing.serialization.load``: every global shape is compared before
  reading (vocabulary tensors may differ in padding rows only);
* ``megatron.training.checkpointing.load_checkpoint`` (``torch``): torch's ``size mismatch``
  becomes the same line, naming the tensor, both shapes and the flag to change;
* a converted checkpoint's ``hf/config.json`` is compared with the flags after ``validate_args``,
  as ``--hf-load-dir`` does, so settings no shape shows (RoPE/YaRN, router scaling, tied embeddings)
  cannot silently differ;
* ``megatron.training.checkpointing.check_checkpoint_args`` (a resumed run, not ``--finetune``, as
  upstream compares its arguments): ``--apply-layernorm-1p`` must be as the checkpoint was saved,
  since its norm weights are then gamma of ``1 + gamma``, which no tensor shape shows.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from adaptor.checkpoint.files import TRACKER, tracked_dir_name
from adaptor.errors import fail
from adaptor.features import ArgumentError, Feature
from adaptor.log import notice, notice_once
from adaptor.wrapping import argument

OWNER = __name__
CONVERSION_RECORD = Path("hf") / "conversion.json"
VOCAB_TENSORS = ("word_embeddings", "output_layer")
_recorded: dict[int, str] = {}  # padded vocabulary taken from a checkpoint -> the file that records it

# Tensor-name fragment -> the flag that sets that dimension (first match wins).
_FLAG_FOR = (
    (("lora_A", "lora_B"), "--lora-r and the base model flags the adapters were trained with"),
    (VOCAB_TENSORS, "--padded-vocab-size"),
    (("experts.linear_fc", "experts.local_experts", "experts.experts"), "--moe-ffn-hidden-size"),
    (("shared_experts",), "--moe-shared-expert-intermediate-size"),
    (("linear_fc1", "linear_fc2"), "--ffn-hidden-size"),
    (("q_layernorm", "k_layernorm"), "--kv-channels"),
    (("linear_q", "linear_kv", "linear_qkv", "linear_proj"),
     "--num-attention-heads, --num-query-groups, --kv-channels (or the MLA head dims)"),
    (("position_embeddings",), "--max-position-embeddings"),
    (("router",), "--num-experts"),
)


class ShapeMismatch(Exception):
    """A checkpoint tensor whose shape the model cannot take; the message is one line."""


def _flag_for(key: str) -> str:
    for fragments, flag in _FLAG_FOR:
        if any(f in key for f in fragments):
            return flag
    return "--hidden-size and the other model flags the checkpoint was written with"


def mismatch_line(key: str, in_checkpoint, in_model, vocab_rows: int | None = None) -> str:
    line = (f"tensor {key} has shape {list(in_checkpoint)} in the checkpoint but {list(in_model)} in the model "
            f"these flags build; ")
    if vocab_rows is not None:
        return line + f"the checkpoint's vocabulary is padded to {vocab_rows} rows: pass --padded-vocab-size {vocab_rows}"
    return line + f"check {_flag_for(key)}"


def _is_vocab(key: str) -> bool:
    return any(name in key for name in VOCAB_TENSORS)


# -- the padded vocabulary a checkpoint records --------------------------------------------------

def _iteration_dir(load_dir: Path) -> Path | None:
    try:
        text = (load_dir / TRACKER).read_text().strip()
    except OSError:
        return None
    name = tracked_dir_name(text)
    return load_dir / name if name else None


def recorded_padded_vocab(load_dir) -> tuple[int, str] | None:
    """(padded vocabulary, the file that records it) for a checkpoint directory, or None."""
    load_dir = Path(load_dir)
    record = load_dir / CONVERSION_RECORD
    candidates = [(record, ("padded_vocab_size",))]
    iteration = _iteration_dir(load_dir)
    if iteration is not None:
        candidates.append((iteration / "common.json", ("state", "args", "__namespace__", "padded_vocab_size")))
    for path, keys in candidates:
        try:
            value = json.loads(path.read_text())
            for key in keys:
                value = value[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, int) and value > 0:
            return value, str(path)
    return None


# -- patches --------------------------------------------------------------------------------------

def _check_padded_vocab(wrapped, instance, call_args, kwargs):
    wrapped(*call_args, **kwargs)
    args, tokenizer = (list(call_args) + [kwargs.get("args"), kwargs.get("tokenizer")])[:2]
    padded, tokens, tp = args.padded_vocab_size, tokenizer.vocab_size, args.tensor_model_parallel_size
    if padded < tokens and _recorded.get(padded):
        fail(f"the checkpoint under {args.load} has a vocabulary of {padded} rows ({_recorded[padded]}), fewer than "
             f"the tokenizer's {tokens} tokens; train with the tokenizer it was made for")
    if padded < tokens:
        fail(f"--padded-vocab-size {padded} is smaller than the tokenizer's vocabulary ({tokens} tokens); "
             f"pass at least {tokens}")
    if padded % tp:
        fail(f"--padded-vocab-size {padded} is not divisible by --tensor-model-parallel-size {tp}")


def _tokenizer_vocab() -> int | None:
    try:
        from megatron.training import get_tokenizer

        return get_tokenizer().vocab_size
    except Exception:  # no tokenizer built (a tool loading outside training)
        return None


def check_global_shapes(sharded_state_dict, checkpoint_shapes: dict, tokenizer_vocab: int | None) -> list[str]:
    """Notes for vocabulary tensors whose padding differs; raises ShapeMismatch for anything else."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    notes = []
    tensors = []
    for item in nested_values(sharded_state_dict):
        if isinstance(item, ShardedTensorFactory):  # SwiGLU's fc1: the W and V halves it stores
            tensors += [t for t in nested_values(item.build()) if isinstance(t, ShardedTensor)]
        elif isinstance(item, ShardedTensor):
            tensors.append(item)
    tensors.sort(key=lambda t: t.key.startswith("optimizer"))  # name a model tensor first
    for tensor in tensors:
        stored = checkpoint_shapes.get(tensor.key)
        want = tuple(tensor.global_shape)
        if stored is None or tuple(stored) == want:
            continue
        stored = tuple(stored)
        if _is_vocab(tensor.key) and stored[1:] == want[1:]:
            if tokenizer_vocab is not None and min(stored[0], want[0]) >= tokenizer_vocab:
                notes.append(f"{tensor.key}: {stored[0]} rows in the checkpoint, {want[0]} in the model "
                             f"(padding only: the tokenizer has {tokenizer_vocab} tokens)")
                continue
            raise ShapeMismatch(mismatch_line(tensor.key, stored, want, vocab_rows=stored[0]))
        raise ShapeMismatch(mismatch_line(tensor.key, stored, want))
    return notes


def _dist_load(wrapped, instance, call_args, kwargs):
    sharded_state_dict = argument(call_args, kwargs, "sharded_state_dict")
    checkpoint_dir = call_args[1] if len(call_args) > 1 else kwargs["checkpoint_dir"]
    from adaptor.checkpoint.shapes import checkpoint_global_shapes

    shapes = checkpoint_global_shapes(checkpoint_dir)
    try:
        notes = check_global_shapes(sharded_state_dict, shapes, _tokenizer_vocab())
    except ShapeMismatch as exc:
        fail(f"--load {checkpoint_dir}: {exc}")
    for note in dict.fromkeys(notes):
        notice(f"loading {note}")
    return wrapped(*call_args, **kwargs)


_TORCH_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                                  r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def _load_checkpoint(wrapped, instance, call_args, kwargs):
    try:
        return wrapped(*call_args, **kwargs)
    except RuntimeError as exc:
        found = _TORCH_SIZE_MISMATCH.search(str(exc))
        if found is None:
            raise
        from megatron.training import get_args

        args = get_args()
        key = found.group(1)
        stored, want = ([int(x) for x in g.split(",") if x.strip()] for g in found.group(2, 3))
        vocab_rows = None
        if _is_vocab(key) and stored[1:] == want[1:]:
            vocab_rows = stored[0] * args.tensor_model_parallel_size  # torch format stores each TP rank's rows
        load_arg = kwargs.get("load_arg", "load")  # --lora-load's adapters load through here too
        flag = "--" + load_arg.replace("_", "-")
        saved_tp = _torch_checkpoint_tp(getattr(args, load_arg, None))
        if saved_tp is not None and saved_tp != args.tensor_model_parallel_size:
            fail(f"{flag} {getattr(args, load_arg, None)}: this torch-format checkpoint was saved at "
                 f"--tensor-model-parallel-size {saved_tp} and loads only at that size, not "
                 f"{args.tensor_model_parallel_size} (torch_dist and safetensors checkpoints load at any layout)")
        fail(f"{flag} {getattr(args, load_arg, None)}: {mismatch_line(key, stored, want, vocab_rows)}"
             + (" (shapes per tensor-parallel rank)" if args.tensor_model_parallel_size > 1 else ""))


_MP_RANK_DIR = re.compile(r"mp_rank_(\d\d)(_\d{3})*$")


def _torch_checkpoint_tp(load_dir) -> int | None:
    """The tensor-parallel size a torch-format checkpoint was saved at: its distinct ``mp_rank_TT`` dirs."""
    iteration = _iteration_dir(Path(load_dir)) if load_dir else None
    if iteration is None or not iteration.is_dir():
        return None
    ranks = {int(m.group(1)) for p in iteration.iterdir() if (m := _MP_RANK_DIR.match(p.name))}
    return len(ranks) or None


def converted_config_mismatch(args) -> str | None:
    """For a --load checkpoint from tools/convert_ckpt.py: the first flag its config.json disagrees with."""
    record = Path(args.load) / CONVERSION_RECORD
    config_file = record.parent / "config.json"
    if getattr(args, "hf_load_dir", None) or not record.is_file() or not config_file.is_file():
        return None
    from adaptor.convert import ConversionError
    from adaptor.convert.config_check import config_mismatch, model_flags

    try:
        model_type = json.loads(record.read_text())["model_type"]
        mismatch = config_mismatch(args, model_flags(model_type, json.loads(config_file.read_text())))
    except (OSError, ValueError, KeyError) as exc:
        return f"{record.parent} cannot be read ({exc})"
    except ConversionError as exc:
        return f"{config_file}: {exc}"
    return mismatch and f"{mismatch} ({config_file}); change the flag, or convert again"


def _validate_args(wrapped, instance, call_args, kwargs):
    result = wrapped(*call_args, **kwargs)
    args = argument(call_args, kwargs, "args")
    if getattr(args, "load", None):
        mismatch = converted_config_mismatch(args)
        if mismatch:
            fail(f"--load {args.load}: {mismatch}")
    return result


def _check_checkpoint_args(wrapped, instance, call_args, kwargs):
    from megatron.training import get_args

    checkpoint_args = argument(call_args, kwargs, "checkpoint_args")
    saved = bool(getattr(checkpoint_args, "layernorm_zero_centered_gamma", False))
    given = bool(getattr(get_args(), "layernorm_zero_centered_gamma", False))
    if saved != given:
        fail(f"--load {get_args().load}: the checkpoint was saved {'with' if saved else 'without'} "
             f"--apply-layernorm-1p, so its norms scale by {'1 + weight' if saved else 'weight'}; "
             f"{'add' if saved else 'drop'} the flag")
    return wrapped(*call_args, **kwargs)


class LoadShapeCheck(Feature):
    name = "load_shape_check"

    def register_patches(self, pm, ctx) -> None:
        pm.register_wrapper("megatron.training.arguments.validate_args", _validate_args, OWNER)
        pm.register_wrapper("megatron.core.tokenizers.utils.build_tokenizer._set_padded_vocab_size",
                            _check_padded_vocab, OWNER)
        pm.register_wrapper("megatron.core.dist_checkpointing.serialization.load", _dist_load, OWNER)
        pm.register_wrapper("megatron.training.checkpointing.load_checkpoint", _load_checkpoint, OWNER)
        pm.register_wrapper("megatron.training.checkpointing.check_checkpoint_args", _check_checkpoint_args, OWNER)

    def set_defaults(self, args, ctx) -> None:
        if "padded_vocab_size" in ctx.explicit or not getattr(args, "load", None):
            return
        found = recorded_padded_vocab(args.load)
        if found is None:
            return
        value, source = found
        if value % args.tensor_model_parallel_size:
            return  # cannot be used at this TP; the load-time check says what to pass
        args.padded_vocab_size = value
        notice_once(f"padded vocabulary {value}, as recorded in {source}")
        _recorded[value] = source

    def validate(self, args, ctx) -> None:
        if args.padded_vocab_size is not None and args.padded_vocab_size < 1:
            raise ArgumentError(f"--padded-vocab-size {args.padded_vocab_size} must be positive")
