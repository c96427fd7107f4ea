"""Qwen2.5-VL / Qwen3-VL checkpoints in both directions between Megatron rank files and Hugging Face.

* :func:`write_vl_hf_dir`: a directory of rank states (a ``--ckpt-format torch`` iteration, or what
  ``--hf-save-dir``'s ranks hand over) -> a Hugging Face directory, written all or nothing: the tensors
  under the names of the directory the run started from (model.json's ``init_from_hf_path``), config.json
  from the model's Hugging Face config, the tokenizer and processor files copied from that directory.
* :func:`write_vl_megatron_release`: a Hugging Face directory -> legacy torch rank files at TP x PP, a
  ``release`` checkpoint ``pretrain_mm.py --load`` reads strictly (``_extra_state`` entries included,
  as Megatron saves its linear layers).

A checkpoint of another model (LLaVA's, or the other Qwen-VL family's) is refused by name before
anything is written.
"""
from __future__ import annotations

import json
from pathlib import Path

from adaptor.checkpoint.files import staged_directory
from adaptor.convert.errors import ConversionError
from adaptor.convert.hf_writer import HF_SIDE_FILES
from adaptor.convert.layout import Layout
from adaptor.mm.qwen_vl import checkpoint
from adaptor.mm.qwen_vl import weights as vision_weights
from adaptor.mm.qwen_vl.settings import VisionSettings

# What AutoProcessor reads besides the tokenizer: kept so that the written directory loads whole.
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json",
                   "chat_template.json", "chat_template.jinja")


def copy_processor_files(src: Path, dst: Path) -> None:
    """The tokenizer and processor files of ``src`` (not its config.json: the model's own is written)."""
    import shutil

    for name in HF_SIDE_FILES + PROCESSOR_FILES:
        if name != "config.json" and (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def check_checkpoint_model(names, model_cfg) -> None:
    """ConversionError unless the first stage's tensor ``names`` are model.json's model (its tower and
    decoder): a LLaVA checkpoint, or one of the other Qwen-VL family, is named as such in one line."""
    names = set(names)
    if f"{checkpoint.TEXT}embedding.word_embeddings.weight" not in names:
        raise ConversionError(f"the checkpoint holds no {model_cfg.model_id} model (no "
                              f"{checkpoint.TEXT}embedding.word_embeddings.weight; another model_id's checkpoint?)")
    hf_config = model_cfg.hf_config
    settings = VisionSettings.from_hf(hf_config["model_type"], hf_config["vision_config"])
    wanted = {checkpoint.VISION + rule.ours for rule in vision_weights.rules(settings)}
    have = {n for n in names if n.startswith(checkpoint.VISION) and not n.endswith("_extra_state")}
    if wanted != have:
        odd = sorted(wanted ^ have)[0]
        where = "lacks" if odd in wanted else "has"
        raise ConversionError(f"the checkpoint's vision tower is not model.json's {model_cfg.model_id} "
                              f"({settings.family}, depth {settings.depth}): it {where} {odd}")


def write_vl_hf_dir(save_dir, iteration_dir, model_cfg, *, flag: str = "--save-dir") -> Path:
    """Write the Hugging Face directory ``save_dir`` of the rank states under ``iteration_dir``."""
    from adaptor.convert.hf_directory import HfCheckpoint
    from adaptor.convert.torch_legacy import RankStates

    init = Path(model_cfg.init_from_hf_path) if model_cfg.init_from_hf_path else None
    like = HfCheckpoint(init) if init is not None else None
    layout = checkpoint.checkpoint_layout(iteration_dir)
    check_checkpoint_model(RankStates(iteration_dir, layout).state((0, 0, 0)), model_cfg)
    tensors = checkpoint.hf_state_from_checkpoint(iteration_dir, model_cfg.hf_config, like=like)
    with staged_directory(save_dir, flag, ConversionError) as temp:
        checkpoint.save_tensors(tensors, model_cfg.hf_config, temp)
        if init is not None:
            copy_processor_files(init, temp)
    return Path(save_dir)


def _rank_specs(hf, layout: Layout, tp_rank: int, pp_rank: int, padded: int, tied: bool):
    """(name, tensor) of one rank, then (name, None) for its linear layers' ``_extra_state``."""
    from adaptor.convert.mapping import extra_state_names

    tensors = list(checkpoint.rank_tensors(hf, layout, tp_rank, pp_rank, padded_vocab_size=padded))
    extra = []
    for prefix, part_tied in ((checkpoint.TEXT, tied), (checkpoint.VISION, False)):
        names = [n[len(prefix):] for n, _ in tensors if n.startswith(prefix)]
        if names:
            extra += [prefix + n for n in extra_state_names(names, pp_rank, layout, part_tied)]
    return tensors, extra


def write_vl_megatron_release(load_dir, save_dir, model_cfg, layout: Layout) -> Path:
    """Write ``save_dir/release/mp_rank_TT[_PPP]/model_optim_rng.pt`` (and the tracker) from the Hugging Face
    directory ``load_dir``, at ``layout`` (TP x PP), for ``pretrain_mm.py --mm-model model.json --load``.
    The embedding keeps config.json's vocabulary unpadded, as pretrain_mm.py sizes it (model.json's
    ``vocab_size`` is the padded vocabulary there)."""
    from adaptor.convert.hf_directory import HfCheckpoint
    from adaptor.convert.torch_legacy import CHECKPOINT_FILE, TRACKER_FILE, rank_dir_name, write_model_file
    from adaptor.mm.qwen_vl.text_config import vl_text_config
    from adaptor.mm.qwen_vl.text_weights import text_mapping

    hf = HfCheckpoint(load_dir)
    family = hf.config.get("model_type")
    expected = model_cfg.hf_config["model_type"]
    if family != expected:
        raise ConversionError(f"{load_dir}: model_type {family!r}, but model.json's {model_cfg.model_id} is "
                              f"{expected!r}")
    config = model_cfg.hf_config
    try:
        mapping = text_mapping(config).for_checkpoint(hf)
        mapping.check_layout(layout)
        vision_weights.vision_prefix(hf.names())
    except ValueError as exc:
        raise ConversionError(f"{load_dir}: {exc}") from None
    padded = vl_text_config(config).vocab_size
    if padded % layout.tp:
        raise ConversionError(f"{load_dir}: vocab_size {padded} does not split over --target-tensor-parallel-size "
                              f"{layout.tp}")
    with staged_directory(save_dir, error=ConversionError) as temp:
        release = temp / "release"
        for tp_rank, pp_rank, _ in layout.rank_keys():
            tensors, extra = _rank_specs(hf, layout, tp_rank, pp_rank, padded, mapping.tied)
            specs = [(n, t.to("meta")) for n, t in tensors] + [(n, None) for n in extra]
            rank_dir = release / rank_dir_name(tp_rank, pp_rank, 0, layout.pp, 1)
            rank_dir.mkdir(parents=True)
            write_model_file(rank_dir / CHECKPOINT_FILE, specs, iter(tensors))
        (temp / TRACKER_FILE).write_text("release")
        (temp / "hf").mkdir()
        (temp / "hf" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Path(save_dir)


def save_vl_hf_dir(model, args, iteration: int, model_cfg) -> None:
    """``--hf-save-dir`` of a Qwen-VL run: the text path's gather (every rank's state, any TP/PP, all or
    nothing; :func:`adaptor.convert.online.save_hf_dir`) with :func:`write_vl_hf_dir` as the writer."""
    from adaptor.convert.online import save_hf_dir

    save_hf_dir(model, args, iteration,
                write=lambda ranks, final: write_vl_hf_dir(final, ranks, model_cfg, flag="--hf-save-dir"))
