"""The one Hugging Face directory writer.

:func:`write_hf_dir` maps Megatron tensors to Hugging Face ones one at a time
(:func:`adaptor.convert.tensors.hf_tensors_from_megatron`) and writes them as Hub-style safetensors
shards (+ index), with config.json and the tokenizer files, into a hidden directory renamed onto
the target when complete; a non-empty target is refused first
(:func:`adaptor.checkpoint.files.staged_directory`). Its callers:
``tools/convert_ckpt.py`` (:func:`adaptor.convert.offline.convert_megatron_to_hf`),
``tools/safetensors_ckpt.py merge --model-type-hf`` (:func:`adaptor.convert.offline.merge_to_hf`)
and ``--hf-save-dir`` at the end of training, LoRA merged or not (:func:`adaptor.convert.online.save_hf_dir`).
PEFT adapter directories (:func:`adaptor.convert.lora.write_peft_adapter`) are staged the same way.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from adaptor.checkpoint.files import staged_directory
from adaptor.checkpoint.consolidated import write_shards
from adaptor.convert.errors import ConversionError
from adaptor.convert.layout import Layout
from adaptor.convert.models import model_mapping
from adaptor.convert.tensors import hf_tensors_from_megatron

HF_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


def copy_side_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


TOKENIZER_FILES = HF_SIDE_FILES[2:]  # all but config.json and generation_config.json


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """The tokenizer of ``src``: a Hugging Face tokenizer directory (its model's config is not taken)
    or a ``tokenizer.json`` file."""
    if src.is_file():
        shutil.copyfile(src, dst / "tokenizer.json")
        return
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def write_hf_dir(save_dir, source, model_type, hf_config: dict, layout: Layout, padded_vocab_size: int, *,
                 side_files=None, tokenizer=None, extra_files: dict[str, str] | None = None,
                 max_shard_bytes: int = 5 * 2**30, flag: str = "--save-dir") -> Path:
    """Write the Hugging Face directory ``save_dir`` of the model ``source`` holds at ``layout``.

    ``source``: ``get((tp, pp, ep), megatron_name)``, ``get_meta`` (the same as a meta tensor), ``release``
    (its pages may go) and ``path`` (named in errors). Config.json and the tokenizer files are copied from
    the directory ``side_files`` when given, else config.json is ``hf_config`` and the tokenizer files come
    from ``tokenizer`` (see :func:`copy_tokenizer_files`) when given; ``extra_files``: name -> text.
    """
    mapping = model_mapping(model_type, hf_config) if isinstance(model_type, str) else model_type
    mapping.check_layout(layout)

    def export(get, release=None):
        return hf_tensors_from_megatron(get, mapping, hf_config, layout, padded_vocab_size=padded_vocab_size,
                                        release=release)

    with staged_directory(save_dir, flag, ConversionError) as temp:
        try:
            specs = list(export(source.get_meta))
        except RuntimeError as exc:
            raise ConversionError(f"{source.path}: the checkpoint does not match config.json "
                                  f"({str(exc).splitlines()[0]})") from None
        write_shards(temp, specs, export(source.get, source.release), max_shard_bytes)
        if side_files is not None:
            copy_side_files(Path(side_files), temp)
        elif tokenizer is not None:
            copy_tokenizer_files(Path(tokenizer), temp)
        if not (temp / "config.json").is_file():
            (temp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (temp / name).write_text(text)
    return Path(save_dir)
