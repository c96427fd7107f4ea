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
#   HF_LOAD a Hugging Face Qwen3 directory (config.json + safetensors) to start from (--hf-load-dir):
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

# Qwen3's published shapes: layers hidden ffn heads kv-heads head-dim tied-embeddings
case "$MODEL_SIZE" in
  tiny) SHAPE=(4 128 384 4 2 32 tied);     DEF_SEQ=128;  DEF_MBS=4; DEF_GBS=16; DEF_ITERS=60; DEF_LR=3e-3; DEF_VOCAB=4096;   DEF_PREC=fp32 ;;
  0.6b) SHAPE=(28 1024 3072 16 8 128 tied);  DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=64; DEF_ITERS=5000; DEF_LR=3e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
  8b)   SHAPE=(36 4096 12288 32 8 128 untied); DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=256; DEF_ITERS=5000; DEF_LR=3e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
  32b)  SHAPE=(64 5120 25600 64 8 128 untied); DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=512; DEF_ITERS=5000; DEF_LR=2e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
  *) die "MODEL_SIZE must be tiny, 0.6b, 8b or 32b (got '$MODEL_SIZE')" ;;
esac
read -r LAYERS HIDDEN FFN HEADS KV_HEADS HEAD_DIM TIE <<<"${SHAPE[*]}"

NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"; CP="${CP:-1}"; CP_COMM="${CP_COMM:-p2p}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; MBS="${MBS:-$DEF_MBS}"; GBS="${GBS:-$DEF_GBS}"
TRAIN_ITERS="${TRAIN_ITERS:-$DEF_ITERS}"; LR="${LR:-$DEF_LR}"
PRECISION="${PRECISION:-$DEF_PREC}"
launch_defaults

MODEL_ARGS=(
  --num-layers "$LAYERS" --hidden-size "$HIDDEN" --ffn-hidden-size "$FFN"
  --num-attention-heads "$HEADS" --group-query-attention --num-query-groups "$KV_HEADS"
  --kv-channels "$HEAD_DIM" --qk-layernorm
  --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear
  --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
  --seq-length "$SEQ_LEN" --max-position-embeddings "$SEQ_LEN"
  --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.02
)
[ "$TIE" = untied ] && MODEL_ARGS+=(--untie-embeddings-and-output-weights)

if [ -n "${HF_LOAD:-}" ]; then
  # The architecture of the Hugging Face directory; the first line is its vocabulary size.
  [ -f "$HF_LOAD/config.json" ] || die "HF_LOAD=$HF_LOAD has no config.json"
  HF_OUT="$("$PYTHON" "$ROOT/tools/hf_model_flags.py" "$HF_LOAD")" || exit 2
  mapfile -t HF_ARGS <<<"$HF_OUT"
  DEF_VOCAB="${HF_ARGS[0]}"
  MODEL_ARGS=("${HF_ARGS[@]:1}" --seq-length "$SEQ_LEN" --max-position-embeddings "$SEQ_LEN"
              --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.02 --hf-load-dir "$HF_LOAD")
  if [ -z "${TOKENIZER_MODEL:-}" ] && [ -f "$HF_LOAD/tokenizer.json" ] && [ "${MOCK_DATA:-0}" != 1 ]; then
    TOKENIZER_MODEL="$HF_LOAD"
  fi
fi
[ -n "${HF_SAVE:-}" ] && MODEL_ARGS+=(--hf-save-dir "$HF_SAVE")

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
