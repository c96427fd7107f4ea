#!/usr/bin/env bash
# Fine-tune a Qwen3-shaped GPT on instruction data with Megatron's own loop (posttrain_gpt.py):
# supervised fine-tuning of every weight, or LoRA adapters only.
#
#   bash examples/qwen3/finetune.sh                 # tiny model, LoRA, on examples/data/sample_instructions.jsonl
#   METHOD=full bash examples/qwen3/finetune.sh     # every weight learns
#   MODEL_SIZE=8b NPROC=8 TP=4 PP=2 HF_LOAD=/models/Qwen3-8B DATA_PATH=/data/alpaca HF_SAVE=out/qwen3-8b-lora \
#       bash examples/qwen3/finetune.sh
#
# Environment overrides (defaults in brackets):
#   METHOD lora|full [lora]   LORA_R [8]  LORA_ALPHA [16]  LORA_TARGETS ["linear_qkv linear_proj linear_fc1 linear_fc2"]
#   The base model, first found: HF_LOAD a Hugging Face Qwen3 directory (--hf-load-dir; its config.json gives
#     the architecture and its tokenizer is used), BASE a Megatron checkpoint (--load with --finetune), or, for
#     MODEL_SIZE=tiny only, the tiny pretraining example's checkpoint in BASE_CACHE [<repo>/.cache/qwen3-tiny-base],
#     which examples/qwen3/pretrain.sh writes there first when it is missing (about a minute).
#   DATA_PATH an instruction dataset prefix from tools/preprocess_data.py (PREFIX_packed_input_ids_document ...);
#     unset: examples/data/sample_instructions.jsonl, rendered with PROMPT_TYPE [qwen3] and packed to SEQ_LEN,
#     tokenized once into DATA_CACHE [<repo>/.cache/data] and reused while the data and tokenizer are unchanged
#   SAVE [<repo>/.cache/qwen3-<size>-<method>]  LORA_LOAD adapters to resume from (--lora-load)
#   HF_SAVE write a Hugging Face directory at the end: a PEFT adapter for LoRA, full weights for METHOD=full
#   MODEL_SIZE tiny|0.6b|8b|32b [tiny]  NPROC [1]  TP [1]  PP [1]  SEQ_LEN  MBS  GBS  TRAIN_ITERS  LR  PRECISION
#   and the layout variables of examples/qwen3/pretrain.sh (NNODES, MASTER_ADDR, ...).
# Anything after the script's name is passed to posttrain_gpt.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3/finetune.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"
METHOD="${METHOD:-lora}"
case "$METHOD" in lora|full) ;; *) die "METHOD must be lora or full (got '$METHOD')" ;; esac

qwen3_shape
# Fine-tuning schedules: fewer steps than pretraining; LoRA takes a larger learning rate.
case "$MODEL_SIZE" in
  tiny) DEF_ITERS=40; DEF_GBS=16; DEF_LR=$([ "$METHOD" = lora ] && echo 3e-3 || echo 1e-3) ;;
  *)    DEF_ITERS=2000; DEF_GBS=64; DEF_LR=$([ "$METHOD" = lora ] && echo 1e-4 || echo 1e-5) ;;
esac
NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; MBS="${MBS:-$DEF_MBS}"; GBS="${GBS:-$DEF_GBS}"
TRAIN_ITERS="${TRAIN_ITERS:-$DEF_ITERS}"; LR="${LR:-$DEF_LR}"
PRECISION="${PRECISION:-$DEF_PREC}"
launch_defaults
qwen3_model_args

# The base model.
BASE_ARGS=()
if [ -z "${HF_LOAD:-}" ]; then
  if [ -z "${BASE:-}" ]; then
    [ "$MODEL_SIZE" = tiny ] || die "give HF_LOAD (a Hugging Face directory) or BASE (a Megatron checkpoint) for MODEL_SIZE=$MODEL_SIZE"
    tiny_base_checkpoint
    BASE="$TINY_BASE"
  fi
  [ -d "$BASE" ] || die "BASE=$BASE is not a directory"
  # LoRA reads --load as the base model's weights only (resume state comes with --lora-load);
  # full fine-tuning starts from its weights at iteration 0
  BASE_ARGS=(--load "$BASE")
  if [ "$METHOD" = full ]; then BASE_ARGS+=(--finetune --no-load-optim --no-load-rng); fi
fi

# The instruction data: the sample set, rendered with the tokenizer's chat template and packed.
PROMPT_TYPE="${PROMPT_TYPE:-qwen3}"
if [ -z "${DATA_PATH:-}" ]; then
  TOKENIZER_MODEL="${TOKENIZER_MODEL:-$ROOT/examples/data/tokenizer}"
  SAMPLES="$ROOT/examples/data/sample_instructions.jsonl"
  key=$(cat "$SAMPLES" "$TOKENIZER_MODEL"/tokenizer*.json "$ROOT"/tools/{preprocess_data,instruction_data,chat_template,indexed_writer,text_readers}.py \
        | { cat; echo "$PROMPT_TYPE $SEQ_LEN"; } | sha256sum | cut -c1-12)
  DATA_CACHE="${DATA_CACHE:-$ROOT/.cache/data}"
  DATA_PATH="$DATA_CACHE/sample_instructions-$key"
  if [ ! -f "${DATA_PATH}_packed_input_ids_document.idx" ]; then
    mkdir -p "$DATA_CACHE"
    "$PYTHON" "$ROOT/tools/preprocess_data.py" --input "$SAMPLES" --output-prefix "$DATA_PATH" \
      --handler-name AlpacaStyleInstructionHandler --prompt-type "$PROMPT_TYPE" \
      --tokenizer-type PretrainedFromHF --tokenizer-name-or-path "$TOKENIZER_MODEL" --pack --seq-length "$SEQ_LEN"
  fi
fi
DATA_ARGS=(--data-path "$DATA_PATH" --split 100,0,0 --is-instruction-dataset --prompt-type "$PROMPT_TYPE"
           --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}")
if [ -n "${TOKENIZER_MODEL:-}" ]; then DATA_ARGS+=(--tokenizer-model "$TOKENIZER_MODEL"); fi

TUNE_ARGS=(--stage sft --variable-seq-lengths)
if [ "$METHOD" = lora ]; then
  # shellcheck disable=SC2206  # the targets are several words on purpose
  TUNE_ARGS+=(--lora-r "${LORA_R:-8}" --lora-alpha "${LORA_ALPHA:-16}"
              --lora-target-modules ${LORA_TARGETS:-linear_qkv linear_proj linear_fc1 linear_fc2})
  if [ -n "${LORA_LOAD:-}" ]; then TUNE_ARGS+=(--lora-load "$LORA_LOAD"); fi
fi
if [ -n "${HF_SAVE:-}" ]; then
  TUNE_ARGS+=(--hf-save-dir "$HF_SAVE")
  if [ -z "${HF_LOAD:-}" ]; then TUNE_ARGS+=(--model-type-hf qwen3); fi
fi

SAVE="${SAVE:-$ROOT/.cache/qwen3-$MODEL_SIZE-$METHOD}"
TRAIN_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$TRAIN_ITERS"
  --lr "$LR" --min-lr "$MIN_LR" --lr-decay-style cosine --lr-warmup-iters "$WARMUP"
  --weight-decay 0.0 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
  --seed 1234 --log-interval "${LOG_INTERVAL:-5}" --eval-interval "${EVAL_INTERVAL:-1000000}" --eval-iters 0
  --save "$SAVE" --save-interval "${SAVE_INTERVAL:-$TRAIN_ITERS}" --ckpt-format "${CKPT_FORMAT:-safetensors}"
)
precision_args TRAIN_ARGS
if [ "$NPROC" -gt 1 ] || [ "$NNODES" -gt 1 ]; then TRAIN_ARGS+=(--use-distributed-optimizer); fi

launch "$ROOT/posttrain_gpt.py" "${MODEL_ARGS[@]}" "${BASE_ARGS[@]}" "${DATA_ARGS[@]}" "${TUNE_ARGS[@]}" \
  "${TRAIN_ARGS[@]}" "$@"
