#!/usr/bin/env bash
# Evaluate a Qwen3-shaped Megatron checkpoint on lm-eval tasks with evaluation.py (needs pip install -e ".[eval]").
#
#   bash examples/qwen3/evaluate.sh                 # the tiny pretraining example's checkpoint, a local 16-question set
#   TASKS="sample_mc" INCLUDE=my_tasks/ bash examples/qwen3/evaluate.sh
#   MODEL_SIZE=8b NPROC=4 TP=4 LOAD=ckpt/qwen3-8b TOKENIZER_MODEL=/models/Qwen3-8B \
#       TASKS=mmlu MMLU_DIR=/data/mmlu FEWSHOT=5 bash examples/qwen3/evaluate.sh
#   HF_LOAD=/models/Qwen3-0.6B MODEL_SIZE=0.6b bash examples/qwen3/evaluate.sh
#
# Environment overrides (defaults in brackets):
#   The weights, as in examples/qwen3/generate.sh: HF_LOAD, LOAD, or for MODEL_SIZE=tiny the tiny pretraining
#     example's checkpoint in BASE_CACHE [<repo>/.cache/qwen3-tiny-base], pretrained there first when missing
#   TOKENIZER_MODEL [examples/data/tokenizer, or HF_LOAD's]   TOKENIZER_TYPE [HuggingFaceTokenizer]
#   TASKS lm-eval task names [sample_mc]; INCLUDE a folder of task YAML files (--include-path) [a temporary
#     folder where tools/make_mc_task.py writes sample_mc]; MMLU_DIR MMLU's CSV files, for TASKS=mmlu
#   FEWSHOT [0]  LIMIT documents per task  OUTPUT results.json  MBS requests per forward [8]
#   MODEL_SIZE tiny|0.6b|8b|32b [tiny]  NPROC [1]  TP [1]  PP [1]  SEQ_LEN  PRECISION
#   and the layout variables of examples/qwen3/pretrain.sh (NNODES, MASTER_ADDR, ...).
# Anything after the script's name is passed to evaluation.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3/evaluate.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"

qwen3_shape
NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; PRECISION="${PRECISION:-$DEF_PREC}"
TRAIN_ITERS=1; LR=0  # launch_defaults derives a schedule from them; evaluation.py trains nothing
launch_defaults
qwen3_model_args

# The weights: HF_LOAD, LOAD, or the tiny pretraining example's checkpoint (examples/common.sh).
generation_weights

# The tasks.
TASKS="${TASKS:-sample_mc}"
TASK_ARGS=(--task $TASKS --num-fewshot "${FEWSHOT:-0}")
if [ -z "${INCLUDE:-}" ] && [[ " $TASKS " == *" sample_mc "* ]]; then
  INCLUDE="$(mktemp -d)"
  "$PYTHON" "$ROOT/tools/make_mc_task.py" --output-dir "$INCLUDE" > /dev/null
fi
if [ -n "${INCLUDE:-}" ]; then TASK_ARGS+=(--include-path "$INCLUDE"); fi
if [ -n "${MMLU_DIR:-}" ]; then TASK_ARGS+=(--task-data-path "$MMLU_DIR"); fi
if [ -n "${LIMIT:-}" ]; then TASK_ARGS+=(--limit "$LIMIT"); fi
if [ -n "${OUTPUT:-}" ]; then TASK_ARGS+=(--eval-output-file "$OUTPUT"); fi

EVAL_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}" --tokenizer-model "$TOKENIZER_MODEL"
  --micro-batch-size "${MBS:-8}" --seed 1234
)
precision_args EVAL_ARGS

distributed "$ROOT/evaluation.py" "${MODEL_ARGS[@]}" "${WEIGHT_ARGS[@]}" "${EVAL_ARGS[@]}" "${TASK_ARGS[@]}" "$@"
