"""MindSpeed-LLM's own pretrain scripts run through pretrain_gpt.py, and train what our flags train.

The flag sets are those of MindSpeed-LLM's ``examples/mcore/qwen3/pretrain_qwen3_8b_4K_ptd.sh``,
``examples/mcore/qwen3_moe/pretrain_qwen3_30b_a3b_4K_ptd.sh``, ``examples/mcore/llama31/pretrain_llama31_8b_128k_ptd.sh``
(both from Hugging Face weights) and ``examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh`` as published, every flag kept, with
only sizes scaled to two CPU cores (layers, hidden, heads, experts, vocabulary, sequence, batch,
iterations, parallel sizes) and paths pointed at the embedded corpus and tokenizer. Each runs
beside the same model written in Megatron's and our own flags; the loss curves must be equal to
the last printed digit: the same model, data and order of operations give the same floats.

Also here: ``python pretrain_gpt.py`` without torchrun is one torchrun process, and MindSpeed-LLM flags
that have no equivalent are refused in one line. MindSpeed-LLM's conversion and instruction-data
scripts: tests/unit/test_mindspeed_llm_command_lines.py; its Qwen2.5 and Mixtral pretrain scripts and Qwen2.5
LoRA tune script: tests/e2e/test_mindspeed_llm_qwen25_mixtral.py.
"""
from __future__ import annotations

import pytest

from helpers.hf_fixtures import make_tiny_llama, make_tiny_qwen3, make_tiny_qwen3_moe
from helpers.megatron_runs import (
    SAMPLE_TOKENIZER, TINY_QWEN3, TwoAtATime, run_pretrain, side_by_side, tail, tokenize_sample_corpus,
)
from helpers.one_line_errors import PREFIX, error_lines
from helpers.prefetch import prefetched

TOKENIZER = str(SAMPLE_TOKENIZER)


@prefetched
def corpus(tmp_path_factory):
    return tokenize_sample_corpus(tmp_path_factory.mktemp("corpus"))


def qwen3_8b_script(hf_dir, data, save) -> list[str]:
    """pretrain_qwen3_8b_4K_ptd.sh: 36 layers / 4096 hidden / 32 heads / 8 groups / 151936 vocab -> tiny."""
    optimize = ["--use-flash-attn", "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings",
                "--use-fused-swiglu", "--use-fused-rmsnorm", "--no-masked-softmax-fusion",
                "--use-distributed-optimizer", "--reuse-fp32-param", "--overlap-grad-reduce",
                "--overlap-param-gather", "--use-ascend-coc"]
    train = ["--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1.25e-6", "--lr-decay-style", "cosine",
             "--min-lr", "1.25e-7", "--weight-decay", "1e-1", "--lr-warmup-fraction", "0.01",
             "--attention-dropout", "0.0", "--init-method-std", "0.01", "--hidden-dropout", "0.0",
             "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--initial-loss-scale", "4096",
             "--seed", "42", "--bf16", "--train-iters", "4", "--seq-length", "64"]
    model_parallel = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2"]
    gpt = ["--use-mcore-models", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
           "--qk-layernorm", "--tokenizer-name-or-path", TOKENIZER, "--max-position-embeddings", "64",
           "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "192", "--num-attention-heads", "4",
           "--tokenizer-type", "PretrainedFromHF", "--make-vocab-size-divisible-by", "1",
           "--padded-vocab-size", "1536", "--rotary-base", "1000000", "--untie-embeddings-and-output-weights",
           "--disable-bias-linear", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
           "--attention-softmax-in-fp32", "--no-gradient-accumulation-fusion", "--group-query-attention",
           "--num-query-groups", "2", "--norm-epsilon", "1e-6", "--ckpt-format", "torch"]
    data_args = ["--handler-name", "GeneralPretrainHandler", "--workers", "4", "--data-path", data,
                 "--split", "100,0,0"]
    output = ["--log-interval", "1", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "0",
              "--no-load-optim", "--no-load-rng"]
    return (gpt + data_args + output + optimize + train + model_parallel
            + ["--load", str(hf_dir), "--save", str(save), "--distributed-backend", "nccl",
               "--transformer-impl", "local", "--enable-hf2mg-convert", "--model-type-hf", "qwen3"])


def qwen3_ours(hf_dir, data) -> list[str]:
    """The same model and training as we would write it."""
    return ["--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "192", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--qk-layernorm", "--normalization", "RMSNorm",
            "--norm-epsilon", "1e-6", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
            "--rotary-base", "1000000", "--untie-embeddings-and-output-weights", "--seq-length", "64",
            "--max-position-embeddings", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--init-method-std", "0.01", "--attention-softmax-in-fp32",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER, "--padded-vocab-size", "1536",
            "--data-path", data, "--split", "100,0,0", "--hf-load-dir", str(hf_dir),
            "--bf16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1.25e-6", "--min-lr", "1.25e-7",
            "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01", "--weight-decay", "0.1",
            "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--seed", "42", "--train-iters", "4",
            "--pipeline-model-parallel-size", "2", "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "4"]


def assert_trained_alike(theirs, ours) -> None:
    """Both runs trained their 4 iterations, with the same losses to the last printed digit."""
    assert theirs.returncode == 0, tail(theirs.output)
    assert ours.returncode == 0, tail(ours.output)
    assert sorted(theirs.losses) == [1, 2, 3, 4], tail(theirs.output)
    assert theirs.curve() == ours.curve(), (theirs.curve(), ours.curve())


def test_qwen3_8b_script_trains_like_our_flags(tmp_path, corpus):
    hf = make_tiny_qwen3(tmp_path / "hf", tied=False, vocab_size=1536, head_dim=16)
    theirs, ours = side_by_side(lambda: run_pretrain(qwen3_8b_script(hf, corpus, tmp_path / "save"), nproc=2),
                                lambda: run_pretrain(qwen3_ours(hf, corpus), nproc=2))
    assert_trained_alike(theirs, ours)
    # Loaded from the Hugging Face directory, not initialised: ln(1536) = 7.34 is a fresh model's loss.
    assert "loaded" in theirs.output and "--hf-load-dir" in theirs.output
    for said in ("--use-ascend-coc is not applied here", "--reuse-fp32-param is not applied here",
                 "--tokenizer-type PretrainedFromHF -> --tokenizer-type HuggingFaceTokenizer",
                 "--tokenizer-name-or-path -> --tokenizer-model",
                 "--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec: MindSpeed-LLM's Qwen3 layer spec",
                 "--enable-hf2mg-convert --load", "distributed_backend=gloo (for --distributed-backend nccl"):
        assert said in theirs.output, said
    assert (tmp_path / "save" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"


def llama31_8b_script(hf_dir, data) -> list[str]:
    """pretrain_llama31_8b_128k_ptd.sh: 32 layers / 4096 hidden / 32 heads / 8 groups / 128256 vocab -> the tiny
    Llama (head dim 14, so --kv-channels); TP2 with sequence parallelism kept, as published."""
    return ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1", "--use-mcore-models",
            "--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo",
            "--no-create-attention-mask-in-dataloader", "--no-shared-storage", "--sparse-mode", "4",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--sequence-parallel", "--use-flash-attn",
            "--use-rotary-position-embeddings", "--use-fused-rmsnorm", "--use-fused-swiglu",
            "--rope-scaling-type", "llama3", "--rope-scaling-factor", "8.0", "--low-freq-factor", "1.0",
            "--high-freq-factor", "4.0", "--original-max-position-embeddings", "8192",
            "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", TOKENIZER, "--num-layers", "4",
            "--hidden-size", "64", "--ffn-hidden-size", "160", "--num-attention-heads", "8", "--kv-channels", "14",
            "--group-query-attention", "--num-query-groups", "2", "--seq-length", "64",
            "--max-position-embeddings", "64", "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1536",
            "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-dropout", "0.0",
            "--init-method-std", "0.01", "--hidden-dropout", "0.0", "--position-embedding-type", "rope",
            "--rotary-base", "10000", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
            "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--lr", "1.25e-6", "--train-iters", "2",
            "--lr-decay-style", "cosine", "--min-lr", "1.25e-7", "--weight-decay", "1e-1",
            "--lr-warmup-fraction", "0.01", "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
            "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion", "--no-load-optim",
            "--no-load-rng", "--bf16", "--data-path", data, "--split", "100,0,0", "--log-interval", "1",
            "--save-interval", "2000", "--eval-interval", "2000", "--eval-iters", "0",
            "--distributed-backend", "nccl",
            "--load", str(hf_dir), "--enable-hf2mg-convert", "--model-type-hf", "llama2"]


def llama31_ours(hf_dir, data) -> list[str]:
    """The same Llama 3.1 model and training in Megatron's flags."""
    return ["--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "160", "--num-attention-heads", "8",
            "--kv-channels", "14", "--group-query-attention", "--num-query-groups", "2",
            "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu", "--disable-bias-linear",
            "--position-embedding-type", "rope", "--rotary-base", "10000", "--use-rope-scaling",
            "--rope-scaling-factor", "8.0", "--untie-embeddings-and-output-weights", "--seq-length", "64",
            "--max-position-embeddings", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--init-method-std", "0.01", "--attention-softmax-in-fp32",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER, "--padded-vocab-size", "1536",
            "--data-path", data, "--split", "100,0,0", "--hf-load-dir", str(hf_dir),
            "--bf16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
            "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1.25e-6", "--min-lr", "1.25e-7",
            "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01", "--weight-decay", "0.1",
            "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--train-iters", "2",
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "2000"]


def test_llama31_8b_script_trains_like_our_flags(tmp_path, corpus):
    # Two iterations suffice: the second loss is taken after one optimizer step, so equal pairs show the same
    # model, data and update; more iterations would only repeat that at ~5 s each.
    hf = make_tiny_llama(tmp_path / "hf", vocab_size=1536)  # the sample tokenizer's 1436 tokens fit
    theirs, ours = side_by_side(lambda: run_pretrain(llama31_8b_script(hf, corpus), nproc=2),
                                lambda: run_pretrain(llama31_ours(hf, corpus), nproc=2))
    assert theirs.returncode == 0, tail(theirs.output)
    assert ours.returncode == 0, tail(ours.output)
    assert sorted(theirs.losses) == [1, 2], tail(theirs.output)
    assert theirs.curve() == ours.curve(), (theirs.curve(), ours.curve())
    assert "--rope-scaling-type llama3: --use-rope-scaling" in theirs.output
    assert "--hf-load-dir" in theirs.output and "loaded" in theirs.output


def qwen3_30b_a3b_script(hf_dir, data, save) -> list[str]:
    """pretrain_qwen3_30b_a3b_4K_ptd.sh: 48 layers / 2048 hidden / 32 heads / 4 groups of 128, 128 experts of 768
    top-8 -> 4 / 64 / 6 / 2 of 12, 6 experts of 24 top-2; TP 1 / PP 4 / EP 4 -> 1 / 1 / 2; loaded as its CI's
    tune scripts load Hugging Face weights (--enable-hf2mg-convert --model-type-hf qwen3-moe)."""
    moe = ["--num-experts", "6", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
           "--moe-intermediate-size", "24", "--moe-ffn-hidden-size", "24", "--moe-grouped-gemm",
           "--moe-permutation-async-comm", "--moe-token-dispatcher-type", "alltoall_seq", "--moe-aux-loss-coeff", "0.001"]
    optimize = ["--use-flash-attn", "--use-fused-rotary-pos-emb", "--sequence-parallel",
                "--use-rotary-position-embeddings", "--use-fused-swiglu", "--use-fused-rmsnorm",
                "--no-masked-softmax-fusion", "--use-distributed-optimizer", "--gemm-gradient-accumulation-fusion",
                "--recompute-method", "uniform", "--recompute-granularity", "full", "--recompute-num-layers", "1"]
    train = ["--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1.25e-6", "--lr-decay-style", "cosine",
             "--min-lr", "1.25e-7", "--weight-decay", "1e-1", "--lr-warmup-fraction", "0.01",
             "--attention-dropout", "0.0", "--init-method-std", "0.01", "--hidden-dropout", "0.0",
             "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--initial-loss-scale", "4096",
             "--seed", "42", "--bf16", "--train-iters", "4", "--seq-length", "64", "--no-shared-storage"]
    model_parallel = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
                      "--expert-model-parallel-size", "2", "--context-parallel-size", "1",
                      "--context-parallel-algo", "ulysses_cp_algo"]
    gpt = ["--use-mcore-models", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
           "--kv-channels", "12", "--qk-layernorm", "--norm-topk-prob", "--tokenizer-name-or-path", TOKENIZER,
           "--max-position-embeddings", "64", "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "96",
           "--num-attention-heads", "6", "--tokenizer-type", "PretrainedFromHF", "--make-vocab-size-divisible-by", "1",
           "--padded-vocab-size", "1536", "--rotary-base", "1000000", "--untie-embeddings-and-output-weights",
           "--disable-bias-linear", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
           "--attention-softmax-in-fp32", "--no-gradient-accumulation-fusion", "--group-query-attention",
           "--num-query-groups", "2"]
    output = ["--log-interval", "1", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "0",
              "--no-load-optim", "--no-load-rng"]
    return (gpt + ["--data-path", data, "--split", "100,0,0"] + moe + output + optimize + train + model_parallel
            + ["--distributed-backend", "nccl", "--load", str(hf_dir), "--save", str(save), "--enable-hf2mg-convert",
               "--model-type-hf", "qwen3-moe", "--ckpt-format", "torch"])


def qwen3_30b_a3b_ours(hf_dir, data) -> list[str]:
    """The same model and training as we would write it: the flags config.json implies, and the run's."""
    import json

    from adaptor.convert.config_check import model_flags

    flags = model_flags("qwen3-moe", json.loads((hf_dir / "config.json").read_text()))
    for drop in ("--max-position-embeddings", "--moe-router-dtype"):  # the script's: 64, and the model's dtype
        at = flags.index(drop)
        flags = flags[:at] + flags[at + 2:]
    return flags + [
        "--max-position-embeddings", "64", "--seq-length", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--init-method-std", "0.01", "--attention-softmax-in-fp32", "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", TOKENIZER, "--padded-vocab-size", "1536", "--data-path", data, "--split", "100,0,0",
        "--hf-load-dir", str(hf_dir), "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.001",
        "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2",
        "--sequence-parallel", "--bf16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
        "--use-fused-rotary-pos-emb", "--use-distributed-optimizer", "--recompute-granularity", "full",
        "--recompute-method", "uniform", "--recompute-num-layers", "1", "--micro-batch-size", "1",
        "--global-batch-size", "8", "--lr", "1.25e-6", "--min-lr", "1.25e-7", "--lr-decay-style", "cosine",
        "--lr-warmup-fraction", "0.01", "--weight-decay", "0.1", "--adam-beta2", "0.95", "--initial-loss-scale", "4096",
        "--seed", "42", "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "4"]


def test_qwen3_30b_a3b_script_trains_like_our_flags(tmp_path, corpus):
    # The script gives no --norm-epsilon: Megatron's 1e-5, which --hf-load-dir checks against rms_norm_eps.
    hf = make_tiny_qwen3_moe(tmp_path / "hf", vocab_size=1536, norm_topk_prob=True, mlp_only_layers=[],
                             intermediate_size=96, rms_norm_eps=1e-5)
    theirs, ours = side_by_side(lambda: run_pretrain(qwen3_30b_a3b_script(hf, corpus, tmp_path / "save"), nproc=2),
                                lambda: run_pretrain(qwen3_30b_a3b_ours(hf, corpus), nproc=2))
    assert_trained_alike(theirs, ours)
    assert "loaded" in theirs.output and "--hf-load-dir" in theirs.output
    for said in ("--moe-intermediate-size -> --moe-ffn-hidden-size", "--norm-topk-prob is not applied here"):
        assert said in theirs.output, said


def deepseek3_script(data, load, save) -> list[str]:
    """pretrain_deepseek3_671b_4k_ptd.sh: 64 slots (61 layers + noop 61,62,63), 256 experts, ... -> tiny.

    Scaled: 6 slots with noop slot 5 (5 layers, as 61 of 64), first 1 dense (3 of 61), 4 experts top-2 in
    2 groups keeping 1 (256 top-8 in 8 keeping 4), YaRN factor 4 over 16 positions (40 over 4096),
    TP 4 / PP 8 / EP 8 -> 1 / 2 / 1.
    """
    mla = ["--multi-latent-attention", "--qk-pos-emb-head-dim", "8", "--qk-head-dim", "16", "--q-lora-rank", "32",
           "--kv-lora-rank", "24", "--v-head-dim", "16", "--qk-layernorm", "--mla-fa-without-pad"]
    moe = ["--moe-router-dtype", "fp32", "--moe-grouped-gemm", "--moe-permutation-async-comm",
           "--moe-token-dispatcher-type", "alltoall", "--moe-permute-fusion", "--first-k-dense-replace", "1",
           "--moe-layer-freq", "1", "--n-shared-experts", "1", "--num-experts", "4", "--moe-router-topk", "2",
           "--moe-ffn-hidden-size", "32", "--moe-router-load-balancing-type", "none", "--moe-router-num-groups", "2",
           "--moe-router-group-topk", "1", "--moe-router-topk-scaling-factor", "2.5", "--moe-aux-loss-coeff", "0.0001",
           "--seq-aux", "--norm-topk-prob", "--moe-router-score-function", "sigmoid",
           "--moe-router-enable-expert-bias", "--expert-tensor-parallel-size", "1"]
    mtp = ["--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3", "--mtp-mem-efficient-logits"]
    rope = ["--beta-fast", "32", "--beta-slow", "1", "--rope-scaling-factor", "4", "--rope-scaling-mscale", "1.0",
            "--rope-scaling-mscale-all-dim", "1.0", "--rope-scaling-original-max-position-embeddings", "16",
            "--rope-scaling-type", "yarn"]
    dualpipe = ["--moe-fb-overlap", "--schedules-method", "dualpipev"]
    mem = ["--swap-optimizer", "--swap-optimizer-times", "4", "--use-distributed-optimizer",
           "--recompute-method", "uniform", "--recompute-granularity", "full", "--recompute-num-layers", "1"]
    gpt = ["--spec", "mindspeed_llm.tasks.models.spec.deepseek_spec", "layer_spec", "--reset-attention-mask",
           "--gemm-gradient-accumulation-fusion", "--noop-layers", "5", "--manual-gc", "--manual-gc-interval", "50",
           "--no-shared-storage", "--use-flash-attn", "--use-mcore-models", "--tensor-model-parallel-size", "1",
           "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "1", "--sequence-parallel",
           "--context-parallel-size", "1", "--context-parallel-algo", "ulysses_cp_algo", "--num-layers", "6",
           "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
           "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", TOKENIZER, "--seq-length", "64",
           "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "8",
           "--make-vocab-size-divisible-by", "1", "--lr", "1.0e-5", "--train-iters", "4", "--lr-decay-style", "cosine",
           "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-dropout", "0.0",
           "--init-method-std", "0.02", "--hidden-dropout", "0.0", "--position-embedding-type", "rope",
           "--normalization", "RMSNorm", "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings",
           "--use-fused-swiglu", "--use-fused-rmsnorm", "--swiglu", "--no-masked-softmax-fusion",
           "--attention-softmax-in-fp32", "--min-lr", "1.0e-7", "--weight-decay", "1e-2", "--lr-warmup-iters", "1",
           "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--initial-loss-scale", "65536",
           "--vocab-size", "1536", "--padded-vocab-size", "1536", "--rotary-base", "10000", "--norm-epsilon", "1e-6",
           "--no-load-optim", "--no-load-rng", "--bf16", "--use-ascend-coc", "--coc-fused-kernel",
           "--distributed-timeout-minutes", "120"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    output = ["--log-interval", "1", "--save-interval", "4", "--eval-interval", "4", "--eval-iters", "0",
              "--no-save-optim", "--no-save-rng"]
    return (gpt + data_args + output + mla + rope + moe + mtp + dualpipe + mem
            + ["--distributed-backend", "nccl", "--save", str(save), "--load", str(load)])


def deepseek3_ours(data) -> list[str]:
    return ["--num-layers", "5", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "24", "--qk-head-dim", "16",
            "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm",
            "--rope-type", "yarn", "--rotary-base", "10000", "--rotary-scaling-factor", "4",
            "--yarn-original-max-position-embeddings", "16", "--yarn-beta-fast", "32", "--yarn-beta-slow", "1",
            "--mscale", "1.0", "--mscale-all-dim", "1.0", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
            "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
            "--untie-embeddings-and-output-weights", "--attention-softmax-in-fp32",
            "--num-experts", "4", "--moe-layer-freq", "[0,1,1,1,1]", "--moe-ffn-hidden-size", "32",
            "--moe-shared-expert-intermediate-size", "32", "--moe-router-topk", "2",
            "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
            "--moe-router-num-groups", "2", "--moe-router-group-topk", "1", "--moe-router-topk-scaling-factor", "2.5",
            "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.0001",
            "--moe-router-dtype", "fp32", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
            "--moe-permute-fusion", "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3",
            "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|ttmL",
            "--seq-length", "64", "--max-position-embeddings", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--reset-attention-mask", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER,
            "--padded-vocab-size", "1536", "--data-path", data, "--split", "100,0,0",
            "--bf16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-distributed-optimizer",
            "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
            "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-5", "--min-lr", "1e-7",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--initial-loss-scale", "65536",
            "--seed", "1234", "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "4"]


def test_deepseek3_script_trains_like_our_flags(tmp_path, corpus):
    theirs, ours = side_by_side(
        lambda: run_pretrain(deepseek3_script(corpus, tmp_path / "none", tmp_path / "save"), nproc=2),
        lambda: run_pretrain(deepseek3_ours(corpus), nproc=2))
    assert_trained_alike(theirs, ours)
    assert [theirs.mtp_losses[i] for i in sorted(theirs.mtp_losses)] == \
        [ours.mtp_losses[i] for i in sorted(ours.mtp_losses)]
    for said in ("--noop-layers: 1 identity layers dropped, --num-layers 5, --pipeline-model-parallel-layout Ettt|ttmL",
                 "--first-k-dense-replace 1: --moe-layer-freq [0,1,1,1,1]",
                 "--n-shared-experts 1: --moe-shared-expert-intermediate-size 32",
                 "--seq-aux: --moe-router-load-balancing-type seq_aux_loss",
                 "--rope-scaling-type yarn: --rope-type yarn, --rotary-scaling-factor 4",
                 "--schedules-method is not applied here",
                 "--swap-optimizer: --optimizer-cpu-offload --optimizer-offload-fraction 1.0",
                 "--context-parallel-algo is not applied here"):
        assert said in theirs.output, said


REFUSED_OR_NOTED = [
    ["--rope-scaling-type", "longrope"], ["--moe-tp-extend-ep"], ["--sft"],
    ["--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo", "--tensor-model-parallel-size", "1"],
]
PARTIAL_LAUNCHER = {"WORLD_SIZE": "2"}


@pytest.fixture(scope="module")
def one_process_runs():
    """The one-process runs of the one-line cases below, started together (two at a time); each test waits
    for its own: ``--train-iters 1`` with each MindSpeed-LLM flag set, and plain python with a partial
    launcher environment."""
    pool = TwoAtATime()
    jobs = {tuple(flags): (lambda flags=flags: run_pretrain(TINY_QWEN3 + ["--train-iters", "1"] + flags))
            for flags in REFUSED_OR_NOTED}
    jobs["partial_launcher"] = lambda: run_pretrain(TINY_QWEN3 + ["--train-iters", "1"], torchrun=False,
                                                    env=PARTIAL_LAUNCHER)
    yield pool.start(jobs)
    pool.close()


@pytest.mark.parametrize("flags,line", [
    (["--rope-scaling-type", "longrope"], "--rope-scaling-type longrope (MindSpeed-LLM) has no Megatron equivalent "
                                          "here; supported: yarn, llama3"),
    (["--moe-tp-extend-ep"], "--moe-tp-extend-ep (MindSpeed-LLM): pass --expert-tensor-parallel-size 1 and "
                             "--expert-model-parallel-size TPxEP, the same layout in Megatron's flags"),
    # Megatron's SFT is honoured; on mock data there are no conversations to train on
    (["--sft"], "--sft trains on conversations; --mock-data has none, so give --data-path"),
    (["--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo", "--tensor-model-parallel-size",
      "1"], None),  # CP 1: the algorithm choice is not applied, and the run goes on
])
def test_refused_or_noted_in_one_line(one_process_runs, flags, line):
    run = one_process_runs[tuple(flags)].result()  # run_pretrain(TINY_QWEN3 + ["--train-iters", "1"] + flags)
    if line is None:
        assert run.returncode == 0, tail(run.output)
        assert "--context-parallel-algo is not applied here" in run.output
        return
    assert run.returncode != 0
    assert error_lines(run.output) == [f"{PREFIX} {line}"], tail(run.output)


def test_plain_python_is_one_torchrun_process():
    args = TINY_QWEN3 + ["--train-iters", "3"]
    plain, launched = side_by_side(lambda: run_pretrain(args, torchrun=False), lambda: run_pretrain(args))
    assert plain.returncode == 0, tail(plain.output)
    assert "no torchrun environment: one process on 127.0.0.1:" in plain.output
    assert plain.curve() == launched.curve() and len(plain.curve()) == 3


def test_a_partial_launcher_environment_is_one_line(one_process_runs):
    # run_pretrain(TINY_QWEN3 + ["--train-iters", "1"], torchrun=False, env={"WORLD_SIZE": "2"})
    run = one_process_runs["partial_launcher"].result()
    assert run.returncode == 2
    assert error_lines(run.output) == [
        f"{PREFIX} the launcher set WORLD_SIZE but not RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; start with "
        f"torchrun, or unset them all to run as a single process"], tail(run.output)
