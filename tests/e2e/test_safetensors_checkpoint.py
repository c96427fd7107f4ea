"""--ckpt-format safetensors through Megatron's own loop: resume, kill, SIGTERM, resharding, async, retention.

The reference is one uninterrupted run: the tiny Qwen3 at DP=2 with the distributed optimizer
(its state saved as each rank's own flattened ranges), 8 fp32 iterations, a checkpoint every 4.
Resumes at the same layout must reproduce it bit for bit: the printed losses to the last digit
and every tensor of the final checkpoint exactly (same numbers in the same order of operations).
Loads at another layout are checked exactly too, on the tensors: the model and the Adam moments a
run loads at TP=2, PP=2 or on one process, saved again unchanged, equal the source checkpoint's.
A damaged checkpoint is named in one error. tools/safetensors_ckpt.py merges the reference into whole
tensors (Megatron or Hugging Face names) and splits them back, at its layout or TP=2, to the same values.
The flags' own checks: tests/unit/test_safetensors_checkpoint.py.
"""
from __future__ import annotations

import json
import signal
import struct
from pathlib import Path

import pytest
import torch

from helpers.megatron_runs import TINY_DEEPSEEK_V3, TINY_QWEN3, LiveRun, run_pretrain, tail
from helpers.one_line_errors import error_lines
from helpers.paths import ROOT
from helpers.processes import child_env, run_tool
from helpers.prefetch import prefetched

ITERS = 8
DP2_DISTOPT = ["--use-distributed-optimizer"]


def train_args(save, *extra, iters=ITERS, interval=4):
    return TINY_QWEN3 + ["--train-iters", str(iters), "--save", str(save), "--save-interval", str(interval),
                         "--ckpt-format", "safetensors", *extra]


def global_tensors(checkpoint, model_only=False) -> dict[str, torch.Tensor]:
    from adaptor.checkpoint.consolidated import GlobalTensors

    g = GlobalTensors(checkpoint, model_only=model_only)
    return {name: g.get(name) for name in g.tensors}


def assert_same_tensors(a: dict, b: dict, names=None):
    names = sorted(a) if names is None else names
    assert names, "nothing to compare"
    for name in names:
        assert name in b, f"{name} missing"
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), \
            f"{name} differs (max {(a[name].double() - b[name].double()).abs().max().item():.3e})"


@prefetched
def reference(tmp_path_factory):
    """The uninterrupted DP=2 + distributed-optimizer run, checkpoints at iterations 4 and 8."""
    save = tmp_path_factory.mktemp("reference")
    run = run_pretrain(train_args(save, *DP2_DISTOPT), nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == list(range(1, ITERS + 1)), tail(run.output)
    return save, run


def at_iteration_4(reference_save: Path, directory: Path) -> Path:
    """A --load directory whose tracker names the reference's iteration-4 checkpoint."""
    directory.mkdir()
    (directory / "iter_0000004").symlink_to(reference_save / "iter_0000004")
    (directory / "latest_checkpointed_iteration.txt").write_text("4")
    return directory


def test_checkpoint_files_are_safetensors_and_json_only(reference):
    save, _ = reference
    ckpt = save / "iter_0000004"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["common.json", "common.safetensors", "metadata.json",
                     "rank_00000.safetensors", "rank_00001.safetensors"], names
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "safetensors"
    common = json.loads((ckpt / "common.json").read_text())
    assert common["iteration"] == 4 and common["consumed_train_samples"] == 32
    assert common["parallel"]["data_parallel_size"] == 2 and common["world_size"] == 2
    # Each rank wrote only its own part: the two files split the optimizer state between them
    # and no model tensor is written twice (data-parallel replicas are deduplicated).
    tables = []
    for rank in (0, 1):
        raw = (ckpt / f"rank_0000{rank}.safetensors").read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        tables.append(json.loads(json.loads(raw[8:8 + n])["__metadata__"]["shards"]))
    model = [(e["key"], tuple(e["global_offset"])) for t in tables for e in t if not e["key"].startswith("optimizer.")]
    assert len(model) == len(set(model))
    flat = [e for t in tables for e in t if e["flattened_range"] is not None]
    assert {e["key"].split(".")[2] for e in flat} == {"fp32_param", "exp_avg", "exp_avg_sq"}
    assert all(any(e["flattened_range"] for e in t) for t in tables)
    # Nothing on disk can hold a pickle: a JSON document or a safetensors file (JSON header + raw bytes).
    for path in ckpt.iterdir():
        head = path.read_bytes()[:2]
        assert head != b"\x80\x04" and not head.startswith(b"PK"), path


def test_killed_during_a_save_resumes_from_the_previous_one_bit_exactly(reference, tmp_path):
    """SIGKILL while the iteration-4 save is being written; the iteration-2 checkpoint resumes to the same end."""
    ref_save, ref = reference
    save = tmp_path / "ckpt"
    live = LiveRun(train_args(save, *DP2_DISTOPT, interval=2), nproc=2,
                   env={"STALL_AT_ITERATION": "4"}, script="tests/scripts/pretrain_gpt_stalled_commit.py")
    live.wait_for(r"STALLED .*iter_0000004")
    live.signal(signal.SIGKILL)
    live.finish()
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (save / ".iter_0000004.partial").is_dir()  # the interrupted write, never visible as a checkpoint
    resumed = run_pretrain(train_args(save, *DP2_DISTOPT, "--load", str(save), interval=2), nproc=2)
    assert resumed.returncode == 0, tail(resumed.output)
    assert "loading distributed checkpoint from" in resumed.output and "at iteration 2" in resumed.output
    assert sorted(resumed.losses) == list(range(3, ITERS + 1)), tail(resumed.output)
    assert all(resumed.losses[i] == ref.losses[i] for i in resumed.losses), (resumed.losses, ref.losses)
    assert not (save / ".iter_0000004.partial").exists()
    assert_same_tensors(global_tensors(ref_save / "iter_0000008"), global_tensors(save / "iter_0000008"))


def test_sigterm_with_exit_signal_handler_saves_and_exits(tmp_path):
    save = tmp_path / "ckpt"
    live = LiveRun(train_args(save, "--exit-signal-handler", iters=1000, interval=1000))
    live.wait_for(r"iteration\s+3/")
    live.signal(signal.SIGTERM)
    run = live.finish()
    saved = int((save / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 3 and saved == max(run.losses), tail(run.output)
    assert "exiting program after receiving SIGTERM" in run.output, tail(run.output)
    assert global_tensors(save, model_only=True)


# Loads at another layout: the run loads the reference's iteration-4 checkpoint, trains no further
# (--train-iters 4) and saves again; Megatron writes what it loaded.
LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2_distopt": (2, ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"]),
}  # one process without the distributed optimizer: the FSDP2 and MoE tests below


def reload_and_save(source, target, nproc, layout):
    args = train_args(target, "--load", str(source), "--use-checkpoint-opt_param-scheduler", *layout,
                      iters=4, interval=1000)
    run = run_pretrain(args, nproc=nproc)
    assert run.returncode == 0, tail(run.output)
    return target / "iter_0000004"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpoint_loads_at_another_layout_exactly(reference, tmp_path, layout):
    ref_save, _ = reference
    source = at_iteration_4(ref_save, tmp_path / "source")
    nproc, flags = LAYOUTS[layout]
    expected = global_tensors(ref_save / "iter_0000004")
    got = global_tensors(reload_and_save(source, tmp_path / "resaved", nproc, flags))
    names = [n for n in expected if "fp32_param" not in n or n in got]  # fp32 runs without it keep none
    assert any("exp_avg_sq" in n for n in names) and any(n.startswith("decoder.") for n in names)
    assert_same_tensors(expected, got, names)
    if layout == "tp2":  # and back: TP=2 without the distributed optimizer -> DP=2 with it
        back = global_tensors(reload_and_save(tmp_path / "resaved", tmp_path / "back", 2, DP2_DISTOPT))
        assert_same_tensors(expected, back)


def test_moe_checkpoint_loads_without_expert_parallelism_exactly(tmp_path):
    """DeepSeek-V3-style (MLA, MoE, MTP) at EP=2 with the distributed optimizer -> one process without it.

    Expert weights are stacked along an expert axis split over EP ranks, and the optimizer is chained
    (expert and dense parameters apart); every model and Adam tensor comes back unchanged.
    """
    common = TINY_DEEPSEEK_V3 + ["--ckpt-format", "safetensors", "--train-iters", "2"]
    source = tmp_path / "ep2"
    run = run_pretrain(common + ["--save", str(source), "--save-interval", "2", "--expert-model-parallel-size", "2",
                                 "--use-distributed-optimizer"], nproc=2)
    assert run.returncode == 0, tail(run.output)
    run = run_pretrain(common + ["--load", str(source), "--save", str(tmp_path / "one"), "--save-interval", "1000",
                                 "--use-checkpoint-opt_param-scheduler"])
    assert run.returncode == 0, tail(run.output)
    expected, got = global_tensors(source), global_tensors(tmp_path / "one")
    names = [n for n in expected if "fp32_param" not in n]
    assert any(".local_experts.3." in n for n in names) and any("exp_avg" in n and "experts" in n for n in names)
    assert_same_tensors(expected, got, names)


def test_resharded_run_continues_the_reference_curve(reference, tmp_path):
    """From the DP=2 checkpoint at TP=2: the losses follow the uninterrupted run (optimizer state included).

    TP=2 adds the same numbers in another order, so the curves agree to fp32 rounding (rtol 2e-5, as
    in test_parallel_loss_curves); the same run with --no-load-optim is 8e-3 off at iteration 6.
    """
    ref_save, ref = reference
    source = at_iteration_4(ref_save, tmp_path / "source")
    run = run_pretrain(train_args(tmp_path / "out", "--load", str(source), "--tensor-model-parallel-size", "2"),
                       nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert sorted(run.losses) == [5, 6, 7, 8], tail(run.output)
    worst = max(abs(run.losses[i] - ref.losses[i]) / ref.losses[i] for i in run.losses)
    assert worst <= 2e-5, (run.losses, ref.losses)


def test_async_save_with_retention_matches_the_sync_run(reference, tmp_path):
    """--async-save writes the same checkpoints; --keep-checkpoint-max 2 leaves the newest two."""
    ref_save, ref = reference
    save = tmp_path / "ckpt"
    run = run_pretrain(train_args(save, *DP2_DISTOPT, "--async-save", "--keep-checkpoint-max", "2",
                                  interval=2), nproc=2)
    assert run.returncode == 0, tail(run.output)
    assert run.output.count("scheduled an async checkpoint save") == 4, tail(run.output)
    assert all(run.losses[i] == ref.losses[i] for i in ref.losses), (run.losses, ref.losses)
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000006", "iter_0000008",
                                                       "latest_checkpointed_iteration.txt"]
    assert "--keep-checkpoint-max 2: deleted checkpoint(s) at iteration" in run.output
    assert_same_tensors(global_tensors(ref_save / "iter_0000008"), global_tensors(save / "iter_0000008"))


def test_weights_only_checkpoint(tmp_path):
    """--no-save-optim --no-save-rng: model tensors only (the moe and split tests load such checkpoints)."""
    save = tmp_path / "weights"
    run = run_pretrain(train_args(save, "--no-save-optim", "--no-save-rng", iters=2, interval=2))
    assert run.returncode == 0, tail(run.output)
    from adaptor.checkpoint.reader import CheckpointIndex

    index = CheckpointIndex(save / "iter_0000002")
    assert any(k.startswith("decoder.") for k in index.shards)
    assert not any(k.startswith("optimizer.") for k in index.shards)
    assert not any(k.startswith("rng_state") for k in index.objects)
    assert "opt_param_scheduler" not in index.common_state()


# ---------------------------------------------------------------------------------- FSDP2
def test_fsdp2_resumes_bit_exactly_and_loads_into_ddp_and_back(tmp_path):
    """FSDP2 at DP=2: the DTensor shards resume to the same end; DDP (one process) and FSDP2 read each other's."""
    fsdp2 = ["--use-torch-fsdp2"]
    full = run_pretrain(train_args(tmp_path / "full", *fsdp2), nproc=2)
    assert full.returncode == 0, tail(full.output)
    source = at_iteration_4(tmp_path / "full", tmp_path / "from4")
    resumed = run_pretrain(train_args(tmp_path / "resumed", *fsdp2, "--load", str(source)), nproc=2)
    assert resumed.returncode == 0, tail(resumed.output)
    assert sorted(resumed.losses) == [5, 6, 7, 8] and all(resumed.losses[i] == full.losses[i] for i in resumed.losses)
    assert_same_tensors(global_tensors(tmp_path / "full" / "iter_0000008"),
                        global_tensors(tmp_path / "resumed" / "iter_0000008"))
    expected = global_tensors(tmp_path / "full" / "iter_0000004")
    ddp = reload_and_save(source, tmp_path / "ddp", 1, [])
    assert_same_tensors(expected, global_tensors(ddp))
    back = reload_and_save(tmp_path / "ddp", tmp_path / "back", 2, fsdp2)
    assert_same_tensors(expected, global_tensors(back))


# ---------------------------------------------------------------------------------- bad input
def damaged_copy(reference, tmp_path) -> Path:
    import shutil

    copy = tmp_path / "damaged"
    shutil.copytree(reference[0] / "iter_0000004", copy / "iter_0000004")
    (copy / "latest_checkpointed_iteration.txt").write_text("4")
    return copy


def read_all(checkpoint):
    """What a load reads first: the common state and every rank file's header."""
    from adaptor.checkpoint.reader import CheckpointIndex

    index = CheckpointIndex(checkpoint)
    index.common_state()
    return index.shards


@pytest.mark.parametrize("damage, message", [
    ("truncate", r"rank_00001.safetensors: truncated"),
    ("corrupt_header", r"rank_00001.safetensors: corrupt"),
    ("missing_rank", r"rank_00001.safetensors: missing \(one of the 2 rank files"),
    ("outside_path", r"names a file outside the checkpoint directory \('../../etc/passwd'\)"),
    ("bad_json", r"common.json: not a valid checkpoint description"),
])
def test_damaged_checkpoint_is_named_in_one_error(reference, tmp_path, damage, message):
    from adaptor.checkpoint.errors import CheckpointError

    ckpt = damaged_copy(reference, tmp_path) / "iter_0000004"
    rank1 = ckpt / "rank_00001.safetensors"
    if damage == "truncate":
        rank1.write_bytes(rank1.read_bytes()[:-1000])
    elif damage == "corrupt_header":
        raw = bytearray(rank1.read_bytes())
        raw[8:40] = b"#" * 32
        rank1.write_bytes(bytes(raw))
    elif damage == "missing_rank":
        rank1.unlink()
    else:
        doc = json.loads((ckpt / "common.json").read_text())
        if damage == "outside_path":
            doc["files"][1] = "../../etc/passwd"
            (ckpt / "common.json").write_text(json.dumps(doc))
        else:
            (ckpt / "common.json").write_text(json.dumps(doc)[:-100])
    with pytest.raises(CheckpointError, match=message):
        read_all(ckpt)


def test_mismatched_request_names_file_and_tensor(reference):
    """A model of another shape or precision than the checkpoint's: the error names the tensor."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from adaptor.checkpoint.errors import CheckpointError
    from adaptor.checkpoint.reader import CheckpointIndex

    index = CheckpointIndex(reference[0] / "iter_0000004")
    key = "embedding.word_embeddings.weight"
    for shape, dtype, message in (((512, 128), torch.float32, r"global shape \[512, 64\] in the checkpoint but "
                                                                r"the model expects \[512, 128\]"),
                                  ((512, 64), torch.bfloat16, r"is torch.float32 in the checkpoint but the model "
                                                              r"expects torch.bfloat16")):
        request = ShardedTensor(key, None, dtype, shape, shape, (0, 0), None)
        with pytest.raises(CheckpointError, match=rf"rank_0000[01].safetensors: tensor {key} .*{message}"):
            index.load_tensor(request)


def test_bad_checkpoint_ends_the_run_in_one_line_and_is_left_as_it_was(reference, tmp_path):
    load = damaged_copy(reference, tmp_path)
    rank1 = load / "iter_0000004" / "rank_00001.safetensors"
    rank1.write_bytes(rank1.read_bytes()[:-1000])
    before = {p.name: p.read_bytes() for p in (load / "iter_0000004").iterdir()}
    run = run_pretrain(train_args(load, "--load", str(load)))
    assert run.returncode != 0
    errors = error_lines(run.output)
    assert len(errors) == 1 and "rank_00001.safetensors: truncated" in errors[0], tail(run.output)
    assert {p.name: p.read_bytes() for p in (load / "iter_0000004").iterdir()} == before
    assert (load / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert sorted(p.name for p in load.iterdir()) == ["iter_0000004", "latest_checkpointed_iteration.txt"]


# ---------------------------------------------------------------------------------- merge and split
def tool(*argv):
    """tools/safetensors_ckpt.py as a user runs it: (exit status, output)."""
    proc = run_tool("safetensors_ckpt.py", *argv, cwd=ROOT, timeout=600, env=child_env())
    return proc.returncode, proc.output


def read_merged(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        out.update(load_file(path))
    return out


def test_merge_and_split_round_trip(reference, tmp_path):
    """merge -> whole tensors under Megatron names (sharded into several files); split back -> a release
    checkpoint of the same values; split at TP=2 -> Megatron re-saves it and the values are the same."""
    ref_save, _ = reference
    expected = global_tensors(ref_save / "iter_0000008", model_only=True)
    code, out = tool("merge", "--load-dir", ref_save, "--save-dir", tmp_path / "merged", "--max-shard-size", "200KB")
    assert code == 0, out
    index = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    merged = read_merged(tmp_path / "merged")
    assert "decoder.layers.3.self_attention.linear_qkv.weight" in merged
    assert_same_tensors(expected, merged)
    code, out = tool("split", "--load-dir", tmp_path / "merged", "--save-dir", tmp_path / "release")
    assert code == 0, out
    assert (tmp_path / "release" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert_same_tensors(expected, global_tensors(tmp_path / "release", model_only=True))
    code, out = tool("split", "--load-dir", tmp_path / "merged", "--save-dir", tmp_path / "tp2",
                     "--tensor-model-parallel-size", "2")
    assert code == 0, out
    assert json.loads((tmp_path / "tp2" / "iter_0000000" / "common.json").read_text())["parallel"][
        "tensor_model_parallel_size"] == 2
    assert_same_tensors(expected, global_tensors(tmp_path / "tp2", model_only=True))
    code, out = tool("merge", "--load-dir", ref_save, "--save-dir", tmp_path / "merged")
    assert code == 2 and "exists and is not empty" in out, out


def test_merge_with_hugging_face_names_loads_in_transformers(reference, tmp_path):
    from transformers import AutoModelForCausalLM

    ref_save, _ = reference
    code, out = tool("merge", "--load-dir", ref_save, "--save-dir", tmp_path / "hf", "--model-type-hf", "qwen3")
    assert code == 0, out
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = global_tensors(ref_save / "iter_0000008", model_only=True)
    state = model.state_dict()
    assert torch.equal(state["model.embed_tokens.weight"], ours["embedding.word_embeddings.weight"])
    assert torch.equal(state["model.layers.2.post_attention_layernorm.weight"],
                       ours["decoder.layers.2.mlp.linear_fc1.layer_norm_weight"])
    gate, up = ours["decoder.layers.1.mlp.linear_fc1.weight"].chunk(2)
    assert torch.equal(state["model.layers.1.mlp.gate_proj.weight"], gate)
    assert torch.equal(state["model.layers.1.mlp.up_proj.weight"], up)
