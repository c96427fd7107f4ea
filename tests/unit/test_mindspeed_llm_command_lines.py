"""MindSpeed-LLM's own checkpoint-conversion and data scripts, in this process or failing fast.

``ckpt_convert_qwen3_hf2mcore.sh`` / ``_mcore2hf.sh``'s flags go through tools/convert_ckpt.py and
back bit-exact, and so do ``examples/mcore/mixtral/ckpt_convert_mixtral_hf2mcore.sh``'s (Qwen2.5's:
tests/unit/test_convert_llama_qwen2.py); ``data_convert_qwen3_instruction.sh``'s flags build a fine-tuning dataset with
tools/preprocess_data.py (details: tests/e2e/test_instruction_data.py). MindSpeed-LLM's pretrain
scripts against our own flags, in training runs: tests/e2e/test_mindspeed_llm_command_lines.py; its DPO scripts
through parsing and validation: tests/unit/test_mindspeed_llm_dpo_scripts.py.
"""
from __future__ import annotations

import json

from helpers.hf_fixtures import make_tiny_mixtral, make_tiny_qwen3, make_tiny_qwen3_moe
from helpers.megatron_runs import SAMPLE_TOKENIZER
from helpers.paths import EXAMPLES
from helpers.processes import import_tool, run_tool

TOKENIZER = str(SAMPLE_TOKENIZER)


def test_mindspeed_llm_conversion_scripts(tmp_path, capsys):
    """ckpt_convert_qwen3_hf2mcore.sh / _mcore2hf.sh's flags through tools/convert_ckpt.py, and back bit-exact."""
    convert_ckpt = import_tool("convert_ckpt")
    from safetensors.torch import load_file

    hf = make_tiny_qwen3(tmp_path / "hf", tied=False)
    common = ["--use-mcore-models", "--model-type", "GPT", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec",
              "layer_spec", "--params-dtype", "bf16"]
    to_mg = common + ["--load-model-type", "hf", "--save-model-type", "mg", "--target-tensor-parallel-size", "2",
                      "--target-pipeline-parallel-size", "2", "--target-expert-parallel-size", "1",
                      "--load-dir", str(hf), "--save-dir", str(tmp_path / "mg"),
                      "--tokenizer-model", str(hf / "tokenizer.json"), "--moe-grouped-gemm", "--model-type-hf", "qwen3"]
    assert convert_ckpt.main(to_mg) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "--params-dtype is not applied by the converter" in err and "--model-type GPT (dropped: implied)" in err
    to_hf = common + ["--load-model-type", "mg", "--save-model-type", "hf", "--target-tensor-parallel-size", "1",
                      "--target-pipeline-parallel-size", "1", "--load-dir", str(tmp_path / "mg"),
                      "--save-dir", str(tmp_path / "back"), "--model-type-hf", "qwen3"]
    assert convert_ckpt.main(to_hf) == 0, capsys.readouterr().err
    original, back = load_file(str(hf / "model.safetensors")), {}
    for shard in (tmp_path / "back").glob("*.safetensors"):
        back.update(load_file(str(shard)))
    assert sorted(back) == sorted(original)
    assert all(torch_equal(back[k], original[k]) for k in original)
    # ckpt_convert_qwen3_moe_*.sh: the same flags with --model-type-hf qwen3-moe and EP 2, and back bit-exact.
    moe_hf = make_tiny_qwen3_moe(tmp_path / "moe_hf")
    moe = [a if a != "qwen3" else "qwen3-moe" for a in to_mg]
    moe[moe.index("--load-dir") + 1], moe[moe.index("--save-dir") + 1] = str(moe_hf), str(tmp_path / "moe_mg")
    moe[moe.index("--target-expert-parallel-size") + 1] = "2"
    moe[moe.index("--tokenizer-model") + 1] = str(moe_hf / "config.json")
    assert convert_ckpt.main(moe) == 0, capsys.readouterr().err
    back = [a if a != "qwen3" else "qwen3-moe" for a in to_hf]
    back[back.index("--load-dir") + 1], back[back.index("--save-dir") + 1] = str(tmp_path / "moe_mg"), str(
        tmp_path / "moe_back")
    assert convert_ckpt.main(back + ["--target-expert-parallel-size", "1"]) == 0, capsys.readouterr().err
    original, back_tensors = {}, {}
    for directory, tensors in ((moe_hf, original), (tmp_path / "moe_back", back_tensors)):
        for shard in directory.glob("*.safetensors"):
            tensors.update(load_file(str(shard)))
    assert sorted(back_tensors) == sorted(original)
    assert all(torch_equal(back_tensors[k], original[k]) for k in original)
    # A family we do not convert: one line, nothing written.
    other = [a if a != "qwen3" else "chatglm3" for a in to_mg]
    other[other.index("--save-dir") + 1] = str(tmp_path / "other")
    assert convert_ckpt.main(other) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "convert_ckpt.py: error: --model-type-hf chatglm3: Hugging Face conversion supports deepseek3, ")
    assert not (tmp_path / "other").exists()


def test_mindspeed_llm_mixtral_conversion_script(tmp_path, capsys):
    """ckpt_convert_mixtral_hf2mcore.sh's flags (TP 8 -> 2; its tokenizer.model -> the directory's config.json,
    as a tokenizer file the converter does not read) through tools/convert_ckpt.py, and back bit-exact."""
    convert_ckpt = import_tool("convert_ckpt")
    from safetensors.torch import load_file

    hf = make_tiny_mixtral(tmp_path / "hf")
    to_mg = ["--model-type", "GPT", "--moe-grouped-gemm", "--load-model-type", "hf", "--save-model-type", "mg",
             "--params-dtype", "bf16", "--target-tensor-parallel-size", "2", "--target-pipeline-parallel-size", "1",
             "--target-expert-parallel-size", "1", "--load-dir", str(hf), "--save-dir", str(tmp_path / "mg"),
             "--tokenizer-model", str(hf / "config.json"), "--use-mcore-models", "--model-type-hf", "mixtral"]
    assert convert_ckpt.main(to_mg) == 0, capsys.readouterr().err
    assert "--moe-grouped-gemm is not applied by the converter" in capsys.readouterr().err
    to_hf = ["--use-mcore-models", "--model-type", "GPT", "--model-type-hf", "mixtral", "--load-model-type", "mg",
             "--save-model-type", "hf", "--target-tensor-parallel-size", "1", "--target-pipeline-parallel-size", "1",
             "--load-dir", str(tmp_path / "mg"), "--save-dir", str(tmp_path / "back")]
    assert convert_ckpt.main(to_hf) == 0, capsys.readouterr().err
    original, back = {}, {}
    for directory, tensors in ((hf, original), (tmp_path / "back", back)):
        for shard in directory.glob("*.safetensors"):
            tensors.update(load_file(str(shard)))
    assert sorted(back) == sorted(original) and any(".experts." in k for k in original)
    assert all(torch_equal(back[k], original[k]) for k in original)


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a, b)


def test_instruction_preprocessing_script(tmp_path):
    """data_convert_qwen3_instruction.sh's flags (with --overwrite-cache) build MindSpeed-LLM's three datasets."""
    proc = run_tool("preprocess_data.py", "--input", EXAMPLES / "data" / "sample_instructions.jsonl",
                    "--tokenizer-name-or-path", TOKENIZER, "--output-prefix", tmp_path / "alpaca",
                    "--handler-name", "AlpacaStyleInstructionHandler", "--tokenizer-type", "PretrainedFromHF",
                    "--workers", "4", "--log-interval", "1000", "--enable-thinking", "true", "--prompt-type", "qwen3",
                    "--overwrite-cache", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "error" not in proc.stderr and "--overwrite-cache is not applied here" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"alpaca_packed_{f}_document{ext}" for f in ("input_ids", "labels", "attention_mask")
         for ext in (".bin", ".idx")] + ["alpaca_packed_meta.json"])
    meta = json.loads((tmp_path / "alpaca_packed_meta.json").read_text())
    assert meta["prompt_type"] == "qwen3" and meta["enable_thinking"] is True
    assert meta["counts"]["conversations"] == 300 and meta["counts"]["bad_records_skipped"] == 0


def test_mindspeed_context_parallel_switches_become_megatrons():
    """--context-parallel-algo and its companions map onto --cp-comm-type (and hierarchical sizes), or fail in one line."""
    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv

    def rewrite(*flags):
        return rewrite_pretrain_argv(["--context-parallel-size", "4", *flags])

    def value(argv, flag):
        i = argv.index(flag)
        return argv[i + 1:i + 3] if flag == "--hierarchical-context-parallel-sizes" else argv[i + 1]

    for algo, comm in (("megatron_cp_algo", "p2p"), ("ulysses_cp_algo", "a2a")):
        r = rewrite("--context-parallel-algo", algo, "--use-cp-send-recv-overlap")
        assert r.refused == [] and value(r.argv, "--cp-comm-type") == comm, r
        assert "--context-parallel-algo" not in r.argv and "--use-cp-send-recv-overlap" not in r.argv
        assert any("--use-cp-send-recv-overlap is not applied" in n for n in r.notes), r.notes
    r = rewrite("--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp", "2",
                "--cp-attention-mask-type", "causal")
    assert r.refused == [], r
    assert value(r.argv, "--cp-comm-type") == "a2a+p2p"
    assert value(r.argv, "--hierarchical-context-parallel-sizes") == ["2", "2"]
    assert "--ulysses-degree-in-cp" not in r.argv and "--cp-attention-mask-type" not in r.argv
    r = rewrite("--context-parallel-algo", "megatron_cp_algo", "--cp-attention-mask-type", "general")
    assert r.refused == [] and "--cp-attention-mask-type" not in r.argv, r
    assert any(n.startswith("--cp-attention-mask-type general: ") for n in r.notes), r.notes
    for flags, words in (
        (("--context-parallel-algo", "hybrid_cp_algo"), "needs --ulysses-degree-in-cp K"),
        (("--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp", "3"), "dividing --context-parallel-size 4"),
        (("--context-parallel-algo", "ring_algo"), "is not one of megatron_cp_algo"),
        (("--context-parallel-algo", "megatron_cp_algo", "--cp-attention-mask-type", "band"), "causal, general"),
        (("--ulysses-degree-in-cp", "2"), "needs --context-parallel-algo hybrid_cp_algo"),
    ):
        r = rewrite(*flags)
        assert len(r.refused) == 1 and words in r.refused[0], (flags, r.refused)


def test_sparse_mode_is_dropped_with_its_value_and_noted():
    """Llama 3.1's scripts pass --sparse-mode 4, which Megatron's parser does not know: it goes with its value."""
    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv

    r = rewrite_pretrain_argv(["--sparse-mode", "4", "--seq-length", "64"])
    assert r.refused == [] and r.argv == ["--seq-length", "64"], r
    assert any(n.startswith("--sparse-mode is not applied") for n in r.notes), r.notes
