"""Bad inputs caught before the first step: one line, a non-zero exit, no traceback, nothing touched.

Each case takes good inputs made once per module (a real indexed dataset, real checkpoints of
the three formats written by real runs, a Hugging Face directory written by transformers),
breaks one thing the way users do (a copy cut short, a garbage tracker, a file where a
directory belongs), runs the program as a user would, and checks:

* a non-zero exit and exactly one ``<program>: error:`` line naming the file and the fault;
* no traceback from our code or Megatron's;
* no training step was taken (the problem was visible at start, so it is reported at start);
* every input file keeps its bytes, and the working directory stays empty.

The cases of ``test_bad_input.py`` (parallel layouts, missing data, backends), of the tools'
own suites and of the FSDP2 and multimodal suites complete the catalogue in docs/testing.md.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from helpers.datasets import write_indexed_dataset
from helpers.hf_fixtures import make_tiny_qwen3
from helpers.megatron_runs import TINY_QWEN3_MODEL, TwoAtATime
from helpers.one_line_errors import child_frames, run, run_python, base_env
from helpers.paths import ROOT

NULL_TOKENIZER = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]
TRAIN = TINY_QWEN3_MODEL + NULL_TOKENIZER + ["--train-iters", "2"]
STEP = "iteration        1/"  # Megatron's log line of a finished first step


@dataclass
class Case:
    args: list[str]
    names: list[str]  # text the error line must contain
    protect: list[Path] = field(default_factory=list)  # inputs whose bytes must not change
    tool: str | None = None  # tools/<tool>; None: pretrain_gpt.py
    code: int = 2


def tree_digest(paths: list[Path]) -> dict[str, str]:
    out = {}
    for root in paths:
        for p in sorted([root] if root.is_file() else root.rglob("*")):
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def cut(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])


def patch_bytes(path: Path, offset: int, raw: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + len(raw)] = raw
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Good inputs: a dataset, a checkpoint per format, a Hugging Face directory."""
    base = tmp_path_factory.mktemp("good")
    rng = np.random.default_rng(0)
    prefix = base / "data" / "corpus"
    prefix.parent.mkdir()
    write_indexed_dataset(prefix, [rng.integers(1, 500, size=int(n), dtype=np.int32)
                                   for n in rng.integers(20, 200, size=48)], np.int32)
    saves = {fmt: base / f"ckpt_{fmt}" for fmt in ("torch", "torch_dist", "safetensors")}

    def save_run(fmt):
        args = TINY_QWEN3_MODEL + NULL_TOKENIZER + ["--mock-data", "--train-iters", "1", "--save", str(saves[fmt]),
                                                    "--save-interval", "1", "--ckpt-format", fmt]
        return lambda: run_python(args, cwd=base)

    pool = TwoAtATime()
    runs = pool.start({fmt: save_run(fmt) for fmt in saves})
    hf = make_tiny_qwen3(base / "hf_qwen3")
    for fmt, future in runs.items():
        proc = future.result()
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert (saves[fmt] / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    pool.close()
    return {"base": base, "prefix": prefix, "ckpt": saves, "hf": hf}


def data_copy(inputs, work: Path) -> Path:
    """A private copy of the good dataset; returns its prefix."""
    (work / "data").mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(str(inputs["prefix"]) + ext, work / "data" / ("corpus" + ext))
    return work / "data" / "corpus"


def ckpt_copy(inputs, work: Path, fmt: str) -> Path:
    return copy_tree(inputs["ckpt"][fmt], work / f"ckpt_{fmt}")


# -- the cases: each returns a Case for its own working copy ------------------------------------------

def idx_bad_header(inputs, work):
    p = data_copy(inputs, work)
    patch_bytes(Path(str(p) + ".idx"), 0, b"NOTANIDX")
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.idx", "not a Megatron index file"], [p.parent])


def idx_bad_version(inputs, work):
    p = data_copy(inputs, work)
    patch_bytes(Path(str(p) + ".idx"), 9, struct.pack("<Q", 7))
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.idx", "index version 7"], [p.parent])


def idx_bad_dtype(inputs, work):
    p = data_copy(inputs, work)
    patch_bytes(Path(str(p) + ".idx"), 17, bytes([42]))
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.idx", "dtype code 42"], [p.parent])


def idx_cut_short(inputs, work):
    p = data_copy(inputs, work)
    cut(Path(str(p) + ".idx"), -100)
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.idx", "cut short"], [p.parent])


def idx_damaged_documents(inputs, work):
    p = data_copy(inputs, work)
    idx = Path(str(p) + ".idx")
    patch_bytes(idx, idx.stat().st_size - 8, struct.pack("<q", 3))  # last document boundary
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.idx", "document boundaries", "damaged"], [p.parent])


def bin_cut_short(inputs, work):
    p = data_copy(inputs, work)
    cut(Path(str(p) + ".bin"), -1000)
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.bin", "shorter than", "cut short"], [p.parent])


def bin_from_another_run(inputs, work):
    p = data_copy(inputs, work)
    with open(str(p) + ".bin", "ab") as out:
        out.write(b"\0" * 4096)
    return Case(TRAIN + ["--data-path", str(p)], [f"{p}.bin", "longer than", "different runs"], [p.parent])


def blend_member_cut_short(inputs, work):
    p = data_copy(inputs, work)
    cut(Path(str(p) + ".bin"), -4)
    good = inputs["prefix"]
    return Case(TRAIN + ["--data-path", "0.7", str(good), "0.3", str(p)], [f"{p}.bin", "shorter than"],
                [p.parent, good.parent])


def per_split_member_bad(inputs, work):
    p = data_copy(inputs, work)
    patch_bytes(Path(str(p) + ".idx"), 0, b"XX")
    good = inputs["prefix"]
    return Case(TRAIN + ["--train-data-path", str(good), "--valid-data-path", str(p), "--test-data-path", str(good)],
                ["--valid-data-path", f"{p}.idx"], [p.parent, good.parent])


def data_args_file_missing(inputs, work):
    return Case(TRAIN + ["--data-args-path", str(work / "blend.txt")],
                ["--data-args-path", "blend.txt", "No such file"])


def data_args_file_empty(inputs, work):
    (work / "blend.txt").write_text("\n")
    return Case(TRAIN + ["--data-args-path", str(work / "blend.txt")], ["--data-args-path", "is empty"],
                [work / "blend.txt"])


def data_args_file_bad_member(inputs, work):
    p = data_copy(inputs, work)
    cut(Path(str(p) + ".bin"), 10)
    (work / "blend.txt").write_text(f"0.5 {inputs['prefix']}\n0.5 {p}\n")
    return Case(TRAIN + ["--data-args-path", str(work / "blend.txt")], ["--data-args-path", f"{p}.bin"],
                [work / "blend.txt", p.parent])


def per_split_json_invalid(inputs, work):
    (work / "splits.json").write_text('{"train": "a", "valid": ')
    return Case(TRAIN + ["--per-split-data-args-path", str(work / "splits.json")],
                ["--per-split-data-args-path", "not valid JSON"], [work / "splits.json"])


def per_split_json_missing_key(inputs, work):
    (work / "splits.json").write_text(json.dumps({"train": str(inputs["prefix"]), "valid": str(inputs["prefix"])}))
    return Case(TRAIN + ["--per-split-data-args-path", str(work / "splits.json")],
                ["--per-split-data-args-path", '"test"'], [work / "splits.json"])


def save_is_a_file(inputs, work):
    (work / "ckpt").write_text("not a directory")
    return Case(TRAIN + ["--mock-data", "--save", str(work / "ckpt")], ["--save", "is a regular file"],
                [work / "ckpt"])


def save_under_a_file(inputs, work):
    (work / "runs").write_text("a file")
    return Case(TRAIN + ["--mock-data", "--save", str(work / "runs" / "ckpt")],
                ["--save", "cannot be created", f"{work / 'runs'} is a regular file"], [work / "runs"])


def tensorboard_dir_is_a_file(inputs, work):
    (work / "tb").write_text("x")
    return Case(TRAIN + ["--mock-data", "--tensorboard-dir", str(work / "tb")], ["--tensorboard-dir", "regular file"],
                [work / "tb"])


def data_cache_under_a_file(inputs, work):
    (work / "cache").write_text("x")
    return Case(TRAIN + ["--data-path", str(inputs["prefix"]), "--data-cache-path", str(work / "cache" / "idx")],
                ["--data-cache-path", "cannot be created"], [work / "cache", inputs["prefix"].parent])


def save_without_room(inputs, work):
    """A model whose one checkpoint needs more bytes than any test machine has free."""
    huge = ["--num-layers", "64", "--hidden-size", "16384", "--ffn-hidden-size", "65536",
            "--num-attention-heads", "128", "--kv-channels", "128", "--group-query-attention",
            "--num-query-groups", "8"]
    return Case(TRAIN + huge + ["--mock-data", "--save", str(work / "ckpt"), "--save-interval", "1"],
                ["--save", "free on its filesystem", "one checkpoint of this model", "--skip-save-space-check"])


def save_without_interval(inputs, work):
    """Megatron's bare ``assert args.save_interval is not None``: the statement itself is the message."""
    return Case(TRAIN + ["--mock-data", "--save", str(work / "ckpt")],
                ["invalid Megatron arguments", "assert args.save_interval is not None", "arguments.py:"])


def tracker_garbage(inputs, work):
    ck = ckpt_copy(inputs, work, "torch_dist")
    (ck / "latest_checkpointed_iteration.txt").write_text("\x00\x17garbage\n")
    return Case(TRAIN + ["--mock-data", "--load", str(ck)], ["--load", "latest_checkpointed_iteration.txt",
                                                             "not an iteration number"], [ck])


def tracker_names_missing_iteration(inputs, work):
    ck = ckpt_copy(inputs, work, "safetensors")
    (ck / "latest_checkpointed_iteration.txt").write_text("40\n")
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "safetensors"],
                ["--load", "names iter_0000040, which does not exist", "iter_0000001"], [ck])


def resume_with_another_schedule(inputs, work):
    """A good checkpoint of a 1-iteration schedule, resumed with --train-iters 2: Megatron's assert, as one line."""
    ck = ckpt_copy(inputs, work, "torch_dist")
    return Case(TRAIN + ["--mock-data", "--load", str(ck)], ["does not fit this run", "OptimizerParamScheduler"],
                [ck], code=1)


def load_is_a_file(inputs, work):
    (work / "ckpt").write_text("x")
    return Case(TRAIN + ["--mock-data", "--load", str(work / "ckpt")], ["--load", "is not a directory"], [work / "ckpt"])


def exit_on_missing_checkpoint(inputs, work):
    (work / "empty").mkdir()
    return Case(TRAIN + ["--mock-data", "--load", str(work / "empty"), "--exit-on-missing-checkpoint"],
                ["--load", "no latest_checkpointed_iteration.txt", "--exit-on-missing-checkpoint"], [work / "empty"])


def pretrained_checkpoint_missing(inputs, work):
    return Case(TRAIN + ["--mock-data", "--pretrained-checkpoint", str(work / "nowhere")],
                ["--pretrained-checkpoint", "does not exist"])


def torch_file_cut_short(inputs, work):
    ck = ckpt_copy(inputs, work, "torch")
    pt = next(ck.glob("iter_*/mp_rank_*/model_optim_rng.pt"))
    cut(pt, pt.stat().st_size // 2)
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "torch"],
                [str(pt), "not a complete torch checkpoint file"], [ck])


def torch_rank_dir_missing(inputs, work):
    ck = ckpt_copy(inputs, work, "torch")
    for d in ck.glob("iter_*/mp_rank_*"):
        shutil.rmtree(d)
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "torch"],
                ["--load", "has no mp_rank_*/model_optim_rng.pt"], [ck])


def torch_dist_metadata_missing(inputs, work):
    ck = ckpt_copy(inputs, work, "torch_dist")
    (ck / "iter_0000001" / ".metadata").unlink()
    return Case(TRAIN + ["--mock-data", "--load", str(ck)], ["--load", "has no .metadata", "torch_dist"], [ck])


def torch_dist_marker_invalid(inputs, work):
    ck = ckpt_copy(inputs, work, "torch_dist")
    (ck / "iter_0000001" / "metadata.json").write_text("{not json")
    return Case(TRAIN + ["--mock-data", "--load", str(ck)], ["metadata.json", "not valid JSON"], [ck])


def safetensors_rank_file_cut_short(inputs, work):
    ck = ckpt_copy(inputs, work, "safetensors")
    rank = ck / "iter_0000001" / "rank_00000.safetensors"
    cut(rank, rank.stat().st_size - 64)
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "safetensors"],
                [str(rank), "truncated"], [ck])


def safetensors_rank_file_missing(inputs, work):
    ck = ckpt_copy(inputs, work, "safetensors")
    (ck / "iter_0000001" / "rank_00000.safetensors").unlink()
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "safetensors"],
                ["rank_00000.safetensors is missing", "common.json"], [ck])


def safetensors_common_invalid(inputs, work):
    ck = ckpt_copy(inputs, work, "safetensors")
    cut(ck / "iter_0000001" / "common.json", 50)
    return Case(TRAIN + ["--mock-data", "--load", str(ck), "--ckpt-format", "safetensors"],
                ["common.json", "not valid JSON"], [ck])


def hf_config_missing(inputs, work):
    hf = copy_tree(inputs["hf"], work / "hf")
    (hf / "config.json").unlink()
    return Case(TRAIN + ["--mock-data", "--hf-load-dir", str(hf)], ["--hf-load-dir", "config.json"], [hf])


def hf_config_invalid(inputs, work):
    hf = copy_tree(inputs["hf"], work / "hf")
    cut(hf / "config.json", 30)
    return Case(TRAIN + ["--mock-data", "--hf-load-dir", str(hf)], ["--hf-load-dir", "config.json"], [hf])


def hf_weights_missing(inputs, work):
    hf = copy_tree(inputs["hf"], work / "hf")
    for f in hf.glob("*.safetensors"):
        f.unlink()
    return Case(TRAIN + ["--mock-data", "--hf-load-dir", str(hf)], ["--hf-load-dir", str(hf)], [hf])


def hf_weights_cut_short(inputs, work):
    hf = copy_tree(inputs["hf"], work / "hf")
    weights = next(hf.glob("*.safetensors"))
    cut(weights, weights.stat().st_size - 100)
    return Case(TRAIN + ["--mock-data", "--hf-load-dir", str(hf)], ["--hf-load-dir", "truncated"], [hf])


def convert_hf_weights_cut_short(inputs, work):
    hf = copy_tree(inputs["hf"], work / "hf")
    weights = next(hf.glob("*.safetensors"))
    cut(weights, weights.stat().st_size - 100)
    return Case(["--load-model-type", "hf", "--save-model-type", "mg", "--model-type-hf", "qwen3",
                 "--load-dir", str(hf), "--save-dir", str(work / "out")], ["truncated"], [hf],
                tool="convert_ckpt.py")


def convert_mg_tracker_garbage(inputs, work):
    ck = ckpt_copy(inputs, work, "torch")
    (ck / "latest_checkpointed_iteration.txt").write_text("last\n")
    return Case(["--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", str(ck),
                 "--save-dir", str(work / "out")], ["latest_checkpointed_iteration.txt"], [ck],
                tool="convert_ckpt.py")


def merge_rank_file_cut_short(inputs, work):
    ck = ckpt_copy(inputs, work, "safetensors")
    rank = ck / "iter_0000001" / "rank_00000.safetensors"
    cut(rank, rank.stat().st_size - 64)
    return Case(["merge", "--load-dir", str(ck), "--save-dir", str(work / "merged")], [str(rank), "truncated"], [ck],
                tool="safetensors_ckpt.py")


CASES = {f.__name__: f for f in [
    idx_bad_header, idx_bad_version, idx_bad_dtype, idx_cut_short, idx_damaged_documents, bin_cut_short,
    bin_from_another_run, blend_member_cut_short, per_split_member_bad, data_args_file_missing,
    data_args_file_empty, data_args_file_bad_member, per_split_json_invalid, per_split_json_missing_key,
    save_is_a_file, save_under_a_file, tensorboard_dir_is_a_file, data_cache_under_a_file, save_without_room, save_without_interval,
    tracker_garbage, tracker_names_missing_iteration, resume_with_another_schedule, load_is_a_file, exit_on_missing_checkpoint,
    pretrained_checkpoint_missing, torch_file_cut_short, torch_rank_dir_missing, torch_dist_metadata_missing,
    torch_dist_marker_invalid, safetensors_rank_file_cut_short, safetensors_rank_file_missing,
    safetensors_common_invalid, hf_config_missing, hf_config_invalid, hf_weights_missing, hf_weights_cut_short,
    convert_hf_weights_cut_short, convert_mg_tracker_garbage, merge_rank_file_cut_short,
]}


# One case of each kind (data, outputs, checkpoints, Hugging Face) as a user launches it; the others
# start warm (docs/testing.md), which changes nothing they check.
COLD_CASES = {"idx_cut_short", "save_is_a_file", "tracker_garbage", "hf_config_missing"}


@pytest.fixture(scope="module")
def outcomes(inputs, tmp_path_factory):
    """name -> Future of (case, proc, work dir, digest before, cwd)."""
    def job(name):
        work = tmp_path_factory.mktemp(name)
        case = CASES[name](inputs, work)
        cwd = work / "cwd"
        cwd.mkdir()
        before = tree_digest(case.protect)
        if case.tool is None:
            proc = run_python(case.args, cwd=cwd, warm=name not in COLD_CASES)
        else:
            proc = run([sys.executable, str(ROOT / "tools" / case.tool), *case.args], cwd, base_env())
        return case, proc, work, before, cwd

    pool = TwoAtATime()
    yield pool.start({name: (lambda n=name: job(n)) for name in CASES})
    pool.close()


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_stops_at_start_in_one_line(outcomes, name):
    case, proc, work, before, cwd = outcomes[name].result()
    output = proc.stdout + proc.stderr
    where = "\n--- output tail ---\n" + "\n".join(output.splitlines()[-40:])
    program = (case.tool or "megatron-adaptor")
    lines = [line for line in output.splitlines() if line.startswith(f"{program}: error:")]
    assert proc.returncode == case.code, f"exit status {proc.returncode}{where}"
    assert len(lines) == 1, f"expected one error line, got {lines}{where}"
    for text in case.names:
        assert text in lines[0], f"{text!r} not named in: {lines[0]}"
    assert "Traceback" not in output and child_frames(output) == [], where
    assert STEP not in output, f"a training step ran before the error{where}"
    assert tree_digest(case.protect) == before, "an input file was changed"
    assert sorted(p.name for p in cwd.iterdir()) == [], "the failed run wrote into its working directory"
