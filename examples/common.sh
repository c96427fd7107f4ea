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

# launch ENTRY ARGS...: torchrun ENTRY on this node with the layout variables; replaces the shell.
launch() {
  export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}"
  exec torchrun --nproc_per_node "$NPROC" --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$@"
}
