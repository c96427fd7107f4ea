#!/usr/bin/env bash
# Pretrain a DeepSeek-V3-shaped model (MLA + MoE + MTP) with Megatron's own loop on NPU, GPU or CPU.
#
#   bash examples/deepseek_v3/pretrain.sh          # tiny model, 2 processes, expert parallel 2, embedded corpus (CPU-friendly)
#   MODEL_SIZE=671b NNODES=... NPROC=8 TP=... PP=... EP=... DATA_PATH=/data/corpus_text_document \
#       TOKENIZER_MODEL=/models/DeepSeek-V3 bash examples/deepseek_v3/pretrain.sh
#
# MODEL_SIZE=671b carries DeepSeek-V3's published architecture (61 layers, hidden 7168, 128 heads,
# MLA q/kv LoRA ranks 1536/512, qk head dim 128 + rope 64, v 128, 256 routed experts top-8 in 8
# groups top-4, sigmoid scores with expert bias, scaling 2.5, one shared expert of 2048, first 3
# layers dense, 1 MTP layer, YaRN factor 40 over 4096, vocabulary 129280) for reference; choose
# TP/PP/EP for your cluster.
#
# Environment overrides (defaults in brackets):
#   MODEL_SIZE tiny|671b [tiny]   NPROC processes per node [2 tiny, 8 otherwise]   NNODES [1]  NODE_RANK [0]
#   MASTER_ADDR [127.0.0.1]  MASTER_PORT [29500]   TP [1]  PP [1]  EP [2 tiny, 8 otherwise]
#   DATA_PATH Megatron dataset prefix or blend ["0.7 a 0.3 b"]; unset: the embedded corpus
#     examples/data/sample_corpus.jsonl, tokenized once by tools/preprocess_data.py into DATA_CACHE
#     [<repo>/.cache/data] and reused while the corpus and tokenizer are unchanged
#   TOKENIZER_TYPE [HuggingFaceTokenizer]  TOKENIZER_MODEL [examples/data/tokenizer without DATA_PATH]
#   MOCK_DATA=1 random tokens instead (NullTokenizer, VOCAB_SIZE [4096 tiny, 129280 otherwise])
#   DISPATCHER alltoall|allgather [alltoall]   GROUPED_GEMM [1]: --moe-grouped-gemm
#   SEQ_LEN  MBS micro batch  GBS global batch  TRAIN_ITERS  LR  MIN_LR  WARMUP
#   PRECISION bf16|fp16|fp32 [bf16 for 671b, fp32 for tiny]   SAVE  LOAD  SAVE_INTERVAL
#   CKPT_FORMAT [safetensors] checkpoint format for SAVE (safetensors, torch_dist, torch)
#   ADAPTOR_BACKEND npu|cuda|cpu to override detection.
# Anything after the script's name is passed to pretrain_gpt.py verbatim and wins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCRIPT=examples/deepseek_v3/pretrain.sh
PYTHON="${PYTHON:-python}"
# shellcheck source=../common.sh
. "$ROOT/examples/common.sh"
MODEL_SIZE="${MODEL_SIZE:-tiny}"

case "$MODEL_SIZE" in
  tiny)
    # layers hidden dense-ffn heads q-lora kv-lora qk-nope qk-rope v experts topk groups group-topk expert-ffn shared-ffn dense-first mtp yarn-factor yarn-original vocab
    SHAPE=(4 128 384 4 64 32 32 16 32 8 2 2 1 64 64 1 1 4 32 4096)
    DEF_SEQ=128; DEF_MBS=2; DEF_GBS=16; DEF_ITERS=60; DEF_LR=3e-3; DEF_PREC=fp32; DEF_NPROC=2; DEF_EP=2 ;;
  671b)
    SHAPE=(61 7168 18432 128 1536 512 128 64 128 256 8 8 4 2048 2048 3 1 40 4096 129280)
    DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=4096; DEF_ITERS=10000; DEF_LR=2.2e-4; DEF_PREC=bf16; DEF_NPROC=8; DEF_EP=8 ;;
  *) die "MODEL_SIZE must be tiny or 671b (got '$MODEL_SIZE')" ;;
esac
read -r LAYERS HIDDEN FFN HEADS Q_LORA KV_LORA QK_NOPE QK_ROPE V_DIM EXPERTS TOPK ROUTER_GROUPS GROUP_TOPK \
  EXPERT_FFN SHARED_FFN DENSE_FIRST MTP YARN_FACTOR YARN_ORIGINAL DEF_VOCAB <<<"${SHAPE[*]}"

NPROC="${NPROC:-$DEF_NPROC}"; TP="${TP:-1}"; PP="${PP:-1}"; EP="${EP:-$DEF_EP}"
SEQ_LEN="${SEQ_LEN:-$DEF_SEQ}"; MBS="${MBS:-$DEF_MBS}"; GBS="${GBS:-$DEF_GBS}"
TRAIN_ITERS="${TRAIN_ITERS:-$DEF_ITERS}"; LR="${LR:-$DEF_LR}"
PRECISION="${PRECISION:-$DEF_PREC}"
launch_defaults

MODEL_ARGS=(
  --num-layers "$LAYERS" --hidden-size "$HIDDEN" --ffn-hidden-size "$FFN" --num-attention-heads "$HEADS"
  # Multi-latent attention with YaRN RoPE
  --multi-latent-attention --q-lora-rank "$Q_LORA" --kv-lora-rank "$KV_LORA"
  --qk-head-dim "$QK_NOPE" --qk-pos-emb-head-dim "$QK_ROPE" --v-head-dim "$V_DIM" --qk-layernorm
  --position-embedding-type rope --rope-type yarn --rotary-base 10000 --rotary-scaling-factor "$YARN_FACTOR"
  --yarn-original-max-position-embeddings "$YARN_ORIGINAL" --yarn-beta-fast 32 --yarn-beta-slow 1
  --mscale 1.0 --mscale-all-dim 1.0
  --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear --untie-embeddings-and-output-weights
  --seq-length "$SEQ_LEN" --max-position-embeddings "$SEQ_LEN"
  --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.006
  # Mixture of experts: dense first layers, shared expert, group-limited sigmoid routing with expert bias
  --num-experts "$EXPERTS" --moe-router-topk "$TOPK" --moe-ffn-hidden-size "$EXPERT_FFN"
  --moe-shared-expert-intermediate-size "$SHARED_FFN" --moe-layer-freq "([0]*$DENSE_FIRST+[1]*$(( LAYERS - DENSE_FIRST )))"
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3
  --moe-router-num-groups "$ROUTER_GROUPS" --moe-router-group-topk "$GROUP_TOPK" --moe-router-topk-scaling-factor 2.5
  --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 --moe-router-dtype fp32
  --moe-token-dispatcher-type "${DISPATCHER:-alltoall}"
  # Multi-token prediction
  --mtp-num-layers "$MTP" --mtp-loss-scaling-factor 0.1
)
[ "${GROUPED_GEMM:-1}" = 1 ] && MODEL_ARGS+=(--moe-grouped-gemm)

prepare_sample_corpus
data_args "$DEF_VOCAB"
# DeepSeek-V3's 129280 = 3232 * 40: no padding of the published vocabulary.
[ "$MODEL_SIZE" = 671b ] && DATA_ARGS+=(--make-vocab-size-divisible-by 3232)

TRAIN_ARGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP" --expert-model-parallel-size "$EP"
  --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$TRAIN_ITERS"
  --lr "$LR" --min-lr "$MIN_LR" --lr-decay-style cosine --lr-warmup-iters "$WARMUP"
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
  --seed 1234 --log-interval "${LOG_INTERVAL:-5}" --eval-interval "${EVAL_INTERVAL:-1000000}" --eval-iters 0
  --log-throughput
)
# Megatron trains MoE with tensor parallelism only together with sequence parallelism.
[ "$TP" -gt 1 ] && TRAIN_ARGS+=(--sequence-parallel)
precision_args TRAIN_ARGS
if [ "$NPROC" -gt 1 ] || [ "$NNODES" -gt 1 ]; then TRAIN_ARGS+=(--use-distributed-optimizer); fi
checkpoint_args TRAIN_ARGS

launch "$ROOT/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${TRAIN_ARGS[@]}" "$@"
