#!/usr/bin/env bash
# Train a Qwen3-VL (vision tower with a learned position table and deepstack features, merger, decoder with
# q/k RMSNorm and interleaved M-RoPE) with Megatron's own loop through pretrain_mm.py, sharded by FSDP2 over
# the data-parallel ranks as MindSpeed-MM trains it, from MindSpeed-MM's model.json and data.json, on NPU,
# GPU or CPU.
#
#   bash examples/qwen3vl/pretrain.sh        # tiny random model on the sample conversations, 2 CPU processes
#   NPROC=1 FSDP2=0 bash examples/qwen3vl/pretrain.sh    # one process, no sharding (the same curve)
#   MM_MODEL=my/model_8B.json MM_DATA=my/data_8B.json TOKENIZER_MODEL=/models/Qwen3-VL-8B-Instruct NPROC=8 \
#       SEQ_LEN=2048 MBS=1 GBS=64 TRAIN_ITERS=5000 LR=1e-5 PRECISION=bf16 bash examples/qwen3vl/pretrain.sh
#
# The default model.json describes a tiny random Qwen3-VL by its shape keys; MindSpeed-MM's own files
# (999999 for the shape keys, init_from_hf_path naming the Hugging Face directory, a "patch" section) are
# read as they are (docs/multimodal.md). Without MM_DATA the sample conversations are drawn into
# examples/qwen3vl/data by tools/make_sample_vl_data.py on the first run.
#
# Environment overrides (defaults in brackets):
#   MM_MODEL model.json [examples/qwen3vl/model.json]   MM_DATA data.json [examples/qwen3vl/data.json]
#   TOKENIZER_MODEL [the data's tokenizer: examples/qwen3vl/data/tokenizer]
#   NPROC processes per node [2]  NNODES [1]  NODE_RANK [0]  MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]
#   FSDP2 1 shards the vision blocks and decoder layers over the data-parallel ranks (--use-torch-fsdp2),
#     0 uses DDP + the distributed optimizer [1]; FSDP2_CONFIG a YAML plan (--fsdp2-config-path)
#   TP [1]  PP [1] (with FSDP2=0)  SEQ_LEN language-model positions, image tokens included [128]
#   MBS [4]  GBS [8]  TRAIN_ITERS [30]  LR [4e-3]  MIN_LR [LR/10]  WARMUP [TRAIN_ITERS/10]
#   PRECISION bf16|fp16|fp32 [fp32]   SAVE  LOAD  SAVE_INTERVAL  LOG_INTERVAL [10]
#   SKIP_BAD=1 count and skip bad records (--mm-skip-bad-records)
#   ADAPTOR_BACKEND npu|cuda|cpu to override detection.
# Anything after the script's name is passed to pretrain_mm.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/qwen3vl/pretrain.sh
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
PYTHON="${PYTHON:-python}"
MM_MODEL="${MM_MODEL:-$ROOT/examples/qwen3vl/model.json}"
SAMPLE="$ROOT/examples/qwen3vl/data"
if [ -z "${MM_DATA:-}" ]; then
  MM_DATA="$ROOT/examples/qwen3vl/data.json"
  if [ ! -f "$SAMPLE/train.json" ] || [ ! -f "$SAMPLE/tokenizer/tokenizer.json" ]; then
    "$PYTHON" "$ROOT/tools/make_sample_vl_data.py" --output-dir "$SAMPLE"
  fi
  TOKENIZER_MODEL="${TOKENIZER_MODEL:-$SAMPLE/tokenizer}"
fi
[ -n "${TOKENIZER_MODEL:-}" ] || die "give TOKENIZER_MODEL (the tokenizer of MM_DATA's model_name_or_path)"

NPROC="${NPROC:-2}"; TP="${TP:-1}"; PP="${PP:-1}"; FSDP2="${FSDP2:-1}"
SEQ_LEN="${SEQ_LEN:-128}"; MBS="${MBS:-4}"; GBS="${GBS:-8}"
TRAIN_ITERS="${TRAIN_ITERS:-30}"; LR="${LR:-4e-3}"
PRECISION="${PRECISION:-fp32}"
launch_defaults

mm_args ARGS

launch "$ROOT/pretrain_mm.py" "${ARGS[@]}" "$@"
