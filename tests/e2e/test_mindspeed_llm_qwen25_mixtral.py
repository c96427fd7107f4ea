"""MindSpeed-LLM's Qwen2.5, Mixtral, Llama 3.x and Qwen3-MoE scripts run as published (pretrain_gpt.py, posttrain_gpt.py).

The flag sets are those of MindSpeed-LLM's ``examples/mcore/qwen25/pretrain_qwen25_0point5_32k_ptd.sh``
(context parallel 2, q/k/v bias, tied embeddings), ``examples/mcore/mixtral/pretrain_mixtral_8x7b_ptd.sh``
(8 experts top-2 on every layer, TP with sequence parallelism), ``examples/mcore/qwen25/tune_qwen25_3b_4k_lora_ptd.sh``
(LoRA on instruction data), ``examples/mcore/llama31/tune_llama31_8b_8k_full_ptd.sh`` (full fine-tuning, Llama 3
RoPE scaling, ``--npu-deterministic``) and ``examples/mcore/qwen3_moe/tune_qwen3_30b_a3b_4K_full_ptd.sh`` (full
fine-tuning of every MoE layer, qk-layernorm, ``--spec``'s Qwen3 layer spec), every flag kept, with only sizes
scaled to two CPU cores (layers, hidden, heads, experts, vocabulary, sequence, batch, iterations, parallel sizes)
and paths pointed at the embedded corpus, instruction set and tokenizer. The Mixtral script names a Llama 2
sentencepiece ``tokenizer.model`` (``--tokenizer-type Llama2Tokenizer``); here it reads the sample tokenizer
(``PretrainedFromHF``) like the others, since the data are tokenized by it. The Llama 3.1 script's
``--prompt-type llama3`` needs Llama 3's header tokens, which the sample tokenizer lacks: it reads a copy with
those three tokens added (and no chat template of its own, so the prompt type's template renders the data).

Each pretrain script runs beside the same model in Megatron's and our own flags, from the same seed (the
scripts' ``--load`` names a converted checkpoint; here it names an empty directory, so both runs initialise
alike); the loss curves must be equal to the last printed digit. Megatron's torch.compile'd fusions run
eagerly in both (``TORCHDYNAMO_DISABLE=1``, the flags untouched): compiling them costs each rank seconds per
run, and the compiled path of the same fusion flags trains in tests/e2e/test_mindspeed_llm_command_lines.py.

The tune scripts, on the sample instruction set preprocessed in each script's template (Qwen2.5's, Llama 3's,
Qwen3's) by tools/preprocess_data.py, train beside our own flags from the same seeded base: equal loss and
gradient-norm curves, and the script's checkpoint at its last iteration. For LoRA, the same adapters: at the
script's learning rate, 7.75e-7, three steps barely move the loss, so the gradient norms are what shows the
same adapters trained: with B zero at the start only B has gradients (0.16 here, where full fine-tuning of the
same model has 2.5). The Llama 3.1 script asks for 10 validation iterations with no validation share
(``--split 100,0,0``); it trains and ends without validating, as MindSpeed-LLM's run does
(patches/upstream_fixes/no_validation_split.py).

``examples/mcore/llama3/dpo_llama3_8b_lora_ptd.sh`` (LoRA DPO through the pipeline, PP 8 -> 2) trains on the
sample pairs in Llama 3's template beside our own DPO flags: equal DPO losses and gradient norms, the first loss
ln 2. Its flags found two gaps, both fixed: ``--is-instruction-dataset`` beside ``--is-pairwise-dataset`` read the
instruction layout (now dropped with a note: the pairwise datasets are read), and ``--variable-seq-lengths`` was
refused for pairs (now honoured on one pipeline stage, and printed as not applied across stages, as for SFT).
"""
from __future__ import annotations

import json
import re

from helpers.megatron_runs import SAMPLE_TOKENIZER, run_pretrain, side_by_side, tail, tokenize_sample_corpus
from helpers.paths import EXAMPLES
from helpers.prefetch import prefetched
from helpers.processes import run_tool

TOKENIZER = str(SAMPLE_TOKENIZER)
ITERS = 3
EAGER = {"TORCHDYNAMO_DISABLE": "1"}
GRAD_NORM = re.compile(r"iteration\s+\d+/\s*\d+ .*?grad norm: ([0-9.Ee+-]+)")


@prefetched
def corpus(tmp_path_factory):
    return tokenize_sample_corpus(tmp_path_factory.mktemp("corpus"))


def qwen25_05b_script(data, load, save) -> list[str]:
    """pretrain_qwen25_0point5_32k_ptd.sh: 24 layers / 896 hidden / 4864 FFN / 14 heads / 2 groups / 151936
    vocab, seq 32768, GBS 32, CP 2 -> 2 / 64 / 128 / 4 / 2 / 1536, seq 64, GBS 2, CP 2."""
    gpt = ["--use-mcore-models", "--use-cp-send-recv-overlap", "--use-fused-ring-attention-update",
           "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
           "--context-parallel-size", "2", "--context-parallel-algo", "megatron_cp_algo", "--sequence-parallel",
           "--use-distributed-optimizer", "--tokenizer-type", "PretrainedFromHF",
           "--tokenizer-name-or-path", TOKENIZER, "--seq-length", "64", "--max-position-embeddings", "64",
           "--micro-batch-size", "1", "--global-batch-size", "2", "--group-query-attention",
           "--num-query-groups", "2", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
           "--num-attention-heads", "4", "--rotary-base", "1000000", "--normalization", "RMSNorm",
           "--norm-epsilon", "1e-06", "--swiglu", "--add-qkv-bias", "--disable-bias-linear",
           "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--make-vocab-size-divisible-by", "1",
           "--padded-vocab-size", "1536", "--lr", "1.25e-6", "--train-iters", str(ITERS),
           "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01", "--init-method-std", "0.01",
           "--position-embedding-type", "rope", "--use-fused-rmsnorm", "--use-fused-rotary-pos-emb",
           "--use-rotary-position-embeddings", "--use-fused-swiglu", "--overlap-grad-reduce", "--use-flash-attn",
           "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--min-lr", "1.25e-7",
           "--weight-decay", "1e-1", "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
           "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion", "--no-load-optim",
           "--no-load-rng", "--seed", "42", "--bf16"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    output = ["--log-interval", "1", "--save-interval", "1000", "--eval-interval", "1000", "--eval-iters", "0"]
    return (gpt + data_args + output
            + ["--distributed-backend", "nccl", "--log-throughput", "--load", str(load), "--save", str(save),
               "--transformer-impl", "local"])


def qwen25_ours(data) -> list[str]:
    """The same Qwen2.5 model and training in Megatron's flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--add-qkv-bias", "--disable-bias-linear",
            "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type", "rope",
            "--rotary-base", "1000000", "--seq-length", "64", "--max-position-embeddings", "64",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.01",
            "--attention-softmax-in-fp32", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
            TOKENIZER, "--padded-vocab-size", "1536", "--data-path", data, "--split", "100,0,0",
            "--context-parallel-size", "2", "--cp-comm-type", "p2p", "--bf16", "--use-flash-attn",
            "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-distributed-optimizer",
            "--overlap-grad-reduce", "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1.25e-6",
            "--min-lr", "1.25e-7", "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01",
            "--weight-decay", "0.1", "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--seed", "42",
            "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000"]


def mixtral_8x7b_script(data, load, save) -> list[str]:
    """pretrain_mixtral_8x7b_ptd.sh: 32 layers / 4096 hidden / 14336 FFN / 32 heads / 8 groups / 32000 vocab,
    8 experts top-2, seq 32768, GBS 32, TP 8 / CP 4 -> 2 / 64 / 128 / 4 / 2 / the sample tokenizer's 1436,
    4 experts top-2, seq 64, GBS 2, TP 2 / CP 1; 2000 iterations with the learning rate decaying over 1280
    -> 3 over 3 (after the same 2 warm-up iterations); 100 validation iterations -> 0, as the sample corpus
    gives the script's 0.008 % validation share no document."""
    moe = ["--num-experts", "4", "--expert-model-parallel-size", "1", "--moe-router-topk", "2",
           "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.02",
           "--moe-permutation-async-comm", "--moe-token-dispatcher-type", "alltoall_seq", "--moe-grouped-gemm",
           "--moe-layer-freq", "-1", "--first-k-dense-replace", "-1", "--use-cp-send-recv-overlap"]
    gpt = ["--use-mcore-models", "--disable-bias-linear", "--seq-length", "64", "--max-position-embeddings", "64",
           "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
           "--init-method-std", "0.01", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
           "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
           "--untie-embeddings-and-output-weights", "--group-query-attention", "--num-query-groups", "2",
           "--vocab-size", "1436", "--rotary-base", "1000000", "--no-masked-softmax-fusion",
           "--use-fused-rotary-pos-emb", "--use-flash-attn", "--use-fused-swiglu", "--use-fused-rmsnorm",
           "--no-check-for-nan-in-loss-and-grad", "--overlap-grad-reduce", "--overlap-param-gather",
           "--make-vocab-size-divisible-by", "1", "--tensor-model-parallel-size", "2",
           "--pipeline-model-parallel-size", "1", "--sequence-parallel", "--use-distributed-optimizer",
           "--context-parallel-size", "1", "--context-parallel-algo", "megatron_cp_algo",
           "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", TOKENIZER,
           "--load", str(load), "--save", str(save), "--micro-batch-size", "1", "--global-batch-size", "2",
           "--lr", "1e-5", "--train-iters", str(ITERS), "--lr-decay-iters", "3", "--lr-decay-style", "cosine",
           "--min-lr", "1.0e-6", "--weight-decay", "0.1", "--lr-warmup-iters", "2", "--clip-grad", "1.0",
           "--bf16", "--no-load-optim", "--no-load-rng", "--no-shared-storage"]
    data_args = ["--data-path", data, "--split", "99990,8,2"]
    output = ["--log-interval", "1", "--save-interval", "2000", "--eval-interval", "5001", "--eval-iters", "0"]
    return moe + gpt + data_args + output + ["--distributed-backend", "nccl"]


def mixtral_ours(data) -> list[str]:
    """The same Mixtral model and training in Megatron's flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
            "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "1000000",
            "--untie-embeddings-and-output-weights", "--seq-length", "64", "--max-position-embeddings", "64",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.01",
            "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
            "--moe-aux-loss-coeff", "0.02", "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm",
            "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER,
            "--make-vocab-size-divisible-by", "1", "--data-path", data, "--split", "99990,8,2",
            "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--bf16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-5", "--min-lr", "1e-6",
            "--lr-decay-style", "cosine", "--lr-decay-iters", "3", "--lr-warmup-iters", "2", "--weight-decay", "0.1",
            "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "5001"]


@prefetched
def pretrain_runs(tmp_path_factory, corpus):
    """Both scripts and their twins, two at a time: {"qwen25": (theirs, ours), "mixtral": (theirs, ours)}."""
    tmp = tmp_path_factory.mktemp("pretrain")
    runs = side_by_side(
        lambda: run_pretrain(qwen25_05b_script(corpus, tmp / "none", tmp / "qwen25_save"), nproc=2, env=EAGER),
        lambda: run_pretrain(qwen25_ours(corpus), nproc=2, env=EAGER),
        lambda: run_pretrain(mixtral_8x7b_script(corpus, tmp / "none", tmp / "mixtral_save"), nproc=2, env=EAGER),
        lambda: run_pretrain(mixtral_ours(corpus), nproc=2, env=EAGER))
    return {"qwen25": tuple(runs[:2]), "mixtral": tuple(runs[2:])}


def assert_trained_alike(theirs, ours) -> None:
    assert theirs.returncode == 0, tail(theirs.output)
    assert ours.returncode == 0, tail(ours.output)
    assert sorted(theirs.losses) == list(range(1, ITERS + 1)), tail(theirs.output)
    assert theirs.curve() == ours.curve(), (theirs.curve(), ours.curve())


def test_qwen25_05b_script_trains_like_our_flags(pretrain_runs):
    theirs, ours = pretrain_runs["qwen25"]
    assert_trained_alike(theirs, ours)
    for said in ("--context-parallel-algo megatron_cp_algo: --cp-comm-type p2p",
                 "--use-cp-send-recv-overlap is not applied", "--use-fused-ring-attention-update is not applied"):
        assert said in theirs.output, said


def test_mixtral_8x7b_script_trains_like_our_flags(pretrain_runs):
    theirs, ours = pretrain_runs["mixtral"]
    assert_trained_alike(theirs, ours)
    for said in ("--first-k-dense-replace -1: --moe-layer-freq [1,1]",
                 "--moe-token-dispatcher-type alltoall_seq -> --moe-token-dispatcher-type alltoall"):
        assert said in theirs.output, said


def llama3_tokenizer(directory):
    """The sample tokenizer with Llama 3's three header tokens added and no chat template of its own, so that
    ``--prompt-type llama3`` renders Llama 3's turns (the sample tokenizer's own template is Qwen3's)."""
    spec = json.loads((SAMPLE_TOKENIZER / "tokenizer.json").read_text())
    first = len(spec["model"]["vocab"])
    spec["added_tokens"] += [{"id": first + i, "content": token, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}
                             for i, token in enumerate(("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))]
    config = json.loads((SAMPLE_TOKENIZER / "tokenizer_config.json").read_text())
    del config["chat_template"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def preprocess_instructions(out, prompt_type: str, tokenizer) -> str:
    proc = run_tool("preprocess_data.py", "--input", EXAMPLES / "data" / "sample_instructions.jsonl",
                    "--tokenizer-name-or-path", tokenizer, "--output-prefix", out,
                    "--handler-name", "AlpacaStyleInstructionHandler", "--tokenizer-type", "PretrainedFromHF",
                    "--workers", "1", "--log-interval", "1000", "--prompt-type", prompt_type, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


@prefetched
def instructions(tmp_path_factory):
    """The sample instruction set in each tune script's chat template (Qwen2.5's, Qwen3's, Llama 3's), as
    MindSpeed-LLM's Alpaca-style data scripts build it: {prompt type: (dataset prefix, tokenizer)}."""
    tmp = tmp_path_factory.mktemp("instructions")
    tokenizers = {"qwen": TOKENIZER, "qwen3": TOKENIZER, "llama3": str(llama3_tokenizer(tmp / "llama3_tokenizer"))}
    built = side_by_side(*(lambda kind=kind: preprocess_instructions(tmp / kind, kind, tokenizers[kind])
                           for kind in tokenizers))
    return {kind: (prefix, tokenizers[kind]) for kind, prefix in zip(tokenizers, built)}


def qwen25_3b_lora_script(data, load, save) -> list[str]:
    """tune_qwen25_3b_4k_lora_ptd.sh: 36 layers / 2048 hidden / 11008 FFN / 16 heads / 2 groups / 151936 vocab,
    seq 4096, GBS 8 over 8 ranks -> 2 / 64 / 128 / 4 / 2 / 1536, seq 128 (the sample conversations run 30-110
    tokens), GBS 2 on one."""
    tune = ["--finetune", "--stage", "sft", "--is-instruction-dataset", "--tokenizer-not-use-fast",
            "--prompt-type", "qwen", "--padded-samples", "--variable-seq-lengths", "--lora-r", "8",
            "--lora-alpha", "16", "--lora-fusion", "--lora-target-modules", "linear_qkv", "linear_proj",
            "linear_fc1", "linear_fc2"]
    gpt = ["--use-mcore-models", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
           "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
           "--group-query-attention", "--num-query-groups", "2", "--tokenizer-type", "PretrainedFromHF",
           "--tokenizer-name-or-path", TOKENIZER, "--seq-length", "128", "--max-position-embeddings", "128",
           "--micro-batch-size", "1", "--global-batch-size", "2", "--make-vocab-size-divisible-by", "1",
           "--padded-vocab-size", "1536", "--rotary-base", "1000000", "--train-iters", str(ITERS),
           "--lr", "7.75e-7", "--min-lr", "7.75e-8", "--weight-decay", "1e-1", "--lr-decay-style", "cosine",
           "--lr-warmup-fraction", "0.01", "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
           "--add-qkv-bias", "--disable-bias-linear", "--attention-dropout", "0.0", "--init-method-std", "0.01",
           "--hidden-dropout", "0.0", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
           "--norm-epsilon", "1e-06", "--swiglu", "--use-distributed-optimizer", "--use-flash-attn",
           "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings", "--use-fused-swiglu",
           "--use-fused-rmsnorm", "--use-ascend-mc2", "--overlap-grad-reduce", "--no-masked-softmax-fusion",
           "--attention-softmax-in-fp32", "--initial-loss-scale", "4096", "--no-gradient-accumulation-fusion",
           "--no-load-optim", "--no-load-rng", "--seed", "42", "--bf16"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    output = ["--log-interval", "1", "--save-interval", "2000", "--eval-interval", "2000", "--eval-iters", "0"]
    return gpt + data_args + output + tune + ["--distributed-backend", "nccl", "--load", str(load), "--save", str(save)]


def qwen25_lora_ours(data, load) -> list[str]:
    """The same LoRA fine-tuning in Megatron's and our flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--add-qkv-bias", "--disable-bias-linear",
            "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--position-embedding-type", "rope",
            "--rotary-base", "1000000", "--seq-length", "128", "--max-position-embeddings", "128",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.01",
            "--attention-softmax-in-fp32", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", TOKENIZER,
            "--padded-vocab-size", "1536", "--data-path", data, "--split", "100,0,0",
            "--is-instruction-dataset", "--prompt-type", "qwen", "--variable-seq-lengths",
            "--lora-r", "8", "--lora-alpha", "16",
            "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
            "--load", str(load), "--finetune", "--bf16", "--use-flash-attn", "--use-fused-rmsnorm",
            "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-distributed-optimizer", "--overlap-grad-reduce",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "7.75e-7", "--min-lr", "7.75e-8",
            "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01", "--weight-decay", "0.1",
            "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--seed", "42", "--train-iters", str(ITERS),
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "2000"]


@prefetched
def lora_runs(tmp_path_factory, instructions):
    """The tune script and our LoRA flags, side by side; the script saves its adapters under ``save``."""
    tmp = tmp_path_factory.mktemp("tune")
    data = instructions["qwen"][0]
    theirs, ours = side_by_side(
        lambda: run_pretrain(qwen25_3b_lora_script(data, tmp / "none", tmp / "save"),
                             script="posttrain_gpt.py", env=EAGER),
        lambda: run_pretrain(qwen25_lora_ours(data, tmp / "none"), script="posttrain_gpt.py", env=EAGER))
    return theirs, ours, tmp / "save"


def test_qwen25_3b_lora_tune_script_trains_like_our_flags(lora_runs):
    theirs, ours, save = lora_runs
    assert_trained_alike(theirs, ours)
    grad_norms = [GRAD_NORM.findall(run.output) for run in (theirs, ours)]
    assert len(grad_norms[0]) == ITERS and grad_norms[0] == grad_norms[1], grad_norms
    adapters = [line for line in theirs.output.splitlines() if line.startswith("> LoRA r=8 alpha=16")]
    assert adapters and adapters[0] in ours.output and "8 adapted linears" in adapters[0], adapters
    for said in ("--use-ascend-mc2 is not applied here", "--padded-samples is not applied here",
                 "--tokenizer-not-use-fast -> --tokenizer-hf-no-use-fast", "--lora-fusion: a speed hint"):
        assert said in theirs.output, said
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)


def llama31_8b_full_script(data, tokenizer, load, save) -> list[str]:
    """tune_llama31_8b_8k_full_ptd.sh: 32 layers / 4096 hidden / 14336 FFN / 32 heads / 8 groups / 128256
    vocab, seq 8192, MBS 4 / GBS 128 over TP 8 -> 2 / 64 / 128 / 4 / 2 / the Llama 3 sample tokenizer's 1439,
    seq 64, MBS 1 / GBS 2 on one. The RoPE scaling's original context (8192) is Llama 3.1's, not a size."""
    gpt = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--use-mcore-models",
           "--micro-batch-size", "1", "--global-batch-size", "2", "--sequence-parallel", "--use-flash-attn",
           "--prompt-type", "llama3", "--variable-seq-lengths", "--use-rotary-position-embeddings",
           "--rope-scaling-type", "llama3", "--rope-scaling-factor", "8.0", "--rotary-percent", "1.0",
           "--low-freq-factor", "1.0", "--high-freq-factor", "4.0", "--original-max-position-embeddings", "8192",
           "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", tokenizer, "--tokenizer-not-use-fast",
           "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
           "--group-query-attention", "--num-query-groups", "2", "--seq-length", "64",
           "--max-position-embeddings", "64", "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1439",
           "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-dropout", "0.0",
           "--init-method-std", "0.02", "--hidden-dropout", "0.0", "--position-embedding-type", "rope",
           "--rotary-base", "500000", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
           "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--lr", "1e-6", "--train-iters", str(ITERS),
           "--lr-decay-style", "cosine", "--weight-decay", "1e-1", "--clip-grad", "1.0", "--adam-beta1", "0.9",
           "--adam-beta2", "0.999", "--initial-loss-scale", "4096", "--finetune", "--stage", "sft",
           "--is-instruction-dataset", "--no-gradient-accumulation-fusion", "--no-load-optim", "--no-load-rng",
           "--bf16", "--vocab-size", "1439", "--npu-deterministic"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    output = ["--log-interval", "1", "--save-interval", "2000", "--eval-interval", "2000", "--eval-iters", "10",
              "--load", str(load), "--save", str(save)]
    return gpt + data_args + output + ["--distributed-backend", "nccl"]


def llama31_full_ours(data, tokenizer, load) -> list[str]:
    """The same full fine-tuning in Megatron's and our flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm", "--swiglu",
            "--position-embedding-type", "rope", "--rotary-base", "500000", "--use-rope-scaling",
            "--rope-scaling-factor", "8", "--seq-length", "64", "--max-position-embeddings", "64",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--init-method-std", "0.02",
            "--attention-softmax-in-fp32", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
            "--padded-vocab-size", "1439", "--data-path", data, "--split", "100,0,0",
            "--is-instruction-dataset", "--prompt-type", "llama3", "--variable-seq-lengths",
            "--load", str(load), "--finetune", "--bf16", "--use-flash-attn", "--deterministic-mode",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1e-6", "--lr-decay-style", "cosine",
            "--weight-decay", "0.1", "--initial-loss-scale", "4096", "--train-iters", str(ITERS),
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "2000"]


def qwen3_30b_a3b_full_script(data, load, save) -> list[str]:
    """tune_qwen3_30b_a3b_4K_full_ptd.sh: 48 layers / 2048 hidden / 8192 FFN / 768 expert FFN / 32 heads /
    4 groups / 128 kv channels / 151936 vocab, 128 experts top-8, seq 4096, MBS 4 / GBS 64 over TP 4 / PP 2 /
    EP 2 -> 2 / 64 / 128 / 32 / 4 / 2 / 32 / 1536, 4 experts top-2, seq 64, MBS 1 / GBS 2 on one."""
    tune = ["--finetune", "--stage", "sft", "--is-instruction-dataset", "--tokenizer-not-use-fast",
            "--prompt-type", "qwen3", "--variable-seq-lengths"]
    gpt = ["--use-mcore-models", "--spec", "mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec",
           "--kv-channels", "32", "--qk-layernorm", "--norm-topk-prob", "--tokenizer-name-or-path", TOKENIZER,
           "--max-position-embeddings", "64", "--num-layers", "2", "--hidden-size", "64",
           "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--tokenizer-type", "PretrainedFromHF",
           "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1536", "--rotary-base", "1000000",
           "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--position-embedding-type", "rope",
           "--normalization", "RMSNorm", "--swiglu", "--attention-softmax-in-fp32",
           "--no-gradient-accumulation-fusion", "--group-query-attention", "--num-query-groups", "2"]
    data_args = ["--data-path", data, "--split", "100,0,0"]
    moe = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-intermediate-size", "32",
           "--moe-ffn-hidden-size", "32", "--moe-grouped-gemm", "--moe-permutation-async-comm",
           "--moe-token-dispatcher-type", "alltoall_seq", "--moe-router-load-balancing-type", "aux_loss",
           "--moe-aux-loss-coeff", "0.001"]
    output = ["--log-interval", "1", "--save-interval", str(ITERS), "--eval-interval", str(ITERS),
              "--eval-iters", "0", "--no-load-optim", "--no-load-rng"]
    optimize = ["--use-flash-attn", "--use-fused-rotary-pos-emb", "--sequence-parallel",
                "--use-rotary-position-embeddings", "--use-fused-swiglu", "--use-fused-rmsnorm",
                "--no-masked-softmax-fusion", "--use-distributed-optimizer"]
    train = ["--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1.25e-5", "--lr-decay-style", "cosine",
             "--min-lr", "1.25e-7", "--weight-decay", "1e-1", "--lr-warmup-fraction", "0.01",
             "--attention-dropout", "0.0", "--init-method-std", "0.01", "--hidden-dropout", "0.0",
             "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--initial-loss-scale", "4096",
             "--seed", "42", "--bf16", "--train-iters", str(ITERS), "--seq-length", "64", "--no-shared-storage"]
    parallel = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
                "--expert-model-parallel-size", "1"]
    return (tune + gpt + data_args + moe + output + optimize + train + parallel
            + ["--load", str(load), "--save", str(save), "--distributed-backend", "nccl"])


def qwen3_moe_full_ours(data, load) -> list[str]:
    """The same Qwen3-MoE full fine-tuning in Megatron's and our flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "32", "--qk-layernorm",
            "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm",
            "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "1000000", "--seq-length", "64",
            "--max-position-embeddings", "64", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--init-method-std", "0.01", "--attention-softmax-in-fp32",
            "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", "alltoall", "--moe-router-load-balancing-type", "aux_loss",
            "--moe-aux-loss-coeff", "0.001", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
            TOKENIZER, "--padded-vocab-size", "1536", "--data-path", data, "--split", "100,0,0",
            "--is-instruction-dataset", "--prompt-type", "qwen3", "--variable-seq-lengths",
            "--load", str(load), "--finetune", "--bf16", "--use-flash-attn", "--use-fused-rmsnorm",
            "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-distributed-optimizer",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "1.25e-5", "--min-lr", "1.25e-7",
            "--lr-decay-style", "cosine", "--lr-warmup-fraction", "0.01", "--weight-decay", "0.1",
            "--adam-beta2", "0.95", "--initial-loss-scale", "4096", "--seed", "42", "--train-iters", str(ITERS),
            "--log-interval", "1", "--eval-iters", "0", "--eval-interval", str(ITERS)]


@prefetched
def full_tune_runs(tmp_path_factory, instructions):
    """Both full tune scripts and their twins, two at a time: {"llama31": (theirs, ours, save), "qwen3_moe": ...}."""
    tmp = tmp_path_factory.mktemp("full_tune")
    llama_data, llama_tokenizer = instructions["llama3"]
    qwen3_data = instructions["qwen3"][0]
    posttrain = dict(script="posttrain_gpt.py", env=EAGER)
    runs = side_by_side(
        lambda: run_pretrain(llama31_8b_full_script(llama_data, llama_tokenizer, tmp / "none", tmp / "llama31"),
                             **posttrain),
        lambda: run_pretrain(llama31_full_ours(llama_data, llama_tokenizer, tmp / "none"), **posttrain),
        lambda: run_pretrain(qwen3_30b_a3b_full_script(qwen3_data, tmp / "none", tmp / "qwen3_moe"), **posttrain),
        lambda: run_pretrain(qwen3_moe_full_ours(qwen3_data, tmp / "none"), **posttrain))
    return {"llama31": (*runs[:2], tmp / "llama31"), "qwen3_moe": (*runs[2:], tmp / "qwen3_moe")}


def assert_tuned_alike(theirs, ours, save) -> None:
    """Equal loss and gradient-norm curves, and the script's checkpoint written at its last iteration."""
    assert_trained_alike(theirs, ours)
    grad_norms = [GRAD_NORM.findall(run.output) for run in (theirs, ours)]
    assert len(grad_norms[0]) == ITERS and grad_norms[0] == grad_norms[1], grad_norms
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)


def test_llama31_8b_full_tune_script_trains_like_our_flags(full_tune_runs):
    theirs, ours, save = full_tune_runs["llama31"]
    assert_tuned_alike(theirs, ours, save)
    for said in ("--rope-scaling-type llama3: --use-rope-scaling", "--npu-deterministic: --deterministic-mode",
                 "--tokenizer-not-use-fast -> --tokenizer-hf-no-use-fast"):
        assert said in theirs.output, said


def test_qwen3_30b_a3b_full_tune_script_trains_like_our_flags(full_tune_runs):
    theirs, ours, save = full_tune_runs["qwen3_moe"]
    assert_tuned_alike(theirs, ours, save)
    for said in ("--spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec: MindSpeed-LLM's Qwen3 layer spec",
                 "--moe-intermediate-size -> --moe-ffn-hidden-size", "--norm-topk-prob is not applied here",
                 "--moe-token-dispatcher-type alltoall_seq -> --moe-token-dispatcher-type alltoall"):
        assert said in theirs.output, said


def dpo_llama3_8b_lora_script(data, tokenizer, load, lora_dir) -> list[str]:
    """dpo_llama3_8b_lora_ptd.sh: 32 layers / 4096 hidden / 14336 FFN / 32 heads / 8 groups / 128256 vocab, seq
    2048, GBS 32 over PP 8 -> 2 / 64 / 128 / 4 / 2 / the Llama 3 sample tokenizer's 1439, seq 128, GBS 2 over PP 2.
    Its adapters load from and save to one directory (``--lora-load`` = ``--save``), empty on a first run."""
    gpt = ["--lora-load", str(lora_dir), "--lora-r", "16", "--lora-alpha", "32", "--lora-target-modules",
           "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "--sequence-parallel",
           "--use-fused-rotary-pos-emb", "--npu-deterministic", "--variable-seq-lengths",
           "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2", "--use-mcore-models",
           "--micro-batch-size", "1", "--global-batch-size", "2", "--use-flash-attn",
           "--use-rotary-position-embeddings", "--use-fused-rmsnorm", "--use-fused-swiglu",
           "--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", tokenizer, "--num-layers", "2",
           "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--group-query-attention",
           "--num-query-groups", "2", "--seq-length", "128", "--max-position-embeddings", "128",
           "--make-vocab-size-divisible-by", "1", "--padded-vocab-size", "1439",
           "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--attention-dropout", "0.0",
           "--init-method-std", "0.01", "--hidden-dropout", "0.0", "--position-embedding-type", "rope",
           "--rotary-base", "500000", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5", "--swiglu",
           "--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--lr", "5e-6", "--train-iters", str(ITERS),
           "--lr-decay-style", "constant", "--min-lr", "0.0", "--weight-decay", "0.0", "--lr-warmup-fraction", "0.0",
           "--clip-grad", "1.0", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--initial-loss-scale", "4096",
           "--no-gradient-accumulation-fusion", "--no-load-optim", "--no-load-rng", "--bf16", "--finetune"]
    data_args = ["--data-path", data, "--split", "100,0,0", "--prompt-type", "llama3", "--is-instruction-dataset"]
    output = ["--log-interval", "1", "--save-interval", "2000", "--eval-interval", "2000", "--eval-iters", "0"]
    rl = ["--stage", "dpo", "--dpo-loss-type", "sigmoid", "--is-pairwise-dataset"]
    return gpt + data_args + output + rl + ["--distributed-backend", "nccl", "--load", str(load),
                                            "--save", str(lora_dir)]


def dpo_llama3_lora_ours(data, tokenizer, load) -> list[str]:
    """The same LoRA DPO in Megatron's and our flags."""
    return ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--normalization", "RMSNorm", "--swiglu",
            "--position-embedding-type", "rope", "--rotary-base", "500000", "--seq-length", "128",
            "--max-position-embeddings", "128", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--init-method-std", "0.01", "--attention-softmax-in-fp32", "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", tokenizer, "--padded-vocab-size", "1439", "--data-path", data, "--split", "100,0,0",
            "--prompt-type", "llama3", "--stage", "dpo", "--is-pairwise-dataset", "--lora-r", "16",
            "--lora-alpha", "32", "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2",
            "--pipeline-model-parallel-size", "2", "--load", str(load), "--finetune", "--bf16", "--use-flash-attn",
            "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--deterministic-mode", "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "5e-6",
            "--lr-decay-style", "constant", "--weight-decay", "0", "--adam-beta2", "0.999",
            "--initial-loss-scale", "4096", "--train-iters", str(ITERS), "--log-interval", "1", "--eval-iters", "0",
            "--eval-interval", "2000"]


@prefetched
def dpo_runs(tmp_path_factory, instructions):
    """The LoRA DPO script at PP2 and its twin, side by side, on the sample pairs in Llama 3's template."""
    tmp = tmp_path_factory.mktemp("dpo")
    tokenizer = instructions["llama3"][1]
    proc = run_tool("preprocess_data.py", "--input", EXAMPLES / "data" / "sample_pairs.jsonl",
                    "--tokenizer-name-or-path", tokenizer, "--output-prefix", tmp / "pairs",
                    "--handler-name", "AlpacaStylePairwiseHandler", "--tokenizer-type", "PretrainedFromHF",
                    "--workers", "1", "--log-interval", "1000", "--prompt-type", "llama3", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = str(tmp / "pairs")
    posttrain = dict(script="posttrain_gpt.py", env=EAGER, nproc=2)
    theirs, ours = side_by_side(
        lambda: run_pretrain(dpo_llama3_8b_lora_script(data, tokenizer, tmp / "none", tmp / "lora"), **posttrain),
        lambda: run_pretrain(dpo_llama3_lora_ours(data, tokenizer, tmp / "none"), **posttrain))
    return theirs, ours, tmp / "lora"


DPO_LOSS = re.compile(r"iteration\s+\d+/\s*\d+ .*?dpo loss: ([0-9.Ee+-]+) ")
MARGINS = re.compile(r"iteration\s+1/\s*\d+ .*?rewards/margins: ([0-9.Ee+-]+) ")


def test_llama3_8b_lora_dpo_script_trains_like_our_flags(dpo_runs):
    """LoRA DPO through the pipeline (PP2): the same DPO losses, margins and gradient norms, the first loss
    ln 2 (the reference is the base with its adapters off, equal to the policy while B is zero), and the
    adapters saved where the script's --save points."""
    theirs, ours, lora_dir = dpo_runs
    for run in (theirs, ours):
        assert run.returncode == 0, tail(run.output)
    losses = [DPO_LOSS.findall(run.output) for run in (theirs, ours)]
    assert len(losses[0]) == ITERS and losses[0] == losses[1], losses
    assert abs(float(losses[0][0]) - 0.6931472) <= 1e-6 and float(MARGINS.search(theirs.output)[1]) == 0, losses
    grad_norms = [GRAD_NORM.findall(run.output) for run in (theirs, ours)]
    assert len(grad_norms[0]) == ITERS and grad_norms[0] == grad_norms[1], grad_norms
    for said in ("--npu-deterministic: --deterministic-mode", "--is-instruction-dataset with --is-pairwise-dataset"):
        assert said in theirs.output, said
    assert (lora_dir / "latest_checkpointed_iteration.txt").read_text().strip() == str(ITERS)
