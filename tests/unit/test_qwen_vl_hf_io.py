"""Qwen2.5-VL / Qwen3-VL weights to and from Hugging Face, offline and at the end of training, in this process.

Tiny random ``Qwen2_5_VLForConditionalGeneration`` and ``Qwen3VLForConditionalGeneration`` directories
(tests/helpers/hf_fixtures.py), each with a processor file beside the weights:

* tools/convert_ckpt.py hf -> mg writes TP2 x PP2 torch rank files; the same tool mg -> hf (and
  tools/qwen_vl_to_hf.py) gives back every tensor bit for bit under the directory's names. At TP1 the rank
  file loads strictly (``_extra_state`` entries included) into the model pretrain_mm.py builds, and equals
  the model loaded from Hugging Face.
* ``--hf-save-dir``'s function (:func:`adaptor.mm.qwen_vl.hf_export.save_vl_hf_dir`, the text path's
  gather) run on that model in this one-process group writes a directory transformers loads, with
  config.json, the tokenizer and processor files, and the original tensors; the writer fed TP2 x PP2
  rank states (as the ranks hand them over) gives the same bit for bit.
* tools/check_vision_parity.py --hf-dir on both directories at TP1 passes (our tower against
  transformers' visual module on 28x28 and 56x84 / 32x32 and 64x96 images); its comparison of our tower
  loaded from a copy with the merger's output bias 0.01 larger against the original's reference is past the tolerance.
* Bad input is one line each: --hf-save-dir into a non-empty directory, a checkpoint of another model_id (mg -> hf with the other family's model.json), a model.json
  of another model_id than --model-type-hf.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from helpers.hf_fixtures import VL_IMAGE_TOKEN, make_tiny_qwen2_5_vl, make_tiny_qwen3_vl

ROOT = Path(__file__).resolve().parents[2]
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "merge_size": 2}


def model_json(work: Path, family: str, hf_dir: Path) -> str:
    ids = {"qwen2_5_vl": ("qwen2_5vl", "qwen2vit", "qwen2_5_lm"), "qwen3_vl": ("qwen3vl", "qwen3vit", "qwen3lm")}
    model_id, vision_id, text_id = ids[family]
    doc = {"model_id": model_id, "init_from_hf_path": str(hf_dir), "img_context_token_id": VL_IMAGE_TOKEN,
           "image_encoder": {"vision_encoder": {"model_id": vision_id}, "vision_projector": {"model_id": "lnmlp"}},
           "text_decoder": {"model_id": text_id}}
    path = work / f"{family}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def tool(name: str, *argv) -> tuple[int, str, str]:
    """A tools/ script's main() in this process: (exit code, stdout, stderr)."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, ROOT / "tools" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    environ = dict(os.environ)  # a tool sets its process's variables (ADAPTOR_QUIET); this process is the tests'
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = module.main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
        finally:
            os.environ.clear()
            os.environ.update(environ)
    return code, out.getvalue(), err.getvalue()


def tensors_of(path) -> dict:
    from adaptor.convert import HfCheckpoint

    hf = HfCheckpoint(path)
    return {n: hf.get(n).clone() for n in hf.names()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, model_parallel):
    work = tmp_path_factory.mktemp("vl_hf_io")
    out = {}
    for family, make in (("qwen2_5_vl", make_tiny_qwen2_5_vl), ("qwen3_vl", make_tiny_qwen3_vl)):
        hf_dir = make(work / family)
        (hf_dir / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
        out[family] = (hf_dir, model_json(work, family, hf_dir), tensors_of(hf_dir))
    return work, out


def build(model_json_file: str):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from adaptor.mm.config import load_model_config
    from adaptor.mm.qwen_vl.decoder import decoder_transformer_config
    from adaptor.mm.qwen_vl.model import QwenVLModel
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings

    model_parallel_cuda_manual_seed(1)
    cfg = load_model_config(model_json_file)
    text = text_config(cfg)
    model = QwenVLModel(vision_settings(cfg), text, decoder_transformer_config(text, use_cpu_initialization=True),
                        image_token_id=cfg.hf_config["image_token_id"], vocab_size=160)
    return cfg, model.eval()  # model.json's vocab_size: config.json's 160 rows


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_offline_both_ways_and_strict_load(dirs, family):
    work, found = dirs
    hf_dir, spec, original = found[family]
    out = work / f"{family}_runs"
    code, printed, err = tool("convert_ckpt.py", "--load-model-type", "hf", "--save-model-type", "mg",
                              "--model-type-hf", family, "--mm-model", spec, "--load-dir", hf_dir,
                              "--save-dir", out / "mg", "--target-tensor-parallel-size", 2,
                              "--target-pipeline-parallel-size", 2)
    assert code == 0, err
    assert sorted(p.name for p in (out / "mg" / "release").iterdir()) == [
        "mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]
    first = torch.load(out / "mg/release/mp_rank_01_000/model_optim_rng.pt", weights_only=True)["model"]
    assert first["language_model.embedding.word_embeddings.weight"].shape[0] == 80  # 160 rows unpadded, as pretrain_mm.py
    assert not any(n.startswith("vision_model.") for n in torch.load(
        out / "mg/release/mp_rank_00_001/model_optim_rng.pt", weights_only=True)["model"])
    code, _, err = tool("convert_ckpt.py", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf",
                        family, "--mm-model", spec, "--load-dir", out / "mg", "--save-dir", out / "hf")
    assert code == 0, err
    assert same(tensors_of(out / "hf"), original)
    assert (out / "hf" / "preprocessor_config.json").read_text() == json.dumps(PROCESSOR)
    code, printed, err = tool("qwen_vl_to_hf.py", "--load", out / "mg", "--mm-model", spec, "--save-dir", out / "hf2")
    assert code == 0 and "(TP 2, PP 2)" in printed, err
    assert same(tensors_of(out / "hf2"), original)

    # TP1: the rank file is exactly the state pretrain_mm.py's model takes with strict=True.
    code, _, err = tool("convert_ckpt.py", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf",
                        family, "--mm-model", spec, "--load-dir", hf_dir, "--save-dir", out / "mg1")
    assert code == 0, err
    from adaptor.convert import HfCheckpoint
    from adaptor.convert.layout import Layout
    from adaptor.mm.qwen_vl.checkpoint import load_hf_into

    cfg, model = build(spec)
    state = torch.load(out / "mg1/release/mp_rank_00/model_optim_rng.pt", weights_only=True)["model"]
    assert any(n.endswith("_extra_state") for n in state)
    model.load_state_dict(state, strict=True)
    loaded = {n: t.clone() for n, t in model.state_dict().items() if not n.endswith("_extra_state")}
    load_hf_into(model, HfCheckpoint(hf_dir), Layout(), 0, 0)
    assert same(loaded, {n: t for n, t in model.state_dict().items() if not n.endswith("_extra_state")})


def test_online_save_writes_the_directory(dirs):
    from transformers import AutoModelForImageTextToText

    from adaptor.convert import HfCheckpoint
    from adaptor.convert.layout import Layout
    from adaptor.mm.qwen_vl.checkpoint import TEXT, load_hf_into, rank_tensors
    from adaptor.mm.qwen_vl.hf_export import save_vl_hf_dir, write_vl_hf_dir
    from adaptor.safetensors_file import write_file

    work, found = dirs
    hf_dir, spec, original = found["qwen2_5_vl"]
    cfg, model = build(spec)
    load_hf_into(model, HfCheckpoint(hf_dir), Layout(), 0, 0)
    args = argparse.Namespace(hf_save_dir=str(work / "online"), tensor_model_parallel_size=1,
                              pipeline_model_parallel_size=1, expert_model_parallel_size=1, lora_r=None)
    save_vl_hf_dir([model], args, 3, cfg)
    assert same(tensors_of(work / "online"), original)
    assert json.loads((work / "online" / "config.json").read_text()) == cfg.hf_config
    assert (work / "online" / "preprocessor_config.json").is_file()
    assert not any(p.name.startswith(".online") for p in work.iterdir())  # no hand-over directory left
    hf = AutoModelForImageTextToText.from_pretrained(work / "online", dtype=torch.float32)
    assert type(hf).__name__ == "Qwen2_5_VLForConditionalGeneration"
    embedding = next(n for n in original if n.endswith("embed_tokens.weight"))
    assert torch.equal(hf.lm_head.weight, original[embedding])  # tied: the output layer is the embedding

    # The ranks of a TP2 x PP2 run, handed over as safetensors rank files (a padded vocabulary of 176 rows).
    hf_dir3, spec3, original3 = found["qwen3_vl"]
    from adaptor.mm.config import load_model_config

    layout, ranks = Layout(tp=2, pp=2), work / ".ranks-tp2pp2"
    for t in range(2):
        for p in range(2):
            state = dict(rank_tensors(HfCheckpoint(hf_dir3), layout, t, p, padded_vocab_size=176))
            if p == 0:
                assert state[TEXT + "embedding.word_embeddings.weight"].shape[0] == 88
            (ranks / f"mp_rank_{t:02d}_{p:03d}").mkdir(parents=True)
            write_file(ranks / f"mp_rank_{t:02d}_{p:03d}" / "model.safetensors", list(state.items()))
    write_vl_hf_dir(work / "online3", ranks, load_model_config(spec3), flag="--hf-save-dir")
    assert same(tensors_of(work / "online3"), original3)


def test_vision_parity_tool_on_both_families(dirs):
    work, found = dirs
    for family, sizes in (("qwen2_5_vl", "28x28, 56x84"), ("qwen3_vl", "32x32, 64x96")):
        code, printed, err = tool("check_vision_parity.py", "--hf-dir", found[family][0], "--tp", 1)
        assert code == 0, err
        assert f"{family} " in printed and f"images {sizes}): ok" in printed
        assert ("over 2 output(s)" if family == "qwen3_vl" else "over 1 output(s)") in printed
    # The comparison sees a tower that is not the reference's: ours from a copy with the merger's output bias 0.01 larger.
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import vl_vision_parity as vl

    hf_dir = found["qwen2_5_vl"][0]
    config = json.loads((hf_dir / "config.json").read_text())
    changed = work / "changed"
    shutil.copytree(hf_dir, changed)
    from safetensors.torch import save_file

    tensors = tensors_of(changed)
    bias = next(n for n in tensors if n.endswith("merger.mlp.2.bias"))
    tensors[bias] = tensors[bias] + 0.01
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    pixels, grid = vl.images(config, 1234)
    diff, _ = vl.compare(vl.our_outputs(str(changed), 1, 0, pixels, grid), vl.hf_outputs(str(hf_dir), pixels, grid))
    assert diff == pytest.approx(0.01, rel=1e-3)
    same_diff, _ = vl.compare(vl.our_outputs(str(changed), 1, 0, pixels, grid),
                              vl.hf_outputs(str(changed), pixels, grid))
    assert same_diff < 1e-4


def test_bad_input_is_one_line(dirs):
    from adaptor.features import ArgumentError
    from adaptor.mm.config import load_model_config
    from patches.multimodal.qwen_vl_hf_save import check_hf_flags

    work, found = dirs
    hf_dir, spec, _ = found["qwen2_5_vl"]
    cfg = load_model_config(spec)
    full = work / "full"
    full.mkdir(exist_ok=True)
    (full / "x").write_text("x")
    cases = [(argparse.Namespace(hf_load_dir=None, hf_save_dir=str(full)),
              f"--hf-save-dir {full} exists and is not an empty directory")]
    for args, message in cases:
        with pytest.raises(ArgumentError) as info:
            check_hf_flags(args, cfg)
        assert str(info.value) == message

    # A Qwen2.5-VL checkpoint read with Qwen3-VL's model.json; a model.json that is not --model-type-hf.
    ckpt = work / "qwen2_5_vl_runs" / "mg"
    assert ckpt.is_dir()  # written by test_offline_both_ways_and_strict_load
    spec3 = found["qwen3_vl"][1]
    code, _, err = tool("convert_ckpt.py", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf",
                        "qwen3_vl", "--mm-model", spec3, "--load-dir", ckpt, "--save-dir", work / "wrong")
    assert code == 2 and err.count("\n") == 1 and not (work / "wrong").exists()
    assert err.startswith("convert_ckpt.py: error: the checkpoint's vision tower is not model.json's qwen3vl "
                          "(qwen3_vl, depth 2): it "), err
    code, _, err = tool("convert_ckpt.py", "--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf",
                        "qwen3_vl", "--mm-model", spec, "--load-dir", hf_dir, "--save-dir", work / "wrong")
    assert code == 2 and err == (f"convert_ckpt.py: error: --mm-model {spec}: model_id qwen2_5vl is not "
                                 f"--model-type-hf qwen3_vl\n")
    code, _, err = tool("convert_ckpt.py", "--load-model-type", "mg", "--save-model-type", "hf", "--model-type-hf",
                        "qwen2_5_vl", "--mm-model", spec, "--load-dir", ckpt, "--save-dir", full)
    assert code == 2 and err == f"convert_ckpt.py: error: --save-dir {full} exists and is not empty (refusing to " \
                                "overwrite)\n", err
