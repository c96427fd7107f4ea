#!/usr/bin/env bash
# Generate text (greedy search) from a Qwen3-shaped Megatron checkpoint with inference.py.
#
#   bash examples/qwen3/generate.sh                 # the tiny pretraining example's checkpoint, two prompts
#   PROMPT="Once upon a time" bash examples/qwen3/generate.sh
#   MODEL_SIZE=8b NPROC=4 TP=4 LOAD=ckpt/qwen3-8b TOKENIZER_MODEL=/models/Qwen3-8B \
#       INPUT=prompts.jsonl OUTPUT=out.jsonl bash examples/qwen3/generate.sh
#   HF_LOAD=/models/Qwen3-0.6B MODEL_SIZE=0.6b bash examples/qwen3/generate.sh
#
# Environment overrides (defaults in brackets):
#   The weights, first found: HF_LOAD a Hugging Face Qwen3 directory (--hf-load-dir; its config.json gives
#     the architecture and its tokenizer is used), LOAD a Megatron checkpoint (--load; any format the
#     training writes), or, for MODEL_SIZE=tiny only, the tiny pretraining example's checkpoint in
#     BASE_CACHE [<repo>/.cache/qwen3-tiny-base], which examples/qwen3/pretrain.sh writes there first when
#     it is missing (about a minute)
#   TOKENIZER_MODEL [examples/data/tokenizer, or HF_LOAD's]   TOKENIZER_TYPE [HuggingFaceTokenizer]
#   PROMPT one prompt, its continuation printed; INPUT prompts.jsonl ({"prompt": ...} per line) with
#     OUTPUT out.jsonl ({"prompt", "text", "token_ids"} per line); neither: two sample prompts, printed
#   MAX_NEW_TOKENS [32]  KV_CACHE [1] (--use-kv-cache; 0 recomputes every step, same tokens)  MBS prompts per batch [8]
#   MODEL_SIZE tiny|0.6b|8b|32b [tiny]  NPROC [1]  TP [1]  PP [1]  SEQ_LEN  PRECISION
#   and the layout variables of examples/qwen3/pretrain.sh (NNODES, MASTER_ADDR, ...).
# Anything after the script's name is passed to inference.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3/generate.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"

qwen3_shape
NPROC="${NPROC:-1}"; TP="${TP:-1}"; PP="${PP:-1}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; PRECISION="${PRECISION:-$DEF_PREC}"
TRAIN_ITERS=1; LR=0  # launch_defaults derives a schedule from them; inference.py trains nothing
launch_defaults
qwen3_model_args

# The weights: HF_LOAD, LOAD, or the tiny pretraining example's checkpoint (examples/common.sh).
generation_weights

# The prompts.
IO_ARGS=()
if [ -n "${INPUT:-}" ]; then
  [ -n "${OUTPUT:-}" ] || die "INPUT needs OUTPUT (a JSONL file to write)"
  IO_ARGS=(--input-file "$INPUT" --output-file "$OUTPUT")
elif [ -n "${PROMPT:-}" ]; then
  IO_ARGS=(--prompt "$PROMPT")
else
  INPUT="$(mktemp -d)/prompts.jsonl"; OUTPUT="${INPUT%.jsonl}_out.jsonl"
  printf '%s\n' '{"prompt": "Yara was a beekeeper who lived in"}' '{"prompt": "Twenty-four plus forty-seven is"}' > "$INPUT"
  IO_ARGS=(--input-file "$INPUT" --output-file "$OUTPUT")
  PRINT_OUTPUT=1
fi

GEN_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP"
  --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}" --tokenizer-model "$TOKENIZER_MODEL"
  --micro-batch-size "${MBS:-8}" --max-new-tokens "${MAX_NEW_TOKENS:-32}" --seed 1234
)
if [ "${KV_CACHE:-1}" = 1 ]; then GEN_ARGS+=(--use-kv-cache); fi
precision_args GEN_ARGS

distributed "$ROOT/inference.py" "${MODEL_ARGS[@]}" "${WEIGHT_ARGS[@]}" "${GEN_ARGS[@]}" "${IO_ARGS[@]}" "$@"
if [ "${PRINT_OUTPUT:-0}" = 1 ]; then cat "$OUTPUT"; fi
