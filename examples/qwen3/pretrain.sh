#!/usr/bin/env bash
# Pretrain a Qwen3-shaped GPT with Megatron's own loop on NPU, GPU or CPU.
#
#   bash examples/qwen3/pretrain.sh                 # tiny model on the embedded corpus, CPU-friendly (~1 min)
#   MODEL_SIZE=0.6b NPROC=8 TP=1 bash examples/qwen3/pretrain.sh
#   MODEL_SIZE=8b NPROC=8 TP=4 PP=2 DATA_PATH=/data/corpus_text_document \
#       TOKENIZER_TYPE=HuggingFaceTokenizer TOKENIZER_MODEL=/models/Qwen3-8B bash examples/qwen3/pretrain.sh
#
# Environment overrides (defaults in brackets):
#   MODEL_SIZE tiny|0.6b|8b|32b [tiny]   NPROC processes per node [1]   NNODES [1]  NODE_RANK [0]
#   MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]   TP [1]  PP [1]
#   CP context-parallel size [1]  CP_COMM p2p (ring) | a2a (Ulysses) | a2a+p2p [p2p]
#     (a2a+p2p: ULYSSES Ulysses degree inside CP [2])
#   DATA_PATH Megatron dataset prefix or blend ["0.7 a 0.3 b"]; unset: the embedded corpus
#     examples/data/sample_corpus.jsonl, tokenized once by tools/preprocess_data.py into DATA_CACHE
#     [<repo>/.cache/data] and reused while the corpus and tokenizer are unchanged
#   TOKENIZER_TYPE [HuggingFaceTokenizer]  TOKENIZER_MODEL [examples/data/tokenizer without DATA_PATH]
#   MOCK_DATA=1 random tokens instead (NullTokenizer, VOCAB_SIZE [4096 tiny, 151936 otherwise])
#   SEQ_LEN  MBS micro batch  GBS global batch  TRAIN_ITERS  LR  MIN_LR  WARMUP
#   PRECISION bf16|fp16|fp32 [bf16 for 0.6b+, fp32 for tiny]   SAVE  LOAD  SAVE_INTERVAL
#   CKPT_FORMAT [safetensors] checkpoint format for SAVE (safetensors, torch_dist, torch)
#   HF_LOAD a Hugging Face directory (config.json + safetensors) to start from (--hf-load-dir): Qwen3, or any
#     family the converter knows (Llama 3, Qwen2.5, Qwen3-MoE, Mixtral, DeepSeek-V3; docs/models.md);
#     the architecture flags come from its config.json (MODEL_SIZE then picks only the schedule
#     defaults), its tokenizer is used when TOKENIZER_MODEL is unset, and a LOAD checkpoint that
#     exists wins (resume)
#   HF_SAVE directory to write the trained model to as a Hugging Face directory (--hf-save-dir)
#     HF_LOAD=/models/Qwen3-0.6B HF_SAVE=out/qwen3-0.6b-cont MODEL_SIZE=0.6b NPROC=8 bash examples/qwen3/pretrain.sh
#   FSDP2=1 shards parameters, gradients and optimizer state over the data-parallel ranks with
#     PyTorch FSDP2 (--use-torch-fsdp2) instead of DDP + the distributed optimizer;
#     FSDP2_CONFIG a YAML plan for it (--fsdp2-config-path: units, offload, recompute, ...)
#   ADAPTOR_BACKEND npu|cuda|cpu to override detection.
# Anything after the script's name is passed to pretrain_gpt.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3/pretrain.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"

qwen3_shape

NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"; CP="${CP:-1}"; CP_COMM="${CP_COMM:-p2p}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; MBS="${MBS:-$DEF_MBS}"; GBS="${GBS:-$DEF_GBS}"
TRAIN_ITERS="${TRAIN_ITERS:-$DEF_ITERS}"; LR="${LR:-$DEF_LR}"
PRECISION="${PRECISION:-$DEF_PREC}"
launch_defaults

qwen3_model_args
if [ -n "${HF_SAVE:-}" ]; then
  MODEL_ARGS+=(--hf-save-dir "$HF_SAVE")
  if [ -z "${HF_LOAD:-}" ]; then MODEL_ARGS+=(--model-type-hf qwen3); fi
fi

prepare_sample_corpus
data_args "$DEF_VOCAB"

TRAIN_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --context-parallel-size "$CP" --cp-comm-type "$CP_COMM"
  --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$TRAIN_ITERS"
  --lr "$LR" --min-lr "$MIN_LR" --lr-decay-style cosine --lr-warmup-iters "$WARMUP"
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
  --seed 1234 --log-interval "${LOG_INTERVAL:-5}" --eval-interval "${EVAL_INTERVAL:-1000000}" --eval-iters 0
  --log-throughput
)
if [ "$CP_COMM" = "a2a+p2p" ]; then
  ULYSSES="${ULYSSES:-2}"
  TRAIN_ARGS+=(--hierarchical-context-parallel-sizes "$ULYSSES" "$((CP / ULYSSES))")
fi
precision_args TRAIN_ARGS
sharding_args TRAIN_ARGS
checkpoint_args TRAIN_ARGS

launch "$ROOT/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
