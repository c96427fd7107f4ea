#!/usr/bin/env bash
# Pretrain a vision-language model (CLIP-style ViT, MLP projector, Qwen3-style decoder) with
# Megatron's own loop through pretrain_mm.py, on NPU, GPU or CPU.
#
#   bash examples/vlm/pretrain.sh            # tiny model on the embedded shapes dataset, CPU (~1 min)
#   NPROC=2 TP=2 bash examples/vlm/pretrain.sh
#   MM_MODEL=my/model.json MM_DATA=my/data.json TOKENIZER_MODEL=/models/Qwen3-0.6B NPROC=8 \
#       SEQ_LEN=1024 MBS=4 GBS=256 TRAIN_ITERS=5000 PRECISION=bf16 bash examples/vlm/pretrain.sh
#
# Environment overrides (defaults in brackets):
#   MM_MODEL model.json [examples/vlm/model.json]   MM_DATA data.json [examples/vlm/data.json]
#   TOKENIZER_MODEL [examples/data/tokenizer]      (--tokenizer-type HuggingFaceTokenizer)
#   NPROC processes per node [1]  NNODES [1]  NODE_RANK [0]  MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]
#   TP [1]   SEQ_LEN language-model positions, image embeddings included [48]
#   MBS [8]  GBS [16]  TRAIN_ITERS [150]  LR [2e-3]  MIN_LR [LR/10]  WARMUP [TRAIN_ITERS/10]
#   PRECISION bf16|fp16|fp32 [fp32]   SAVE  LOAD  SAVE_INTERVAL   LOG_INTERVAL [10]
#   SKIP_BAD=1 count and skip bad records (--mm-skip-bad-records)
#   FSDP2=1 shard the model over the data-parallel ranks with FSDP2 (--use-torch-fsdp2) instead of
#     DDP + the distributed optimizer; FSDP2_CONFIG a YAML plan (--fsdp2-config-path), e.g.
#     examples/vlm/fsdp2_frozen_tower.yaml leaves a frozen vision tower out of sharding
#   ADAPTOR_BACKEND npu|cuda|cpu to override detection.
# Anything after the script's name is passed to pretrain_mm.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/vlm/pretrain.sh
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MM_MODEL="${MM_MODEL:-$ROOT/examples/vlm/model.json}"
MM_DATA="${MM_DATA:-$ROOT/examples/vlm/data.json}"
TOKENIZER_MODEL="${TOKENIZER_MODEL:-$ROOT/examples/data/tokenizer}"

NPROC="${NPROC:-1}"; TP="${TP:-1}"
SEQ_LEN="${SEQ_LEN:-48}"; MBS="${MBS:-8}"; GBS="${GBS:-16}"
TRAIN_ITERS="${TRAIN_ITERS:-150}"; LR="${LR:-2e-3}"
PRECISION="${PRECISION:-fp32}"
launch_defaults

mm_args ARGS

launch "$ROOT/pretrain_mm.py" "${ARGS[@]}" "$@"
