#!/usr/bin/env bash
# Preference-train (DPO) a Qwen3-shaped GPT with Megatron's own loop (posttrain_gpt.py --stage dpo), from
# the supervised fine-tuning example's model; the reference is that model, frozen (LoRA: without adapters).
#
#   bash examples/qwen3/dpo.sh                       # tiny model, every weight, on examples/data/sample_pairs.jsonl
#   METHOD=lora bash examples/qwen3/dpo.sh           # LoRA adapters only
#   PACK=1 bash examples/qwen3/dpo.sh                # several whole pairs per sample of SEQ_LEN tokens
#   MODEL_SIZE=8b NPROC=8 TP=8 HF_LOAD=/models/Qwen3-8B DATA_PATH=/data/pairs bash examples/qwen3/dpo.sh
#
# Environment overrides (defaults in brackets):
#   METHOD full|lora [full]  LOSS sigmoid|hinge|ipo [sigmoid]  BETA [0.1]  SMOOTHING [0]  FTX [0] (--pref-ftx)
#   The starting model, first found: HF_LOAD a Hugging Face Qwen3 directory (--hf-load-dir), BASE a Megatron
#     checkpoint (--load with --finetune), or, for MODEL_SIZE=tiny only, the SFT example's full fine-tuning
#     checkpoint in SFT_CACHE [<repo>/.cache/qwen3-tiny-full], which METHOD=full examples/qwen3/finetune.sh
#     writes there first when it is missing.
#   REF_MODEL a reference other than the starting model (a Megatron checkpoint or a Hugging Face directory)
#   DATA_PATH a pairwise dataset prefix from tools/preprocess_data.py --handler-name AlpacaStylePairwiseHandler;
#     unset: examples/data/sample_pairs.jsonl (tools/make_sample_pairs.py) rendered with PROMPT_TYPE [qwen3],
#     tokenized once into DATA_CACHE [<repo>/.cache/data]; PACK=1 packs whole pairs into samples (GBS then
#     counts samples, and the loss is averaged over the step's pairs: --calculate-per-token-loss)
#   SAVE [<repo>/.cache/qwen3-<size>-dpo-<method>]  MODEL_SIZE tiny|0.6b|8b|32b [tiny]  NPROC [1]  TP [1]  PP [1]
#   SEQ_LEN  MBS  GBS  TRAIN_ITERS  LR  PRECISION, and the layout variables of examples/qwen3/pretrain.sh.
# Anything after the script's name is passed to posttrain_gpt.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3/dpo.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"
METHOD="${METHOD:-full}"
case "$METHOD" in lora|full) ;; *) die "METHOD must be full or lora (got '$METHOD')" ;; esac
PACK="${PACK:-0}"
case "$PACK" in 0|1) ;; *) die "PACK must be 0 or 1 (got '$PACK')" ;; esac

qwen3_shape
# DPO schedules: short, with a small learning rate (the policy must stay near its reference).
case "$MODEL_SIZE" in
  tiny) DEF_ITERS=30; DEF_GBS=16; DEF_LR=$([ "$METHOD" = lora ] && echo 1e-3 || echo 2e-4) ;;
  *)    DEF_ITERS=1000; DEF_GBS=64; DEF_LR=$([ "$METHOD" = lora ] && echo 5e-5 || echo 5e-7) ;;
esac
NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; MBS="${MBS:-$DEF_MBS}"; GBS="${GBS:-$DEF_GBS}"
TRAIN_ITERS="${TRAIN_ITERS:-$DEF_ITERS}"; LR="${LR:-$DEF_LR}"
PRECISION="${PRECISION:-$DEF_PREC}"
launch_defaults
qwen3_model_args

# The starting model (and the reference, unless REF_MODEL says otherwise).
BASE_ARGS=()
if [ -z "${HF_LOAD:-}" ]; then
  if [ -z "${BASE:-}" ]; then
    [ "$MODEL_SIZE" = tiny ] || die "give HF_LOAD (a Hugging Face directory) or BASE (a Megatron checkpoint) for MODEL_SIZE=$MODEL_SIZE"
    BASE="${SFT_CACHE:-$ROOT/.cache/qwen3-tiny-full}"
    if [ ! -f "$BASE/latest_checkpointed_iteration.txt" ]; then
      echo "[$SCRIPT] no SFT model yet: running METHOD=full examples/qwen3/finetune.sh into $BASE first"
      (unset NPROC TP PP SAVE HF_SAVE TRAIN_ITERS LR GBS MBS SEQ_LEN DATA_PATH; MODEL_SIZE=tiny METHOD=full \
        SAVE="$BASE" bash "$ROOT/examples/qwen3/finetune.sh")
    fi
  fi
  [ -d "$BASE" ] || die "BASE=$BASE is not a directory"
  BASE_ARGS=(--load "$BASE" --finetune --no-load-optim --no-load-rng)
fi

# The pairs: the sample set, rendered with the tokenizer's chat template, one pair per sample (PACK=1: several).
PROMPT_TYPE="${PROMPT_TYPE:-qwen3}"
if [ -z "${DATA_PATH:-}" ]; then
  TOKENIZER_MODEL="${TOKENIZER_MODEL:-$ROOT/examples/data/tokenizer}"
  SAMPLES="$ROOT/examples/data/sample_pairs.jsonl"
  key=$(cat "$SAMPLES" "$TOKENIZER_MODEL"/tokenizer*.json "$ROOT"/tools/{preprocess_data,pairwise_data,instruction_data,chat_template,indexed_writer,text_readers}.py \
        | { cat; echo "$PROMPT_TYPE $SEQ_LEN"; } | sha256sum | cut -c1-12)
  DATA_CACHE="${DATA_CACHE:-$ROOT/.cache/data}"
  DATA_PATH="$DATA_CACHE/sample_pairs-$key"
  PACK_ARGS=()
  if [ "$PACK" = 1 ]; then PACK_ARGS=(--pack); DATA_PATH="$DATA_CACHE/sample_pairs-packed-$key"; fi
  if [ ! -f "${DATA_PATH}_packed_chosen_input_ids_document.idx" ]; then
    mkdir -p "$DATA_CACHE"
    "$PYTHON" "$ROOT/tools/preprocess_data.py" --input "$SAMPLES" --output-prefix "$DATA_PATH" \
      --handler-name AlpacaStylePairwiseHandler --prompt-type "$PROMPT_TYPE" "${PACK_ARGS[@]}" \
      --tokenizer-type PretrainedFromHF --tokenizer-name-or-path "$TOKENIZER_MODEL" --seq-length "$((SEQ_LEN + 1))"
  fi
fi
DATA_ARGS=(--data-path "$DATA_PATH" --split 100,0,0 --is-pairwise-dataset --prompt-type "$PROMPT_TYPE"
           --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}")
if [ -n "${TOKENIZER_MODEL:-}" ]; then DATA_ARGS+=(--tokenizer-model "$TOKENIZER_MODEL"); fi

TUNE_ARGS=(--stage dpo --dpo-loss-type "${LOSS:-sigmoid}" --dpo-beta "${BETA:-0.1}"
           --dpo-label-smoothing "${SMOOTHING:-0}" --pref-ftx "${FTX:-0}")
if [ -n "${REF_MODEL:-}" ]; then TUNE_ARGS+=(--ref-model "$REF_MODEL"); fi
if [ "$METHOD" = lora ]; then
  # shellcheck disable=SC2206  # the targets are several words on purpose
  TUNE_ARGS+=(--lora-r "${LORA_R:-8}" --lora-alpha "${LORA_ALPHA:-16}"
              --lora-target-modules ${LORA_TARGETS:-linear_qkv linear_proj linear_fc1 linear_fc2})
fi

SAVE="${SAVE:-$ROOT/.cache/qwen3-$MODEL_SIZE-dpo-$METHOD}"
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
if [ "$PACK" = 1 ]; then TRAIN_ARGS+=(--calculate-per-token-loss); fi

launch "$ROOT/posttrain_gpt.py" "${MODEL_ARGS[@]}" "${BASE_ARGS[@]}" "${DATA_ARGS[@]}" "${TUNE_ARGS[@]}" \
  "${TRAIN_ARGS[@]}" "$@"
