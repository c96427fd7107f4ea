"""MindSpeed-LLM's command lines in Megatron's words: the tables and the rewriting.

Plain Python (no torch, Megatron or ``adaptor``), so tools can rewrite arguments before anything slow
loads; ``patches.command_line.mindspeed_llm_arguments`` applies it to training. MindSpeed-LLM's
launch scripts (``examples/mcore/qwen3``, ``qwen3_moe``, ``deepseek3``) use their own names, Ascend
speed switches and a few architecture flags Megatron lacks; :func:`rewrite_pretrain_argv` turns each
into Megatron's before parsing, and the run prints every rewrite once:

* :data:`RENAMED` (``--qk-rope-head-dim`` -> ``--qk-pos-emb-head-dim``) and :data:`VALUES`
  (``--tokenizer-type PretrainedFromHF`` -> ``HuggingFaceTokenizer``);
* computed from several flags with MindSpeed-LLM's meaning: ``--first-k-dense-replace``,
  ``--n-shared-experts``, ``--seq-aux``, ``--rope-scaling-type``/``--rope-scaling-factor`` (YaRN
  there, Llama-3's in Megatron), ``--noop-layers``, ``--enable-hf2mg-convert``, ``--spec``, and the
  instruction-data flags DPO scripts pass beside ``--is-pairwise-dataset`` (dropped, with a line);
* :data:`NOT_APPLIED`: Ascend switches that do not change what is computed, dropped with a reason;
* :data:`REFUSED`: settings that would change the model in a way we do not compute: one line.

:func:`rewrite_convert_argv` / :func:`rewrite_preprocess_argv` do the same for the tools; the docs'
flag table is generated from these tables.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field



class ArgumentError(ValueError):
    """A MindSpeed-LLM setting we cannot compute; the message is one line."""

# -- pretrain_gpt.py ------------------------------------------------------------------------------

RENAMED = {
    "--tokenizer-name-or-path": "--tokenizer-model",
    "--tokenizer-not-use-fast": "--tokenizer-hf-no-use-fast",
    "--multi-head-latent-attention": "--multi-latent-attention",
    "--qk-rope-head-dim": "--qk-pos-emb-head-dim",
    "--qk-nope-head-dim": "--qk-head-dim",
    "--moe-intermediate-size": "--moe-ffn-hidden-size",
    "--n-group": "--moe-router-num-groups",
    "--topk-group": "--moe-router-group-topk",
    "--routed-scaling-factor": "--moe-router-topk-scaling-factor",
    "--rope-scaling-beta-fast": "--yarn-beta-fast",
    "--beta-fast": "--yarn-beta-fast",
    "--rope-scaling-beta-slow": "--yarn-beta-slow",
    "--beta-slow": "--yarn-beta-slow",
    "--rope-scaling-mscale": "--mscale",
    "--rope-scaling-mscale-all-dim": "--mscale-all-dim",
    "--rope-scaling-original-max-position-embeddings": "--yarn-original-max-position-embeddings",
    "--use-fused-moe-token-permute-and-unpermute": "--moe-permute-fusion",
}

# (flag, MindSpeed-LLM value) -> Megatron's value
VALUES = {
    ("--tokenizer-type", "PretrainedFromHF"): "HuggingFaceTokenizer",
    # MindSpeed-LLM's aux-loss-free top-k: plain top-k in Megatron (the bias is --moe-router-enable-expert-bias)
    ("--moe-router-load-balancing-type", "noaux_tc"): "none",
    # the sequence-first all-to-all dispatcher megatron-core dropped computes the same routing
    ("--moe-token-dispatcher-type", "alltoall_seq"): "alltoall",
}

# switch -> the Megatron flags it stands for
SWITCHES = {
    "--router-gating-in-fp32": ["--moe-router-dtype", "fp32"],
    # all of the Adam state in host memory between steps: our host offload of every element
    "--swap-optimizer": ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"],
    # deterministic kernels and collectives on Ascend: Megatron's deterministic mode asks torch for the same
    "--npu-deterministic": ["--deterministic-mode"],
}

# flag -> (values it takes, why it changes nothing computed)
NOT_APPLIED = {
    "--use-ascend-coc": (0, "Ascend's compute-communication overlap of tensor-parallel matmuls (speed only)"),
    "--coc-fused-kernel": (0, "Ascend's fused compute-communication kernel (speed only)"),
    "--coc-mode": (1, "Ascend's compute-communication overlap mode (speed only)"),
    "--coc-parallel-num": (1, "Ascend's compute-communication overlap split (speed only)"),
    "--reuse-fp32-param": (0, "shares bf16 parameters with the fp32 master copy on Ascend (memory only)"),
    "--swap-optimizer-times": (1, "the number of chunks --swap-optimizer swaps its state in; the host offload "
                                  "it maps to copies and steps parameter by parameter (memory only)"),
    "--moe-permutation-async-comm": (0, "overlaps the MoE permutation's communication (speed only)"),
    "--moe-alltoall-overlap-comm": (0, "overlaps MoE all-to-all with expert compute (speed only)"),
    "--moe-allgather-overlap-comm": (0, "overlaps MoE all-gather with expert compute (speed only)"),
    "--gemm-gradient-accumulation-fusion": (0, "accumulates grouped-GEMM weight gradients in place on Ascend "
                                               "(speed only)"),
    "--moe-fb-overlap": (0, "overlaps one micro-batch's forward with another's backward (speed only)"),
    "--mla-fa-without-pad": (0, "skips padding MLA's value heads for Ascend flash attention (same output)"),
    "--mla-mm-split": (0, "splits MLA's up-projections into four matmuls (same output)"),
    "--mtp-mem-efficient-logits": (0, "saves MTP cross-entropy memory (memory only)"),
    "--moe-zero-memory": (1, "recomputes parts of the MoE layer (memory only)"),
    "--moe-zero-memory-num-layers": (1, "the layer count of --moe-zero-memory (memory only)"),
    "--mla-zero-memory": (0, "recomputes MLA internals (memory only)"),
    "--recompute-mtp-norm": (0, "recomputes the MTP norms (memory only)"),
    "--recompute-mtp-layer": (0, "recomputes the MTP layer (memory only)"),
    "--padded-base-length": (1, "pads MLA head dims for Ascend flash attention (same output)"),
    "--schedules-method": (1, "DualPipeV places layers for bidirectional pipelining (speed only); Megatron's "
                              "1F1B schedule runs"),
    "--sparse-mode": (1, "picks the mask layout Ascend flash attention is given (compressed causal or band); "
                         "attention here is causal, which that layout computes up to its window"),
    "--no-shared-storage": (0, "builds dataset caches on every node; Megatron builds them on rank 0, so give "
                               "--data-cache-path a shared directory on multi-node runs"),
    "--workers": (1, "preprocessing workers for raw --data-path files; run tools/preprocess_data.py instead"),
    "--handler-name": (1, "the handler that preprocesses raw --data-path files; --data-path names a preprocessed "
                          "dataset here (tools/preprocess_data.py)"),
    "--enable-thinking": (1, "applies when tools/preprocess_data.py renders the conversations; the dataset "
                             "already holds them"),
    "--pack": (0, "applies when tools/preprocess_data.py builds the samples; the dataset already holds them"),
    "--neat-pack": (0, "applies when tools/preprocess_data.py builds the samples; conversations in a sample "
                       "never attend to each other here"),
    "--attention-mask-type": (1, "conversations in a sample get their own causal attention from the dataset's "
                                 "boundaries"),
    "--mg-save-dir": (1, "the cache of --enable-hf2mg-convert; Hugging Face weights load straight into the model"),
    "--norm-topk-prob": (0, "Megatron already renormalises the top-k weights (softmax over the top-k, sigmoid "
                            "scores divided by their sum)"),
    "--pad-to-multiple-of": (1, "the length unit of --no-pad-to-seq-lengths batches (shapes only): cut batches here "
                                "are padded to a multiple of 8 (times TP with sequence parallelism), packed ones to "
                                "what context and sequence parallelism split evenly"),
    "--use-ascend-mc2": (0, "Ascend's fused matmul-and-collective kernels for tensor-parallel layers (speed only)"),
    "--padded-samples": (0, "fine-tuning samples past the last whole epoch already come from the start of the "
                            "next epoch's order, each a real conversation"),
    # --profile-level/-with-cpu/-with-memory/-with-stack/-record-shapes/-save-path are honoured as they are
    # (patches.diagnostics.profiling); these two only shape torch_npu's output files.
    "--profile-export-type": (1, "torch_npu writes its text trace layout here (viewable in MindStudio Insight and "
                                 "TensorBoard)"),
    "--profile-data-simplification": (0, "torch_npu's own default keeps the trace small"),
}

# flag -> (values it takes, why) for settings we refuse
REFUSED = {
    "--scale-emb": (1, "MiniCPM's embedding scaling changes the model and is not computed here"),
    "--dim-model-base": (1, "MiniCPM's logit scaling changes the model and is not computed here"),
    "--scale-depth": (1, "MiniCPM's residual scaling changes the model and is not computed here"),
    "--moe-tp-extend-ep": (0, "pass --expert-tensor-parallel-size 1 and --expert-model-parallel-size TPxEP, "
                              "the same layout in Megatron's flags"),
    "--num-layer-list": (1, "give uneven pipeline stages with --pipeline-model-parallel-layout"),
    "--shared-expert-gate": (0, "use Megatron's --moe-shared-expert-gate"),
}

# --spec values naming MindSpeed-LLM's layer specs, which build what our layer spec builds
KNOWN_SPECS = {
    ("mindspeed_llm.tasks.models.spec.qwen3_spec", "layer_spec"): "Qwen3",
    ("mindspeed_llm.tasks.models.spec.deepseek_spec", "layer_spec"): "DeepSeek-V3",
}

# model types of --model-type-hf in MindSpeed-LLM that we convert (llama2: Llama 2 and 3.x; with --add-qkv-bias
# MindSpeed-LLM converts Qwen2 / Qwen2.5 under the same name, which is our qwen2)
MODEL_TYPES_HF = {"qwen3": "qwen3", "deepseek3": "deepseek3", "llama2": "llama2", "qwen2": "qwen2",
                  "qwen3-moe": "qwen3-moe", "mixtral": "mixtral", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}

# -- tools/convert_ckpt.py and tools/preprocess_data.py -------------------------------------------

CONVERT_CKPT_NOT_APPLIED = {
    "--use-mcore-models": (0, "megatron-core models are the only kind"),
    "--num-layers": (1, "the layers come from config.json"),
    "--num-nextn-predict-layers": (1, "the MTP layers come from config.json's num_nextn_predict_layers"),
    "--tokenizer-model": (1, "the vocabulary comes from config.json; tokenizer files are copied as they are"),
    "--spec": (2, "the converter writes megatron-core's own layer names"),
    "--params-dtype": (1, "tensors keep the dtype of the checkpoint they come from"),
    "--moe-grouped-gemm": (0, "grouped experts load from the per-expert layout the converter writes"),
    "--add-qkv-bias": (0, "the q/k/v biases come from config.json (--model-type-hf qwen2)"),
}
CONVERT_CKPT_VALUES = {
    ("--model-type", "GPT"): None,  # None: the flag and its value are dropped (GPT is the only kind)
}
CONVERT_CKPT_REFUSED = {
    "--moe-tp-extend-ep": (0, "convert with --target-expert-tensor-parallel-size 1 and --target-expert-parallel-size "
                              "TPxEP, the same layout"),
    "--mla-mm-split": (0, "the converter writes megatron-core's MLA projections, which training uses"),
}
PREPROCESS_RENAMED = {"--tokenizer-name-or-path": "--tokenizer-model"}
PREPROCESS_VALUES = {
    ("--tokenizer-type", "PretrainedFromHF"): "HuggingFaceTokenizer",
    ("--handler-name", "GeneralPretrainHandler"): None,  # the pretraining handler is what the tool does
}
PREPROCESS_NOT_APPLIED = {
    "--overwrite-cache": (0, "no cache is kept between runs: every run reads and tokenizes its input again"),
}
PREPROCESS_REFUSED: dict = {}
# --handler-name values the tool builds; GeneralPretrainHandler is dropped above (pretraining text)
PREPROCESS_HANDLERS = ("GeneralPretrainHandler", "AlpacaStyleInstructionHandler", "SharegptStyleInstructionHandler",
                       "AlpacaStylePairwiseHandler", "SharegptStylePairwiseHandler")


# -- the argv rewriting ---------------------------------------------------------------------------

@dataclass
class Rewrite:
    argv: list[str]
    notes: list[str] = field(default_factory=list)  # one line each, printed by the run
    refused: list[str] = field(default_factory=list)  # one line each, the first ends the run


def _split(token: str) -> tuple[str, str | None]:
    flag, eq, value = token.partition("=")
    return (flag, value) if eq and token.startswith("--") else (token, None)


def _find(argv: list[str], flag: str) -> int | None:
    """Index of the last occurrence of ``flag`` (``--x v`` or ``--x=v``)."""
    found = None
    for i, token in enumerate(argv):
        if _split(token)[0] == flag:
            found = i
    return found


def value_of(argv: list[str], flag: str) -> str | None:
    i = _find(argv, flag)
    if i is None:
        return None
    inline = _split(argv[i])[1]
    if inline is not None:
        return inline
    return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None


def _remove(argv: list[str], flag: str, arity: int) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        name, inline = _split(argv[i])
        if name == flag:
            i += 1 if inline is not None else 1 + arity
            continue
        out.append(argv[i])
        i += 1
    return out


def _set(argv: list[str], flag: str, values: list[str]) -> list[str]:
    """``argv`` with every ``flag`` (taking len(values) values, or one) replaced by ``flag values``."""
    return _remove(argv, flag, max(1, len(values))) + [flag, *values]


def _present(argv: list[str], flag: str) -> bool:
    return _find(argv, flag) is not None


def rewrite_tables(argv, renamed, values, not_applied, refused, who: str) -> Rewrite:
    """The table-driven part, shared by the training scripts and the tools."""
    result = Rewrite(list(argv))
    for flag, (arity, why) in refused.items():
        if _present(result.argv, flag):
            result.refused.append(f"{flag} (MindSpeed-LLM): {why}")
    for flag, (arity, why) in not_applied.items():
        if _present(result.argv, flag):
            result.argv = _remove(result.argv, flag, arity)
            result.notes.append(f"{flag} is not applied {who}: {why}")
    renamed_here = []
    for i, token in enumerate(result.argv):
        name, inline = _split(token)
        if name in renamed:
            result.argv[i] = renamed[name] + ("" if inline is None else "=" + inline)
            renamed_here.append(f"{name} -> {renamed[name]}")
    for (flag, old), new in values.items():
        i = _find(result.argv, flag)
        if i is None or value_of(result.argv, flag) != old:
            continue
        if new is None:
            result.argv = _remove(result.argv, flag, 1)
        elif _split(result.argv[i])[1] is not None:
            result.argv[i] = f"{flag}={new}"
        else:
            result.argv[i + 1] = new
        renamed_here.append(f"{flag} {old} -> {flag} {new}" if new else f"{flag} {old} (dropped: implied)")
    if renamed_here:
        result.notes.insert(0, "MindSpeed-LLM flags in Megatron's words: " + ", ".join(dict.fromkeys(renamed_here)))
    return result


def _int(argv, flag, default=None):
    text = value_of(argv, flag)
    try:
        return int(text) if text is not None else default
    except ValueError:
        raise ArgumentError(f"{flag} {text!r}: expected an integer") from None


def _moe_pattern(argv, num_slots: int) -> list[int] | None:
    """Per-slot MoE pattern from --first-k-dense-replace / --moe-layer-freq (MindSpeed-LLM's meaning)."""
    first_k = _int(argv, "--first-k-dense-replace")
    if first_k is None:
        return None
    freq_text = value_of(argv, "--moe-layer-freq") or "1"
    try:
        freq = ast.literal_eval(freq_text)
    except (ValueError, SyntaxError):
        freq = None
    if not isinstance(freq, int) or freq == 0:
        raise ArgumentError(f"--first-k-dense-replace needs an integer --moe-layer-freq, got {freq_text!r}")
    return [1 if (i >= first_k and i % freq == 0) else 0 for i in range(num_slots)]


def _noop_slots(argv, num_slots: int) -> list[int]:
    text = value_of(argv, "--noop-layers")
    if text is None:
        return []
    try:
        slots = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ArgumentError(f"--noop-layers {text!r}: expected comma-separated layer indices") from None
    if slots and (slots[0] < 0 or slots[-1] >= num_slots):
        raise ArgumentError(f"--noop-layers {text}: indices must lie in 0..{num_slots - 1} (--num-layers {num_slots})")
    return slots


def _layers(argv: list[str], notes: list[str]) -> list[str]:
    """--noop-layers, --first-k-dense-replace: Megatron's --num-layers, --moe-layer-freq and pipeline layout."""
    num_slots = _int(argv, "--num-layers")
    if num_slots is None or not (_present(argv, "--noop-layers") or _present(argv, "--first-k-dense-replace")):
        return argv
    noop = _noop_slots(argv, num_slots)
    pattern = _moe_pattern(argv, num_slots)
    real = [i for i in range(num_slots) if i not in noop]
    if pattern is not None:
        first_k = value_of(argv, "--first-k-dense-replace")
        argv = _remove(argv, "--first-k-dense-replace", 1)
        moe = "[" + ",".join(str(pattern[i]) for i in real) + "]"
        argv = _set(argv, "--moe-layer-freq", [moe])
        notes.append(f"--first-k-dense-replace {first_k}: --moe-layer-freq {moe}")
    if noop:
        pp = _int(argv, "--pipeline-model-parallel-size", 1)
        if num_slots % pp:
            raise ArgumentError(f"--num-layers {num_slots} (with --noop-layers) is not divisible by "
                                f"--pipeline-model-parallel-size {pp}")
        if _present(argv, "--num-layers-per-virtual-pipeline-stage") or _present(argv, "--pipeline-model-parallel-layout"):
            raise ArgumentError("--noop-layers with virtual pipeline stages or an explicit layout is not supported; "
                                "give the layout with --pipeline-model-parallel-layout and no --noop-layers")
        argv = _remove(argv, "--noop-layers", 1)
        argv = _set(argv, "--num-layers", [str(len(real))])
        line = f"--noop-layers: {len(noop)} identity layers dropped, --num-layers {len(real)}"
        if pp > 1:
            per = num_slots // pp
            counts = [sum(1 for i in real if s * per <= i < (s + 1) * per) for s in range(pp)]
            mtp = "m" * _int(argv, "--mtp-num-layers", 0)
            layout = "|".join(("E" if s == 0 else "") + "t" * c + (mtp + "L" if s == pp - 1 else "")
                              for s, c in enumerate(counts))
            argv = _set(argv, "--pipeline-model-parallel-layout", [layout])
            line += f", --pipeline-model-parallel-layout {layout} (real layers per stage as before)"
        notes.append(line)
    return argv


def _rope_scaling(argv: list[str], notes: list[str]) -> list[str]:
    kind = value_of(argv, "--rope-scaling-type")
    if kind is None:
        return argv
    argv = _remove(argv, "--rope-scaling-type", 1)
    factor = value_of(argv, "--rope-scaling-factor")
    if kind == "yarn":
        argv = _remove(argv, "--rope-scaling-factor", 1)
        mla = _present(argv, "--multi-latent-attention")
        argv = _set(argv, "--rope-type", ["yarn"]) if mla else _set(argv, "--position-embedding-type", ["yarn"])
        if factor is not None:
            argv = _set(argv, "--rotary-scaling-factor", [factor])
        notes.append(f"--rope-scaling-type yarn: {'--rope-type' if mla else '--position-embedding-type'} yarn"
                     + (f", --rotary-scaling-factor {factor} (MindSpeed-LLM's --rope-scaling-factor is the YaRN "
                        f"factor)" if factor is not None else ""))
        return argv
    if kind == "llama3":
        # Megatron's Llama-3 scaling uses low/high frequency factors 1 and 4 and an 8192 original context
        fixed = {"--low-freq-factor": 1.0, "--high-freq-factor": 4.0, "--original-max-position-embeddings": 8192.0}
        for flag, want in fixed.items():
            given = value_of(argv, flag)
            if given is not None and float(given) != want:
                raise ArgumentError(f"--rope-scaling-type llama3 with {flag} {given}: Megatron's Llama-3 RoPE "
                                    f"scaling fixes it at {want:g}")
            argv = _remove(argv, flag, 1)
        argv.append("--use-rope-scaling")
        notes.append("--rope-scaling-type llama3: --use-rope-scaling")
        return argv
    raise ArgumentError(f"--rope-scaling-type {kind} (MindSpeed-LLM) has no Megatron equivalent here; "
                        f"supported: yarn, llama3")


def _shared_experts(argv: list[str], notes: list[str]) -> list[str]:
    count = _int(argv, "--n-shared-experts")
    if count is None:
        return argv
    argv = _remove(argv, "--n-shared-experts", 1)
    if _present(argv, "--moe-shared-expert-intermediate-size"):
        raise ArgumentError("--n-shared-experts and --moe-shared-expert-intermediate-size both size the shared "
                            "experts; pass one")
    width = _int(argv, "--moe-ffn-hidden-size") or _int(argv, "--ffn-hidden-size")
    if width is None:
        raise ArgumentError("--n-shared-experts needs --moe-ffn-hidden-size (the width of one expert)")
    if count:
        argv = argv + ["--moe-shared-expert-intermediate-size", str(count * width)]
        notes.append(f"--n-shared-experts {count}: --moe-shared-expert-intermediate-size {count * width} "
                     f"({count} x the expert width)")
    return argv


def _seq_aux(argv: list[str], notes: list[str]) -> list[str]:
    if not _present(argv, "--seq-aux"):
        return argv
    argv = _remove(argv, "--seq-aux", 0)
    kind = value_of(argv, "--moe-router-load-balancing-type") or "aux_loss"
    if kind in ("none", "seq_aux_loss"):  # MindSpeed-LLM reads --seq-aux with its aux-loss-free router only
        argv = _set(argv, "--moe-router-load-balancing-type", ["seq_aux_loss"])
        notes.append("--seq-aux: --moe-router-load-balancing-type seq_aux_loss")
    else:
        notes.append(f"--seq-aux is not applied: MindSpeed-LLM ignores it with --moe-router-load-balancing-type {kind}")
    return argv


def _hf2mg(argv: list[str], notes: list[str]) -> list[str]:
    if not _present(argv, "--enable-hf2mg-convert"):
        return argv
    argv = _remove(argv, "--enable-hf2mg-convert", 0)
    load = value_of(argv, "--load")
    if load is None:
        raise ArgumentError("--enable-hf2mg-convert needs --load naming the Hugging Face directory")
    argv = _set(_remove(argv, "--load", 1), "--hf-load-dir", [load])
    notes.append(f"--enable-hf2mg-convert --load {load}: --hf-load-dir {load} (each rank reads its shard; no "
                 f"converted copy is written)")
    return argv


def _qwen2_as_llama2(argv: list[str], notes: list[str]) -> list[str]:
    if value_of(argv, "--model-type-hf") == "llama2" and _present(argv, "--add-qkv-bias"):
        notes.append("--model-type-hf llama2 --add-qkv-bias: --model-type-hf qwen2 (Llama's layers with q/k/v bias)")
        return _set(argv, "--model-type-hf", ["qwen2"])
    return argv


def _model_type_hf(argv: list[str], notes: list[str]) -> list[str]:
    argv = _qwen2_as_llama2(argv, notes)
    kind = value_of(argv, "--model-type-hf")
    if kind is None or kind in MODEL_TYPES_HF.values():
        return argv
    if kind not in MODEL_TYPES_HF:
        raise ArgumentError(f"--model-type-hf {kind}: Hugging Face conversion supports "
                            f"{', '.join(sorted(MODEL_TYPES_HF))}")
    return _set(argv, "--model-type-hf", [MODEL_TYPES_HF[kind]])


def _spec(argv: list[str], notes: list[str]) -> list[str]:
    i = _find(argv, "--spec")
    if i is None or i + 2 >= len(argv):
        return argv
    given = tuple(argv[i + 1:i + 3])
    if given in KNOWN_SPECS:
        notes.append(f"--spec {' '.join(given)}: MindSpeed-LLM's {KNOWN_SPECS[given]} layer spec is the layer spec "
                     f"these flags build (megatron-core's layers, without Transformer Engine)")
        return argv[:i] + argv[i + 3:]
    return argv


CP_ALGORITHMS = {"megatron_cp_algo": "p2p", "ulysses_cp_algo": "a2a", "hybrid_cp_algo": "a2a+p2p"}


def _cp_algo(argv: list[str], notes: list[str]) -> list[str]:
    """MindSpeed's context-parallel switches -> Megatron's ``--cp-comm-type`` (and hierarchical sizes)."""
    algo = value_of(argv, "--context-parallel-algo")
    degree = value_of(argv, "--ulysses-degree-in-cp")
    mask_type = value_of(argv, "--cp-attention-mask-type")
    argv = _remove(argv, "--ulysses-degree-in-cp", 1)
    argv = _remove(argv, "--cp-attention-mask-type", 1)
    if mask_type == "causal":
        notes.append("--cp-attention-mask-type causal: the attention of every context-parallel algorithm here")
    elif mask_type == "general":
        # MindSpeed's ring then applies the batch's own mask; the masks MindSpeed-LLM's data make are causal
        # within each row (and each document where rows are packed), which is what the ring computes here
        notes.append("--cp-attention-mask-type general: context parallelism here applies each batch's own "
                     "attention, causal within every row and every packed document")
    elif mask_type is not None:
        raise ArgumentError(f"--cp-attention-mask-type {mask_type} (MindSpeed-LLM) is not one of causal, general")
    for flag, why in (("--use-cp-send-recv-overlap", "the ring always overlaps each block's transfer with the "
                                                     "previous block's attention"),
                      ("--megatron-cp-in-bnsd", "the ring works in [b, n, s, d] internally whatever the layout"),
                      ("--use-fused-ring-attention-update", "Ascend's one-kernel merge of a ring block's attention "
                                                            "into the running output; the ring merges it with the "
                                                            "same arithmetic in separate operations (speed only)")):
        if _present(argv, flag):
            argv = _remove(argv, flag, 0)
            notes.append(f"{flag} is not applied: {why}")
    if algo is None:
        if degree is not None:
            raise ArgumentError("--ulysses-degree-in-cp (MindSpeed-LLM) needs --context-parallel-algo hybrid_cp_algo")
        return argv
    argv = _remove(argv, "--context-parallel-algo", 1)
    if algo not in CP_ALGORITHMS:
        raise ArgumentError(f"--context-parallel-algo {algo} (MindSpeed-LLM) is not one of "
                            f"{', '.join(CP_ALGORITHMS)}")
    comm = CP_ALGORITHMS[algo]
    if _int(argv, "--context-parallel-size", 1) == 1:
        notes.append("--context-parallel-algo is not applied here: it picks the algorithm of context parallelism, "
                     "and --context-parallel-size is 1")
        return argv
    argv = _set(argv, "--cp-comm-type", [comm])
    if algo != "hybrid_cp_algo":
        if degree is not None:
            raise ArgumentError(f"--ulysses-degree-in-cp (MindSpeed-LLM) is for hybrid_cp_algo, not {algo}")
        notes.append(f"--context-parallel-algo {algo}: --cp-comm-type {comm}")
        return argv
    cp = _int(argv, "--context-parallel-size", 1)
    if degree is None or not degree.isdigit() or int(degree) < 2 or cp % int(degree):
        raise ArgumentError(f"--context-parallel-algo hybrid_cp_algo needs --ulysses-degree-in-cp K with K > 1 "
                            f"dividing --context-parallel-size {cp}; got {degree}")
    sizes = [degree, str(cp // int(degree))]
    argv = _set(argv, "--hierarchical-context-parallel-sizes", sizes)
    notes.append(f"--context-parallel-algo hybrid_cp_algo --ulysses-degree-in-cp {degree}: --cp-comm-type a2a+p2p "
                 f"--hierarchical-context-parallel-sizes {' '.join(sizes)}")
    return argv


def _reset_position_ids(argv: list[str], notes: list[str], mindspeed: bool) -> list[str]:
    if mindspeed and _present(argv, "--reset-position-ids") and not _present(argv, "--reset-attention-mask"):
        notes.append("--reset-position-ids restarts position ids only (Megatron's meaning); add "
                     "--reset-attention-mask for MindSpeed-LLM's per-document attention")
    return argv


# MindSpeed-LLM flags Megatron's parser does not know, read by the steps above -> values they take
COMPUTED = {"--first-k-dense-replace": 1, "--n-shared-experts": 1, "--seq-aux": 0, "--rope-scaling-type": 1,
            "--noop-layers": 1, "--enable-hf2mg-convert": 0, "--context-parallel-algo": 1, "--low-freq-factor": 1,
            "--ulysses-degree-in-cp": 1, "--cp-attention-mask-type": 1, "--use-cp-send-recv-overlap": 0,
            "--megatron-cp-in-bnsd": 0, "--use-fused-ring-attention-update": 0,
            "--high-freq-factor": 1, "--original-max-position-embeddings": 1}


def _is_mindspeed_command_line(argv: list[str]) -> bool:
    own = set(RENAMED) | set(SWITCHES) | set(NOT_APPLIED) | set(REFUSED) | set(COMPUTED) | {"--use-mcore-models"}
    return any(_split(t)[0] in own for t in argv) or any(value_of(argv, f) == v for f, v in VALUES)


def _without_own_flags(argv: list[str]) -> list[str]:
    """``argv`` less the MindSpeed-LLM-only flags: a refused command line still parses, so its line is ours."""
    for flag, (arity, _) in REFUSED.items():
        argv = _remove(argv, flag, arity)
    for flag, arity in COMPUTED.items():
        argv = _remove(argv, flag, arity)
    return argv


def rewrite_pretrain_argv(argv: list[str]) -> Rewrite:
    """A MindSpeed-LLM pretrain command line in Megatron's flags, with the notes to print."""
    mindspeed = _is_mindspeed_command_line(argv)
    result = rewrite_tables(argv, RENAMED, VALUES, NOT_APPLIED, REFUSED, "here")
    if _present(argv, "--norm-topk-prob") and _present(argv, "--moe-router-pre-softmax"):
        # softmax over all experts before top-k: Megatron does not renormalise the top-k weights then
        result.refused.append("--norm-topk-prob with --moe-router-pre-softmax (MindSpeed-LLM): Megatron does not "
                              "renormalise pre-softmax top-k weights; drop --moe-router-pre-softmax")
    for flag, replacement in SWITCHES.items():
        if _present(result.argv, flag):
            result.argv = _remove(result.argv, flag, 0) + replacement
            result.notes.append(f"{flag}: {' '.join(replacement)}")
    try:
        for step in (_hf2mg, _model_type_hf, _spec, _cp_algo, _rope_scaling, _shared_experts, _seq_aux, _layers,
                     _pairwise_data):
            result.argv = step(result.argv, result.notes)
    except ArgumentError as exc:
        result.refused.append(str(exc))
    if result.refused:
        result.argv = _without_own_flags(result.argv)
    result.argv = _reset_position_ids(result.argv, result.notes, mindspeed)
    return result


def _pairwise_data(argv: list[str], notes: list[str]) -> list[str]:
    """MindSpeed-LLM's DPO scripts give ``--is-instruction-dataset`` beside ``--is-pairwise-dataset``: its pairwise
    dataset is a kind of instruction dataset, and the pairwise flag decides what is read. Here the two name
    different layouts, so the instruction flag goes."""
    if _present(argv, "--is-pairwise-dataset") and _present(argv, "--is-instruction-dataset"):
        notes.append("--is-instruction-dataset with --is-pairwise-dataset (dropped: implied, the pairwise "
                     "datasets are read)")
        return _remove(argv, "--is-instruction-dataset", 0)
    return argv


def _convert_layers(argv: list[str], notes: list[str]) -> list[str]:
    noop = value_of(argv, "--noop-layers")
    if noop is None:
        return argv
    if _int(argv, "--target-pipeline-parallel-size", 1) > 1:
        raise ArgumentError("--noop-layers with --target-pipeline-parallel-size > 1: training places the real "
                            "layers by --pipeline-model-parallel-layout, which the converter does not write; "
                            "convert at pipeline size 1")
    notes.append(f"--noop-layers {noop} is not applied: identity layers hold no weights, and pretrain_gpt.py "
                 f"drops them too, so the checkpoint has the real layers only")
    return _remove(argv, "--noop-layers", 1)


def rewrite_convert_argv(argv: list[str]) -> Rewrite:
    """MindSpeed-LLM's convert_ckpt.py command lines in tools/convert_ckpt.py's flags."""
    notes: list[str] = []
    argv = _qwen2_as_llama2(list(argv), notes)  # before --add-qkv-bias is dropped
    result = rewrite_tables(argv, {}, CONVERT_CKPT_VALUES, CONVERT_CKPT_NOT_APPLIED, CONVERT_CKPT_REFUSED,
                            "by the converter")
    result.notes[:0] = notes
    try:
        for step in (_model_type_hf, _convert_layers):
            result.argv = step(result.argv, result.notes)
    except ArgumentError as exc:
        result.refused.append(str(exc))
    return result


def rewrite_preprocess_argv(argv: list[str]) -> Rewrite:
    """MindSpeed-LLM's preprocess_data.py command lines in tools/preprocess_data.py's flags."""
    result = rewrite_tables(argv, PREPROCESS_RENAMED, PREPROCESS_VALUES, PREPROCESS_NOT_APPLIED, PREPROCESS_REFUSED,
                            "here")
    handler = value_of(result.argv, "--handler-name")
    if handler is not None and handler not in PREPROCESS_HANDLERS:
        result.refused.append(f"--handler-name {handler} (MindSpeed-LLM): not built by this tool; it builds "
                              f"{', '.join(PREPROCESS_HANDLERS)}")
    return result
