"""Hugging Face checkpoints in Megatron: logits equal transformers', and online load/save in training.

Tiny random Qwen3ForCausalLM (tied and untied), DeepseekV3ForCausalLM (MLA + MoE + MTP), LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, Qwen2_5_VLForConditionalGeneration and
Qwen3VLForConditionalGeneration from tests/helpers/hf_fixtures.py, saved by transformers as the Hub publishes them:

* tools/check_hf_parity.py (torchrun, gloo) computes Megatron's logits at TP1/PP1, TP2/PP2,
  TP2/PP2/EP2 and PP2 with two virtual stages each, and compares them with transformers' (fp32, eager attention);
  Qwen2.5-VL and Qwen3-VL (pretrain_mm.py's model, images in the batch) at TP2 and at PP2, both models in one
  launch of the tool per layout (--also-hf-dir: one torchrun, the second model built in the same processes);
* pretrain_gpt.py --hf-load-dir trains from the HF weights (the same losses as a run that
  --load's the offline-converted checkpoint), and --hf-save-dir writes a directory that
  transformers loads and whose tensors are the Megatron weights at the end, and whose failure (on
  any rank) is one line that leaves nothing behind;
* without model flags, --hf-load-dir takes the architecture from config.json (listed at start; the
  same losses as every flag given); a config.json that does not match a flag given is one line naming
  the flag, whether it comes with --hf-load-dir or inside a checkpoint tools/convert_ckpt.py wrote
  (RoPE scaling included);
* Qwen3 with YaRN ``rope_scaling`` (transformers' default attention factor, and an explicit one
  with other betas) and with linear position interpolation has transformers' logits;
* Llama 3 (rope_type llama3, untied) and Qwen2.5 (q/k/v bias, tied) have transformers' logits at TP1 and
  TP2/PP2, Qwen2.5 with a PEFT adapter has peft's, and a Llama 3 run at TP2 from --hf-load-dir trains the
  curve of one process that --load's the offline conversion.

That the scaling changes transformers' logits at all, and the parity tool's bad input:
tests/unit/test_hf_parity.py.
"""
from __future__ import annotations

import json
import math
import re

import pytest
import torch

from helpers.megatron_runs import ROOT, TwoAtATime, run_pretrain, side_by_side, tail, worst_relative_gap
from helpers.one_line_errors import child_frames
from helpers.processes import child_env, run_tool

# Measured max abs logit differences are 0.8e-6 to 1.0e-6 with logits up to 1.8 (fp32: the sums
# run in a different order — fused QKV, TP-split matmuls, vocab-parallel output). 1e-4 is the
# bound we hold conversions to; a wrong mapping or semantic (rope layout, yarn mscale, router scaling, a swapped
# tensor) gives differences of 1e-2 or more on these random weights.
LOGIT_BOUND = 1e-4
# Runs of the same layout and data compute the same float operations in the same order: the loss
# curves of two ways of loading the same weights agree to print precision (7 digits).
SAME_RUN_RTOL = 1e-6

_DIFF = re.compile(r"max abs logit difference ([0-9.eE+-]+)")


def parity(hf_dir, *extra):
    proc = run_tool("check_hf_parity.py", "--hf-dir", hf_dir, *extra, cwd=ROOT, timeout=900, env=child_env())
    found = _DIFF.search(proc.stdout)
    assert found, tail(proc.stdout + proc.stderr)
    return proc.returncode, float(found.group(1)), proc.stdout.strip()


# The one-process checks (no --tp/--pp/--ep) keep one core busy each: they start together, two at a
# time, when the first of them is asked for, and each test waits for its own; the others run in their test.
ONE_PROCESS = [("qwen3_tied", ("--tolerance", "0")), ("deepseek_v3", ()), ("qwen3_yarn_factor", ()), ("qwen3_linear", ()),
               ("llama_untied", ()), ("qwen3_moe", ()), ("mixtral", ())]
# Qwen2 at one process with a PEFT adapter on all seven projections (peft's logits; the base weights are in them)
QWEN2_LORA = "qwen2_tied+lora"


# Qwen2.5-VL and Qwen3-VL at one layout: one launch of the tool checks both (--also-hf-dir).
VL_FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="module")
def vl_parity(hf_dirs):
    """layout -> (exit code, {family: its line}) of the tool run once over both Qwen-VL directories."""
    runs = {}

    def result(layout: tuple) -> tuple[int, dict]:
        if layout not in runs:
            proc = run_tool("check_hf_parity.py", "--hf-dir", hf_dirs[VL_FAMILIES[0]], "--also-hf-dir",
                            hf_dirs[VL_FAMILIES[1]], *layout, cwd=ROOT, timeout=900, env=child_env())
            lines = {family: line for line in proc.stdout.splitlines() for family in VL_FAMILIES
                     if line.startswith(f"check_hf_parity.py: {family} ")}
            assert sorted(lines) == sorted(VL_FAMILIES), tail(proc.stdout + proc.stderr)
            runs[layout] = proc.returncode, lines
        return runs[layout]

    return result


@pytest.fixture(scope="module")
def one_process_parity(hf_dirs, tmp_path_factory):
    from helpers.hf_fixtures import make_peft_adapter

    dirs = {case: hf_dirs[case[0]] for case in ONE_PROCESS}  # written here, in this thread
    adapter = make_peft_adapter(hf_dirs["qwen2_tied"], tmp_path_factory.mktemp("qwen2_lora") / "adapter", r=4,
                                alpha=8, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                  "down_proj"])
    jobs = {case: (lambda case=case: parity(dirs[case], *case[1])) for case in ONE_PROCESS}
    jobs[QWEN2_LORA] = lambda: parity(hf_dirs["qwen2_tied"], "--lora-dir", adapter)
    pool = TwoAtATime()
    yield pool.start(jobs)
    pool.close()


@pytest.mark.parametrize("name,layout", [
    # With --tolerance 0 the tool must also report its own failure: exit 1 and "FAILED" as soon as
    # fp32 rounding leaves any difference (measured: 1e-6 here).
    ("qwen3_tied", ["--tolerance", "0"]),
    ("qwen3_tied", ["--tp", "2", "--pp", "2"]),       # the tied output layer copy on the last stage
    ("qwen3_untied", ["--tp", "2", "--pp", "2"]),
    ("deepseek_v3", []),
    ("deepseek_v3", ["--tp", "2", "--pp", "2", "--ep", "2"]),  # 4 processes, expert tensor parallel 1
    ("qwen3_yarn", ["--tp", "2"]),
    ("qwen3_yarn_factor", []),
    ("qwen3_linear", []),
    ("llama_untied", []),                             # Llama 3: rope_type llama3 (--use-rope-scaling)
    ("llama_untied", ["--tp", "2", "--pp", "2"]),
    ("qwen2_tied", ["--tp", "2", "--pp", "2"]),       # q/k/v bias split by query group, tied output copy
    # Qwen3-MoE (norm_topk_prob false, a dense layer on the second stage) and Mixtral: one process, and TP2, PP2
    # and EP2 in one run each; Mixtral with a LoRA adapter: tests/e2e/test_moe_families.py.
    ("qwen3_moe", []),
    ("mixtral", []),
    ("qwen3_moe", ["--tp", "2", "--pp", "2", "--ep", "2"]),
    ("mixtral", ["--tp", "2", "--pp", "2", "--ep", "2"]),
    # interleaved schedule: two virtual stages of one layer per pipeline rank, the tied output copy in the last
    ("qwen3_tied", ["--pp", "2", "--vpp", "2"]),
    # Qwen2.5-VL and Qwen3-VL (deepstack features added after decoder layer 0, q/k RMSNorm, interleaved M-RoPE,
    # untied output), two images of different sizes in a sample: the tower's heads split over TP, the tower on
    # stage 0; both families in one launch per layout
    ("qwen2_5_vl", ["--tp", "2"]),
    ("qwen3_vl", ["--tp", "2"]),
    ("qwen2_5_vl", ["--pp", "2"]),
    ("qwen3_vl", ["--pp", "2"]),
])
def test_logits_match_transformers(hf_dirs, one_process_parity, vl_parity, name, layout):
    started = one_process_parity.get((name, tuple(layout)))
    if name in VL_FAMILIES:
        code, lines = vl_parity(tuple(layout))
        line = lines[name]
        diff = float(_DIFF.search(line).group(1))
    else:
        code, diff, line = started.result() if started else parity(hf_dirs[name], *layout)
    print(line)
    assert diff <= LOGIT_BOUND, line
    if "--tolerance" in layout and diff > 0:
        assert code == 1 and line.endswith("FAILED"), line
    else:
        assert code == 0 and line.endswith("ok"), line


def test_qwen2_peft_adapter_gives_peft_logits(one_process_parity):
    code, diff, line = one_process_parity[QWEN2_LORA].result()
    print(line)
    assert code == 0 and line.endswith("ok") and diff <= LOGIT_BOUND, line
    moves = float(re.search(r"moves logits by up to ([0-9.eE+-]+)", line).group(1))
    assert moves > 100 * LOGIT_BOUND, line  # the adapter's own effect, far above the bound


# ----------------------------------------------------------------------------- training
def model_flags(hf_dir, model_type):
    import adaptor  # noqa: F401  (before patches: it registers them)
    from adaptor.convert.config_check import model_flags as flags

    return flags(model_type, json.loads((hf_dir / "config.json").read_text()))


TRAIN = ["--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "3",
         "--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--clip-grad", "1.0",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234", "--log-interval", "1",
         "--eval-iters", "0", "--eval-interval", "100000", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2", "--ckpt-format", "torch"]


def rank_files(checkpoint):
    tracker = (checkpoint / "latest_checkpointed_iteration.txt").read_text().strip()
    step = "release" if tracker == "release" else f"iter_{int(tracker):07d}"
    return sorted((checkpoint / step).glob("mp_rank_*/model_optim_rng.pt"))


def test_deepseek_v3_trains_from_hf_dir_and_saves_one(hf_dirs, tmp_path):
    """EP=2 on 2 processes: --hf-load-dir equals --load of the offline conversion; --hf-save-dir equals --save."""
    from adaptor.convert import HfCheckpoint, Layout, convert_hf_to_megatron, megatron_rank_tensors

    source = hf_dirs["deepseek_v3"]
    flags = model_flags(source, "deepseek3") + TRAIN
    # The online run gives no model flag: the architecture comes from config.json, and the offline
    # run below, with every flag given, computes the same losses.
    online = run_pretrain(TRAIN + ["--hf-load-dir", str(source), "--hf-save-dir", str(tmp_path / "hf_out"),
                                   "--save", str(tmp_path / "ckpt"), "--save-interval", "1000"], nproc=2)
    assert online.returncode == 0, tail(online.output)
    assert "from Hugging Face directory" in online.output
    banner = f"[megatron-adaptor] --hf-load-dir {source}: architecture from its config.json: "
    derived = next(line for line in online.output.splitlines() if line.startswith(banner))[len(banner):]
    assert derived == " ".join(model_flags(source, "deepseek3")), derived

    # The offline conversion, --load'ed as a fine-tuning start; --hf-load-dir names other weights,
    # so equal losses also show that an existing --load checkpoint wins over --hf-load-dir.
    offline_dir = convert_hf_to_megatron(source, tmp_path / "offline", "deepseek3", Layout(ep=2),
                                         save_format="torch")
    offline = run_pretrain(flags + ["--load", str(offline_dir), "--finetune",
                                    "--hf-load-dir", str(hf_dirs["deepseek_v3_other"])], nproc=2)
    assert offline.returncode == 0, tail(offline.output)
    assert "resuming from it, not from --hf-load-dir" in offline.output
    assert len(online.losses) == 3 and sorted(online.losses) == sorted(offline.losses)
    for it, loss in online.losses.items():
        assert math.isclose(loss, offline.losses[it], rel_tol=SAME_RUN_RTOL), (online.curve(), offline.curve())
    assert online.mtp_losses == pytest.approx(offline.mtp_losses, rel=SAME_RUN_RTOL)

    # --hf-save-dir: transformers loads it; mapped back to each rank it is exactly what --save holds.
    from transformers import AutoModelForCausalLM

    saved = HfCheckpoint(tmp_path / "hf_out")
    AutoModelForCausalLM.from_pretrained(tmp_path / "hf_out", dtype=torch.float32)
    files = rank_files(tmp_path / "ckpt")
    assert len(files) == 2  # mp_rank_00_000, mp_rank_00_001 (EP ranks)
    for ep_rank, file in enumerate(files):
        state = torch.load(file, map_location="cpu", weights_only=False)["model"]
        compared = 0
        for name, tensor in megatron_rank_tensors(saved, "deepseek3", Layout(ep=2), 0, 0, ep_rank,
                                                  padded_vocab_size=state["embedding.word_embeddings.weight"].shape[0]):
            assert torch.equal(tensor, state[name]), f"{name} (EP rank {ep_rank})"
            compared += 1
        assert compared == sum(1 for n in state if not n.endswith("_extra_state"))
    original = HfCheckpoint(source)
    assert not torch.equal(saved.get("model.embed_tokens.weight"), original.get("model.embed_tokens.weight"))
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.parametrize("fail_at", ["rank1", "writer"])
def test_hf_save_dir_failure_is_one_line_and_leaves_nothing(hf_dirs, tmp_path, fail_at):
    """TP=2: a rank that cannot hand its state over, or rank 0's writer failing after the last shard, ends the
    run in one line, with nothing at --hf-save-dir or beside it; the ranks handed their states over as
    safetensors, not pickles."""
    source, out = hf_dirs["qwen3_tied"], tmp_path / "out" / "hf"
    out.parent.mkdir()
    flags = model_flags(source, "qwen3") + TRAIN[:-6] + ["--train-iters", "1", "--tensor-model-parallel-size", "2"]
    run = run_pretrain(flags + ["--hf-load-dir", str(source), "--hf-save-dir", str(out)], nproc=2,
                       env={"FAIL_AT": fail_at}, script="tests/scripts/pretrain_gpt_failing_hf_save.py")
    assert run.returncode != 0, tail(run.output)
    who = "rank 1: " if fail_at == "rank1" else ""
    assert run.error_lines() == [f"megatron-adaptor: error: --hf-save-dir {out}: {who}OSError: No space left on "
                                 f"device (injected)"], tail(run.output)
    assert child_frames(run.output) == [], tail(run.output)
    assert list((tmp_path / "out").iterdir()) == []
    if fail_at == "writer":
        handed_over = json.loads(next(line for line in run.output.splitlines() if line.startswith("HANDOVER "))[9:])
        assert handed_over == ["mp_rank_00/model.safetensors", "mp_rank_01/model.safetensors"], handed_over


def test_hf_load_dir_run_saves_safetensors_unless_told(hf_dirs, tmp_path):
    """--hf-load-dir with --save and no --ckpt-format: the checkpoints hold no pickle."""
    from adaptor.checkpoint.files import is_safetensors_checkpoint

    run = run_pretrain(TRAIN[:-6] + ["--hf-load-dir", str(hf_dirs["qwen3_tied"]), "--save", str(tmp_path / "ckpt"),
                                     "--save-interval", "3"])  # the architecture from config.json
    assert run.returncode == 0, tail(run.output)
    assert "architecture from its config.json: --num-layers 4 --hidden-size 64" in run.output, tail(run.output)
    assert "--save checkpoints use --ckpt-format safetensors" in run.output, tail(run.output)
    assert is_safetensors_checkpoint(tmp_path / "ckpt" / "iter_0000003")
    assert not [p for p in (tmp_path / "ckpt").rglob("*") if p.suffix in (".pt", ".distcp")]


def test_config_mismatch_names_the_flag(hf_dirs, tmp_path):
    flags = model_flags(hf_dirs["qwen3_tied"], "qwen3")
    flags[flags.index("--num-query-groups") + 1] = "4"
    run = run_pretrain(flags + TRAIN[:-6] + ["--hf-load-dir", str(hf_dirs["qwen3_tied"]),
                                             "--hf-save-dir", str(tmp_path / "out")], nproc=1)
    errors = [line for line in run.output.splitlines() if "error:" in line]
    assert run.returncode != 0
    assert errors == [f"megatron-adaptor: error: --hf-load-dir {hf_dirs['qwen3_tied']}: config.json does not match "
                      f"the command line: --num-query-groups (--group-query-attention) is 4 on the command line "
                      f"but 2 in the Hugging Face config"], tail(run.output)
    assert child_frames(run.output) == [], tail(run.output)
    assert not (tmp_path / "out").exists()


def test_converted_checkpoint_refuses_flags_without_its_rope_scaling(hf_dirs, tmp_path):
    """YaRN is not in any tensor's shape: a --load of the converted checkpoint with plain RoPE flags is one line."""
    from adaptor.convert import Layout, convert_hf_to_megatron

    converted = convert_hf_to_megatron(hf_dirs["qwen3_yarn"], tmp_path / "mg", "qwen3", Layout(), save_format="torch")
    flags = model_flags(hf_dirs["qwen3_tied"], "qwen3")  # the same architecture, plain RoPE
    run = run_pretrain(flags + TRAIN[:-6] + ["--load", str(converted), "--ckpt-format", "torch",
                                             "--no-load-optim", "--no-load-rng", "--finetune"])
    assert run.returncode != 0
    errors = [line for line in run.output.splitlines() if "error:" in line]
    assert errors == [f"megatron-adaptor: error: --load {converted}: --position-embedding-type is 'rope' on the "
                      f"command line but 'yarn' in the Hugging Face config ({converted / 'hf' / 'config.json'}); "
                      f"change the flag, or convert again"], tail(run.output)


# family: (HF_MODELS entry, --model-type-hf, what sets it apart and must survive the save)
DENSE_FAMILIES = {"llama": ("llama_untied", "llama2"), "qwen2": ("qwen2_untied", "qwen2")}


@pytest.mark.parametrize("family", DENSE_FAMILIES)
def test_tp2_curve_from_hf_dir_reproduces_the_converted_one_process_curve(hf_dirs, tmp_path, family):
    """Llama 3 (untied, llama3 RoPE) and Qwen2.5 (untied, q/k/v bias, sequence parallel):
    pretrain_gpt.py --hf-load-dir at TP2 trains the loss curve of one process that --load's the offline
    conversion, and its --hf-save-dir loads in transformers with the trained weights."""
    from transformers import AutoModelForCausalLM

    from adaptor.convert import HfCheckpoint, Layout, convert_hf_to_megatron

    entry, model_type = DENSE_FAMILIES[family]
    source, out = hf_dirs[entry], tmp_path / "hf_out"
    flags = model_flags(source, model_type) + TRAIN[:-6] + ["--train-iters", "5"]
    converted = convert_hf_to_megatron(source, tmp_path / "mg", model_type, Layout())
    tp2_flags = ["--tensor-model-parallel-size", "2"] + (["--sequence-parallel"] if family == "qwen2" else [])
    single, tp2 = side_by_side(
        lambda: run_pretrain(flags + ["--load", str(converted), "--finetune", "--ckpt-format", "torch"]),
        lambda: run_pretrain(flags + tp2_flags + ["--hf-load-dir", str(source), "--hf-save-dir", str(out)], nproc=2))
    for run in (single, tp2):
        assert run.returncode == 0, tail(run.output)
    assert "successfully loaded checkpoint" in single.output and "from Hugging Face directory" in tp2.output
    assert len(single.losses) == 5 and sorted(tp2.losses) == sorted(single.losses)
    # TP2 adds the same numbers in another order: fp32 rounding (as tests/e2e/test_parallel_loss_curves.py).
    assert worst_relative_gap(tp2.curve(), single.curve()) < 2e-5, (tp2.curve(), single.curve())
    assert single.curve()[-1] < single.curve()[0], single.curve()

    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    if family == "llama":
        assert saved.config.model_type == "llama" and saved.config.rope_parameters["rope_type"] == "llama3"
    else:  # the q/k/v biases trained at TP2 come back under their names, and transformers reads them
        assert saved.config.model_type == "qwen2"
        written, original = HfCheckpoint(out), HfCheckpoint(source)
        for name in ("model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"):
            assert not torch.equal(written.get(name), original.get(name)), name
        assert torch.equal(saved.model.layers[1].self_attn.k_proj.bias, written.get("model.layers.1.self_attn.k_proj.bias"))


def test_hf_save_dir_from_flags_takes_the_vocabulary_from_the_tokenizer(tmp_path):
    """No --hf-load-dir and a Hugging Face tokenizer (MindSpeed-LLM's PretrainedFromHF spelling): the vocabulary
    is known once Megatron builds the tokenizer, after validation; config.json gets the padded size, and the
    tokenizer's files are written beside it."""
    from safetensors import safe_open

    from helpers.megatron_runs import SAMPLE_TOKENIZER, TINY_QWEN3_MODEL

    out = tmp_path / "hf_out"
    run = run_pretrain(TINY_QWEN3_MODEL + ["--mock-data", "--tokenizer-type", "PretrainedFromHF", "--tokenizer-model",
                                           str(SAMPLE_TOKENIZER), "--train-iters", "2", "--hf-save-dir", str(out),
                                           "--model-type-hf", "qwen3"])
    assert run.returncode == 0, tail(run.output)
    padded = int(re.search(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)", run.output)[1])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["vocab_size"] == padded
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [padded, 64]
    # the run's tokenizer comes along, so the directory loads whole (transformers' AutoTokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (SAMPLE_TOKENIZER / name).read_bytes(), name
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.decode(tokenizer("a b")["input_ids"]) == "a b"
