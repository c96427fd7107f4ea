"""MindSpeed-LLM's own checkpoint-conversion and data scripts, in this process or failing fast.

``ckpt_convert_qwen3_hf2mcore.sh`` / ``_mcore2hf.sh``'s flags go through tools/convert_ckpt.py and
back bit-exact; ``data_convert_qwen3_instruction.sh`` asks tools/preprocess_data.py for a fine-tuning
dataset and is refused in one line. MindSpeed-LLM's pretrain scripts against our own flags, in
training runs: tests/e2e/test_mindspeed_llm_command_lines.py.
"""
from __future__ import annotations

from helpers.hf_fixtures import make_tiny_qwen3
from helpers.megatron_runs import SAMPLE_CORPUS, SAMPLE_TOKENIZER
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
    # Qwen3-MoE's Hugging Face layout is not one we convert: one line, nothing written.
    moe = [a if a != "qwen3" else "qwen3-moe" for a in to_mg]
    moe[moe.index("--save-dir") + 1] = str(tmp_path / "moe")
    assert convert_ckpt.main(moe) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "convert_ckpt.py: error: --model-type-hf qwen3-moe: Hugging Face conversion supports deepseek3, qwen3")
    assert not (tmp_path / "moe").exists()


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and torch.equal(a, b)


def test_instruction_preprocessing_is_one_line(tmp_path):
    """data_convert_qwen3_instruction.sh asks for a fine-tuning dataset: refused in one line, nothing written."""
    proc = run_tool("preprocess_data.py", "--input", SAMPLE_CORPUS, "--tokenizer-name-or-path", TOKENIZER,
                    "--output-prefix", tmp_path / "alpaca", "--handler-name", "AlpacaStyleInstructionHandler",
                    "--tokenizer-type", "PretrainedFromHF", "--workers", "4", "--log-interval", "1000",
                    "--prompt-type", "qwen3", timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "preprocess_data.py: error: --prompt-type (MindSpeed-LLM): instruction datasets are not built by this tool "
        "(pretraining text only)"]
    assert list(tmp_path.iterdir()) == []
