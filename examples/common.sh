# Shared by the example launch scripts: sourced, never run. Each function reads the variables the
# scripts document (NPROC, NNODES, TP, PRECISION, SAVE, LOAD, ...) and fills one array of flags.
# SCRIPT (the caller's name) prefixes every error.

# die MESSAGE: one line on stderr, exit 2.
die() { echo "$SCRIPT: error: $*" >&2; exit 2; }

# launch_defaults: the process layout and LR schedule defaults every example shares.
launch_defaults() {
  NNODES="${NNODES:-1}"; NODE_RANK="${NODE_RANK:-0}"
  MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"; MASTER_PORT="${MASTER_PORT:-29500}"
  MIN_LR="${MIN_LR:-$(awk -v lr="$LR" 'BEGIN { print lr / 10 }')}"
  WARMUP="${WARMUP:-$(( TRAIN_ITERS / 10 ))}"
}

# prepare_sample_corpus: without DATA_PATH (and without MOCK_DATA=1), tokenize the embedded corpus
# once into DATA_CACHE, keyed by the content of the corpus, the tokenizer and the tools that write
# it, and point DATA_PATH and TOKENIZER_MODEL at it.
prepare_sample_corpus() {
  if [ -n "${DATA_PATH:-}" ] || [ "${MOCK_DATA:-0}" = 1 ]; then return; fi
  local corpus="$ROOT/examples/data/sample_corpus.jsonl" key prefix
  TOKENIZER_MODEL="${TOKENIZER_MODEL:-$ROOT/examples/data/tokenizer}"
  key=$(cat "$corpus" "$TOKENIZER_MODEL"/tokenizer*.json "$ROOT"/tools/{preprocess_data,indexed_writer,text_readers}.py \
        | sha256sum | cut -c1-12)
  DATA_CACHE="${DATA_CACHE:-$ROOT/.cache/data}"
  prefix="$DATA_CACHE/sample_corpus-$key"
  if [ ! -f "${prefix}_text_document.idx" ]; then
    mkdir -p "$DATA_CACHE"
    "$PYTHON" "$ROOT/tools/preprocess_data.py" --input "$corpus" --output-prefix "$prefix" \
      --json-keys text --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL" \
      --append-eod --workers 1
  fi
  DATA_PATH="${prefix}_text_document"
}

# data_args DEFAULT_VOCAB: DATA_ARGS for DATA_PATH (a prefix or a blend) or, without it, mock data.
data_args() {
  if [ -n "${DATA_PATH:-}" ]; then
    # shellcheck disable=SC2206  # a blend "0.7 a 0.3 b" is several words on purpose
    DATA_ARGS=(--data-path ${DATA_PATH} --split 98,2,0 --tokenizer-type "${TOKENIZER_TYPE:-HuggingFaceTokenizer}")
    if [ -n "${TOKENIZER_MODEL:-}" ]; then DATA_ARGS+=(--tokenizer-model "$TOKENIZER_MODEL"); fi
  else
    DATA_ARGS=(--mock-data --tokenizer-type "${TOKENIZER_TYPE:-NullTokenizer}" --vocab-size "${VOCAB_SIZE:-$1}")
  fi
}

# precision_args ARRAY: append --bf16/--fp16 for PRECISION to the named array.
precision_args() {
  local -n out="$1"
  case "$PRECISION" in bf16) out+=(--bf16) ;; fp16) out+=(--fp16) ;; fp32) ;;
    *) die "PRECISION must be bf16, fp16 or fp32 (got '$PRECISION')" ;; esac
}

# sharding_args ARRAY: FSDP2=1 (with FSDP2_CONFIG) or, on several processes, the distributed optimizer.
sharding_args() {
  local -n out="$1"
  if [ "${FSDP2:-0}" = 1 ]; then
    out+=(--use-torch-fsdp2)
    if [ -n "${FSDP2_CONFIG:-}" ]; then out+=(--fsdp2-config-path "$FSDP2_CONFIG"); fi
  elif [ -n "${FSDP2_CONFIG:-}" ]; then
    die "FSDP2_CONFIG needs FSDP2=1"
  elif [ "$NPROC" -gt 1 ] || [ "$NNODES" -gt 1 ]; then
    out+=(--use-distributed-optimizer)
  fi
}

# checkpoint_args ARRAY: SAVE (every SAVE_INTERVAL, default the last iteration), CKPT_FORMAT, LOAD.
checkpoint_args() {
  local -n out="$1"
  if [ -n "${SAVE:-}" ]; then out+=(--save "$SAVE" --save-interval "${SAVE_INTERVAL:-$TRAIN_ITERS}"); fi
  out+=(--ckpt-format "${CKPT_FORMAT:-safetensors}")
  if [ -n "${LOAD:-}" ]; then out+=(--load "$LOAD"); fi
}

# mm_args ARRAY: fill the named array with pretrain_mm.py's flags from MM_MODEL, MM_DATA, TOKENIZER_MODEL,
# the layout (TP, PP), the batch and schedule variables, PRECISION, FSDP2, checkpoints and SKIP_BAD.
mm_args() {
  local -n out="$1"
  out=(
    --mm-model "$MM_MODEL" --mm-data "$MM_DATA"
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL"
    --seq-length "$SEQ_LEN" --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "${PP:-1}"
    --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$TRAIN_ITERS"
    --lr "$LR" --min-lr "$MIN_LR" --lr-decay-style cosine --lr-warmup-iters "$WARMUP"
    --weight-decay 0.01 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
    --seed 1234 --log-interval "${LOG_INTERVAL:-10}" --eval-interval 1000000 --eval-iters 0
    --log-throughput
  )
  precision_args "$1"
  sharding_args "$1"
  checkpoint_args "$1"
  if [ "${SKIP_BAD:-0}" = 1 ]; then out+=(--mm-skip-bad-records); fi
}

# distributed ENTRY ARGS...: torchrun ENTRY on this node with the layout variables. ADAPTOR_TORCHRUN,
# split into words, replaces `torchrun` (a cluster's launcher wrapper, as for the tools).
distributed() {
  local -a runner
  read -r -a runner <<< "${ADAPTOR_TORCHRUN:-torchrun}"
  export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}"
  ${EXEC:-} "${runner[@]}" --nproc_per_node "$NPROC" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$@"
}

# launch ENTRY ARGS...: `distributed`, replacing the shell.
launch() {
  EXEC=exec distributed "$@"
}

# qwen3_shape: for MODEL_SIZE, Qwen3's published shape (LAYERS HIDDEN FFN HEADS KV_HEADS HEAD_DIM TIE)
# and the example's defaults (DEF_SEQ DEF_MBS DEF_GBS DEF_ITERS DEF_LR DEF_VOCAB DEF_PREC).
qwen3_shape() {
  # Qwen3's published shapes: layers hidden ffn heads kv-heads head-dim tied-embeddings
  case "$MODEL_SIZE" in
    tiny) SHAPE=(4 128 384 4 2 32 tied);     DEF_SEQ=128;  DEF_MBS=4; DEF_GBS=16; DEF_ITERS=60; DEF_LR=3e-3; DEF_VOCAB=4096;   DEF_PREC=fp32 ;;
    0.6b) SHAPE=(28 1024 3072 16 8 128 tied);  DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=64; DEF_ITERS=5000; DEF_LR=3e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
    8b)   SHAPE=(36 4096 12288 32 8 128 untied); DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=256; DEF_ITERS=5000; DEF_LR=3e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
    32b)  SHAPE=(64 5120 25600 64 8 128 untied); DEF_SEQ=4096; DEF_MBS=1; DEF_GBS=512; DEF_ITERS=5000; DEF_LR=2e-4; DEF_VOCAB=151936; DEF_PREC=bf16 ;;
    *) die "MODEL_SIZE must be tiny, 0.6b, 8b or 32b (got '$MODEL_SIZE')" ;;
  esac
  read -r LAYERS HIDDEN FFN HEADS KV_HEADS HEAD_DIM TIE <<<"${SHAPE[*]}"
}

# qwen3_model_args: MODEL_ARGS for the shape (or, with HF_LOAD, for that Hugging Face directory's
# config.json, whose tokenizer is used when TOKENIZER_MODEL is unset).
qwen3_model_args() {
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
}

# TINY_BASE: the tiny pretraining example's checkpoint in BASE_CACHE [<repo>/.cache/qwen3-tiny-base], which
# examples/qwen3/pretrain.sh writes there first when it is missing (the start of fine-tuning and generation).
tiny_base_checkpoint() {
  TINY_BASE="${BASE_CACHE:-$ROOT/.cache/qwen3-tiny-base}"
  if [ ! -f "$TINY_BASE/latest_checkpointed_iteration.txt" ]; then
    echo "[$SCRIPT] no checkpoint yet: pretraining the tiny example into $TINY_BASE first"
    (unset NPROC TP PP SAVE LOAD HF_SAVE TRAIN_ITERS LR GBS MBS SEQ_LEN; MODEL_SIZE=tiny SAVE="$TINY_BASE" \
      bash "$ROOT/examples/qwen3/pretrain.sh")
  fi
}

# The weights inference.py and evaluation.py read, in WEIGHT_ARGS: HF_LOAD (already in MODEL_ARGS), else
# LOAD, else, for MODEL_SIZE=tiny only, the tiny pretraining example's checkpoint in BASE_CACHE, which
# examples/qwen3/pretrain.sh writes there first when it is missing. Sets TOKENIZER_MODEL's default.
generation_weights() {
  WEIGHT_ARGS=()
  if [ -z "${HF_LOAD:-}" ]; then
    if [ -z "${LOAD:-}" ]; then
      [ "$MODEL_SIZE" = tiny ] || die "give HF_LOAD (a Hugging Face directory) or LOAD (a Megatron checkpoint) for MODEL_SIZE=$MODEL_SIZE"
      tiny_base_checkpoint
      LOAD="$TINY_BASE"
    fi
    [ -d "$LOAD" ] || die "LOAD=$LOAD is not a directory"
    WEIGHT_ARGS=(--load "$LOAD")
    TOKENIZER_MODEL="${TOKENIZER_MODEL:-$ROOT/examples/data/tokenizer}"
  fi
  [ -n "${TOKENIZER_MODEL:-}" ] || die "give TOKENIZER_MODEL (the tokenizer the model was trained with)"
}
