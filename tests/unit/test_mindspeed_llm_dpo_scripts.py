"""MindSpeed-LLM's DPO launch scripts, in this process: their flags run here and build the model they name.

``examples/mcore/qwen3_moe/dpo_qwen3_30b_a3b_4K_A3_ptd.sh`` and ``examples/mcore/llama31/dpo_llama31_8b_8k_ptd.sh``
as published, every flag kept in the scripts' order, sizes scaled to tiny models (layers, hidden, heads,
groups, FFN, experts, sequence, batch; the vocabulary to the sample tokenizer's; the parallel sizes stay,
with WORLD_SIZE to match) and paths pointed at this test's files (a pairwise dataset built by
tools/preprocess_data.py from the sample pairs). Each command line goes through what ``posttrain_gpt.py`` does before training: our
rewrite of MindSpeed-LLM's flags (nothing refused; the flags that change nothing computed each print a
line), then Megatron's parser and validation with this backend's features set up for that command line
(an unknown flag, a refused combination or a failed Megatron assertion ends the run in one line). The
arguments then describe a DPO run on pairwise data, and the model they build is the one a tiny
Hugging Face config of the family describes (``config_mismatch`` is None, as ``--hf-load-dir`` checks).
"""
from __future__ import annotations

import contextlib
import shutil
import sys

import pytest

from helpers.paths import EXAMPLES, SAMPLE_TOKENIZER
from helpers.processes import import_tool

TOKENIZER = str(SAMPLE_TOKENIZER)


def qwen3_moe_dpo(data, load):
    """dpo_qwen3_30b_a3b_4K_A3_ptd.sh: TP 2, PP 4, CP 2 (16 ranks), 48 -> 4 layers, 128 -> 8 experts."""
    tune = ["--finetune", "--stage", "dpo", "--dpo-loss-type", "sigmoid", "--is-pairwise-dataset",
            "--tokenizer-not-use-fast", "--prompt-type", "qwen3"]
    gpt = ["--use-mcore-models", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
           "--kv-channels", "32", "--qk-layernorm", "--norm-topk-prob", "--tokenizer-name-or-path", TOKENIZER,
           "--max-position-embeddings", "64", "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "96",
           "--num-attention-heads", "4", "--tokenizer-type", "PretrainedFromHF", "--make-vocab-size-divisible-by",
           "1", "--padded-vocab-size", "1536", "--rotary-base", "1000000", "--untie-embeddings-and-output-weights",
           "--disable-bias-linear", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
           "--attention-softmax-in-fp32", "--no-gradient-accumulation-fusion", "--group-query-attention",
           "--num-query-groups", "2"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    moe = ["--num-experts", "8", "--moe-router-topk", "2", "--moe-intermediate-size", "24", "--moe-grouped-gemm",
           "--moe-token-dispatcher-type", "alltoall_seq", "--moe-router-load-balancing-type", "aux_loss",
           "--moe-layer-freq", "-1", "--first-k-dense-replace", "-1", "--moe-aux-loss-coeff", "0.001"]
    output = ["--log-interval", "1", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "0",
              "--no-load-optim", "--no-load-rng", "--no-save-optim", "--no-save-rng"]
    optimize = ["--use-flash-attn", "--use-fused-rotary-pos-emb", "--sequence-parallel",
                "--use-rotary-position-embeddings", "--use-fused-swiglu", "--use-fused-rmsnorm",
                "--no-masked-softmax-fusion", "--use-distributed-optimizer"]
    train = ["--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "5e-8", "--lr-decay-style", "cosine",
             "--min-lr", "0", "--weight-decay", "0.0", "--lr-warmup-fraction", "0.01", "--attention-dropout", "0.0",
             "--init-method-std", "0.01", "--hidden-dropout", "0.0", "--clip-grad", "1.0", "--adam-beta1", "0.9",
             "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--seed", "42", "--bf16", "--train-iters", "4",
             "--seq-length", "64", "--no-shared-storage"]
    parallel = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
                "--context-parallel-size", "2", "--context-parallel-algo", "megatron_cp_algo",
                "--cp-attention-mask-type", "general", "--use-cp-send-recv-overlap", "--no-pad-to-seq-lengths",
                "--pad-to-multiple-of", "4"]
    memory = ["--swap-attention", "--recompute-granularity", "full", "--recompute-method", "block",
              "--recompute-num-layers", "1"]
    return (tune + gpt + data_args + moe + output + optimize + train + parallel + memory
            + ["--load", load, "--distributed-backend", "nccl"])


def llama31_dpo(data, load, save):
    """dpo_llama31_8b_8k_ptd.sh: TP 2, PP 4 (8 ranks), 32 -> 4 layers."""
    gpt = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4", "--use-mcore-models",
           "--micro-batch-size", "1", "--global-batch-size", "8", "--sequence-parallel", "--use-flash-attn",
           "--use-rotary-position-embeddings", "--use-fused-rmsnorm", "--use-fused-swiglu",
           "--rope-scaling-type", "llama3", "--rope-scaling-factor", "8.0", "--low-freq-factor", "1.0",
           "--high-freq-factor", "4.0", "--original-max-position-embeddings", "8192",
           "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", TOKENIZER, "--num-layers", "4",
           "--hidden-size", "64", "--ffn-hidden-size", "160", "--num-attention-heads", "8",
           "--group-query-attention", "--num-query-groups", "2", "--seq-length", "64",
           "--max-position-embeddings", "64", "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1536",
           "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-dropout", "0.0",
           "--init-method-std", "0.01", "--hidden-dropout", "0.0", "--position-embedding-type", "rope",
           "--rotary-base", "500000", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
           "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--lr", "1.25e-6", "--train-iters", "4",
           "--lr-decay-style", "cosine", "--min-lr", "1.25e-7", "--weight-decay", "1e-1",
           "--lr-warmup-fraction", "0.1", "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
           "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion", "--finetune", "--bf16"]
    data_args = ["--data-path", data, "--split", "100,0,0", "--prompt-type", "llama3", "--is-instruction-dataset",
                 "--variable-seq-lengths"]
    output = ["--log-interval", "1", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "0"]
    rl = ["--stage", "dpo", "--dpo-loss-type", "sigmoid", "--is-pairwise-dataset"]
    return gpt + data_args + output + rl + ["--distributed-backend", "nccl", "--load", load, "--save", save]


def qwen3_moe_config() -> dict:
    from transformers import Qwen3MoeConfig

    # every layer MoE (--moe-layer-freq -1 --first-k-dense-replace -1), top-k weights renormalised
    # (--norm-topk-prob); the script gives no --norm-epsilon, so Megatron's 1e-5 is the model's
    return Qwen3MoeConfig(vocab_size=1536, hidden_size=64, intermediate_size=96, moe_intermediate_size=24,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], max_position_embeddings=64, rms_norm_eps=1e-5,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          tie_word_embeddings=False).to_dict()


def llama31_config() -> dict:
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    return LlamaConfig(vocab_size=1536, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                       rope_parameters=rope, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                       hidden_act="silu").to_dict()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The first three sample pairs as a pairwise dataset (--prompt-type qwen3, the sample tokenizer's), and
    the same files under a second prefix without their meta file, for the Llama script's --prompt-type llama3
    (the sample tokenizer has no Llama 3 special tokens; the meta's prompt type is what --prompt-type is
    checked against)."""
    preprocess = import_tool("preprocess_data")
    root = tmp_path_factory.mktemp("dpo_scripts")
    source = root / "pairs.jsonl"
    source.write_text("".join((EXAMPLES / "data" / "sample_pairs.jsonl").read_text().splitlines(True)[:3]))
    with pytest.MonkeyPatch.context() as env:  # the tool sets its own process's ADAPTOR_* defaults
        env.setenv("ADAPTOR_QUIET", "1")
        env.setenv("ADAPTOR_BACKEND", "cpu")
        assert preprocess.main(["--input", str(source), "--output-prefix", str(root / "qwen3"),
                                "--handler-name", "AlpacaStylePairwiseHandler", "--prompt-type", "qwen3",
                                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER]) == 0
    for path in root.glob("qwen3_packed_*_document.*"):
        shutil.copyfile(path, root / path.name.replace("qwen3", "llama3", 1))
    return root, {"qwen3": str(root / "qwen3"), "llama3": str(root / "llama3")}


@contextlib.contextmanager
def training_process(argv):
    """This process set up as ``posttrain_gpt.py argv`` sets itself up (the features that command line
    enables, their patches); afterwards as it was."""
    from adaptor import bootstrap, run_state

    previous = run_state.context()
    bootstrap.teardown()
    try:
        bootstrap.setup(argv=argv, quiet=True)
        yield
    finally:
        bootstrap.teardown()
        if previous is not None:
            bootstrap.setup(argv=list(previous.argv or []), quiet=True)


def megatron_arguments(argv, world_size, monkeypatch, capsys):
    """Megatron's arguments of ``posttrain_gpt.py argv`` on rank 0 of ``world_size``, parsed and validated
    as the entry file does; a refusal fails the test with its line."""
    monkeypatch.setattr(sys, "argv", ["posttrain_gpt.py", *argv])
    launcher = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}  # as torchrun sets them; nothing connects
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    with training_process(argv), megatron_globals_restored():
        from megatron.training.arguments import parse_and_validate_args

        try:
            return parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
        except SystemExit:
            pytest.fail(capsys.readouterr().err.strip().splitlines()[-1])


@contextlib.contextmanager
def megatron_globals_restored():
    """Megatron's global arguments, tokenizer, timers and micro-batch calculator (which the entry file's
    parse_and_validate_args sets) unset inside the block and as they were after it."""
    from megatron.core import num_microbatches_calculator as calculator
    from megatron.training import global_vars

    saved = {name: value for name, value in vars(global_vars).items() if name.startswith("_GLOBAL_")}
    saved_calculator = calculator._GLOBAL_NUM_MICROBATCHES_CALCULATOR
    global_vars.unset_global_variables()
    try:
        yield
    finally:
        global_vars.unset_global_variables()
        vars(global_vars).update(saved)
        calculator._GLOBAL_NUM_MICROBATCHES_CALCULATOR = saved_calculator


SCRIPTS = {
    "qwen3_moe_30b_a3b": ("qwen3-moe", 16, [
        "--pad-to-multiple-of is not applied here",
        "--cp-attention-mask-type general: ", "--tokenizer-not-use-fast -> --tokenizer-hf-no-use-fast",
        "--no-shared-storage is not applied here", "--moe-token-dispatcher-type alltoall_seq -> "
        "--moe-token-dispatcher-type alltoall", "--first-k-dense-replace -1: --moe-layer-freq [1,1,1,1]"]),
    "llama31_8b": ("llama2", 8, [
        "--is-instruction-dataset with --is-pairwise-dataset (dropped: implied",
        "--rope-scaling-type llama3: --use-rope-scaling"]),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_mindspeed_llm_dpo_script_builds_the_config_model(name, pairs, tmp_path, monkeypatch, capsys):
    from adaptor.command_line.mindspeed_llm import rewrite_pretrain_argv
    from adaptor.convert import megatron_args_from_hf_config
    from adaptor.convert.config_check import config_mismatch

    model_type, world_size, lines = SCRIPTS[name]
    _, prefixes = pairs
    if name == "llama31_8b":
        argv, config = llama31_dpo(prefixes["llama3"], str(tmp_path / "load"), str(tmp_path / "save")), llama31_config()
    else:
        argv, config = qwen3_moe_dpo(prefixes["qwen3"], str(tmp_path / "load")), qwen3_moe_config()
    rewrite = rewrite_pretrain_argv(argv)
    assert rewrite.refused == [], rewrite.refused
    for line in lines:  # what changes nothing computed is dropped with a printed line, not silently
        assert any(line in note for note in rewrite.notes), (line, rewrite.notes)

    args = megatron_arguments(argv, world_size, monkeypatch, capsys)
    assert (args.stage, args.is_pairwise_dataset, args.is_instruction_dataset) == ("dpo", True, False)
    # pipeline stages exchange fixed shapes: --no-pad-to-seq-lengths is printed as not applied
    assert args.variable_seq_lengths_sft is False and args.data_path == [prefixes[argv[argv.index("--prompt-type") + 1]]]
    assert args.tokenizer_type == "HuggingFaceTokenizer" and args.tokenizer_model == TOKENIZER
    derived = megatron_args_from_hf_config(model_type, config)
    assert config_mismatch(args, derived) is None
    # and the check sees the family's own flags: without them, the scripts' model is another one
    wrong = dict(config, num_key_value_heads=4) if name == "llama31_8b" else dict(config, norm_topk_prob=False)
    assert config_mismatch(args, megatron_args_from_hf_config(model_type, wrong)) is not None
