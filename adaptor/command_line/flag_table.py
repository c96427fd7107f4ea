"""Every flag of Megatron's parser (megatron-core 0.19.2) and what it does on our training path.

Data for :mod:`adaptor.command_line.flag_policy`: dest -> Honoured / Refused / NotApplied, grouped as Megatron's
``--help`` groups them. Each decision was made by reading where megatron-core and this project read
the value; ``tests`` fail when Megatron's parser has a dest this table lacks.
"""
from __future__ import annotations

from adaptor.command_line.flag_policy import HONOURED, Honoured, NotApplied, Refused

# Policies several flags share.
_TE_USERBUFFERS_TUNING = NotApplied(
    "tunes Transformer Engine's userbuffers overlap (--tp-comm-overlap), available on CUDA with "
    "Transformer Engine only",
    requires=("transformer_engine",))
_ACCOUNT_FOR_EMBEDDING_IN_PIPELINE_SPLIT = Honoured("TransformerBlock's per-stage layer counts")
_QK_CLIP_SETTING = Refused(
    "only used by --qk-clip, which needs the maximum attention logits that only Transformer Engine's "
    "attention records; drop it",
    requires=("transformer_engine",))
_DSA_ONLY = Refused(
    "only read by DeepSeek sparse attention layers (--experimental-attention-variant dsa), which "
    "pretrain_gpt.py does not build; drop it")
_GATED_DELTA_NET_SIZE = Honoured(
    "gated-delta-net layers (--experimental-attention-variant gated_delta_net): the local spec's GDN layers, "
    "torch kernels where fla is missing (patches/models/gated_delta_net)")
_MUP_BASE_HIDDEN_SIZE = Honoured("with --use-mup")
_MUP_BASE_HEAD_DIM = Honoured("with --use-mup (softmax scale)")
_FP8_ONLY = Refused(
    "only used by FP8 training (--fp8-format), which needs Transformer Engine; drop it",
    requires=("transformer_engine",))
_FIRST_LAST_LAYERS_BF16 = Refused(
    "only used by FP8/FP4 training (--fp8-format, --fp4-format), which needs Transformer Engine; drop it",
    requires=("transformer_engine",))
_USE_KITCHEN_ATTENTION = Refused(
    "the NVIDIA Kitchen attention is not part of the layer spec pretrain_gpt.py builds; drop it")
_FP4_ONLY = Refused(
    "only used by FP4 training (--fp4-format), which needs Transformer Engine; drop it",
    requires=("transformer_engine",))
_MOE_ROUTER_PADDING_FOR_QUANTIZATION = Refused(
    "it pads expert token counts for FP8/FP4 grouped GEMMs, which need Transformer Engine; drop it",
    requires=("transformer_engine",))
_MOE_HYBRIDEP_NUM_BLOCKS_PERMUTE = NotApplied(
    "sets CUDA thread blocks of HybridEP, a CUDA-only backend of the flex token dispatcher",
    requires=("cuda",))
_ENABLE_CUDA_GRAPH = NotApplied(
    "captures CUDA graphs, which need CUDA and Transformer Engine's RNG tracker",
    requires=("transformer_engine",))
_INFERENCE_CUDA_GRAPH_SCOPE = Refused(
    "an inference setting, and pretrain_gpt.py runs no inference engine; drop it")
_MAMBA_STATE_DIM = Refused(
    "only read by Mamba layers, which pretrain_gpt.py does not build; drop it")
_MIN_OFFLOADED_TENSOR_SIZE = NotApplied(
    "tunes Megatron's Transformer Engine implementation of --fine-grained-activation-offloading (CUDA only); "
    "the local spec's offload (patches/memory/activation_offload) offloads every chosen module call",
    requires=("transformer_engine",))
_MOE_PAGED_STASH_PAGE_SIZE = NotApplied(
    "tunes --moe-paged-stash, available on CUDA with Transformer Engine only",
    requires=("transformer_engine",))
_YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS = Honoured("YaRN config; MLA's through patches.models.mla")
_RELATIVE_ATTENTION_NUM_BUCKETS = Refused(
    "relative position bias is T5's; pretrain_gpt.py's GPTModel has none, so drop it",
)
_MUON_MOMENTUM = Honoured("patches.optimizers.muon: Megatron's Muon step, written out in adaptor.optimizers.muon")
_LION_BETA1 = Refused("applies to --optimizer lion, which is not supported here (only adam and sgd are); drop it")
_NON_PERSISTENT_LOCAL_CKPT_DIR = Refused(
    "applies to --non-persistent-ckpt-type local, which needs nvidia-resiliency-ext's local checkpoint "
    "manager and is not supported here; drop it (use --non-persistent-ckpt-type global)",
)
_CKPT_FULLY_PARALLEL_LOAD_EXCHANGE_ALGO = Honoured("torch_dist fully parallel loads")
# Deprecated spellings Megatron still accepts: it prints that they have no effect, and what they asked
# for (a distributed checkpoint, fully parallel saving) is already its default, and ours.
_DEPRECATED_NO_EFFECT = Honoured("deprecated by Megatron, which prints that it has no effect; its default already does it")
_HETEROGENEOUS_LAYERS_CONFIG_PATH = Refused(
    "pretrain_gpt.py builds one layer spec for every layer, so per-layer (heterogeneous) configurations "
    "are not applied; drop it (heterogeneous models are not supported yet)",
)
_MASK_PROB = Refused("is read only by Megatron-LM's BERT and T5 pretraining scripts; pretrain_gpt.py builds GPT samples, so drop it")
_RL_PROMPTS_PER_EVAL = Refused(
    "only RL training (--perform-rl-step) reads it, and that is not available here; drop it",
)
_GRPO_KL_BETA = Refused("only RL training (--perform-rl-step) reads it, and that is not available here; drop it")
_ICT_HEAD_SIZE = Refused(
    "read only by Megatron-LM's ICT/biencoder retrieval programs; pretrain_gpt.py builds a GPT "
    "language model, so drop it",
)
_NUM_CLASSES = Refused(
    "read only by Megatron-LM's vision programs (ViT/Swin/DINO classification and pretraining); "
    "pretrain_gpt.py builds no vision model and pretrain_mm.py takes its image size, patch size and "
    "tower from model.json; drop it",
)
_LOGITS_SAVE_TOP_K = Refused(
    "only teacher log-prob caching (--logits-save-dir) reads it, which is not supported here; drop it",
)
_LOGITS_LOAD_DECODE_THREADS = Refused(
    "only the distillation loss of --logits-load-dir reads it, which pretrain_gpt.py does not have; "
    "drop it",
)
_STRAGGLER_CTRLR_PORT = Refused(
    "only the straggler detector (--log-straggler) reads it, which is not available here; drop it",
)
_INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD = Refused(
    "read only by Megatron's inference engine and text-generation server, which pretrain_gpt.py does "
    "not run; drop it",
)
_CUDA_GRAPH_SCOPE_DEPRECATED = NotApplied(
    "it selects what per-layer CUDA graphs (--cuda-graph-impl) capture, and CUDA graphs are captured "
    "on the CUDA backend only",
    requires=("cuda",),
)
_HYBRID_LAYER_PATTERN = Refused(
    "pretrain_gpt.py builds a GPT transformer, not a hybrid Mamba/attention model (the pattern would "
    "also override --num-layers); drop it",
)
_MAIN_GRADS_DTYPE = Refused(
    "only the precision-aware optimizer (--use-precision-aware-optimizer, Transformer Engine's "
    "FusedAdam) keeps this in another dtype; drop it",
    requires=("transformer_engine",),
    values=lambda v: str(v) not in ("fp32", "torch.float32"),
)
_MEGATRON_FSDP_MEMORY = Honoured("Megatron-FSDP's communication buffers and parameter-gather granularity")
_MEGATRON_FSDP_DTYPE = Honoured("Megatron-FSDP's main parameter, main gradient and gradient-communication dtypes")
_INPROCESS_MAX_ITERATIONS = Refused(
    "only in-process restart (--inprocess-restart) reads it, which pretrain_gpt.py does not offer; "
    "drop it",
)


def honoured(names: str) -> dict:
    """The flags (dests, space-separated) that reach code on our path and do what Megatron's help says."""
    return dict.fromkeys(names.split(), HONOURED)


MEGATRON_FLAGS = {

    # --- transformer configuration ---
    **honoured(
        "tensor_model_parallel_size pipeline_model_parallel_size expert_model_parallel_size "
        "expert_tensor_parallel_size use_cpu_initialization fp16 bf16 num_layers mtp_num_layers "
        "mtp_loss_scaling_factor mtp_detach_heads hidden_size num_attention_heads num_query_groups "
        "ffn_hidden_size kv_channels hidden_dropout attention_dropout layernorm_epsilon add_bias_linear "
        "add_qkv_bias normalization qk_layernorm attention_output_gate calculate_per_token_loss "
        "init_method_std apply_query_key_layer_scaling recompute_granularity recompute_method "
        "recompute_num_layers moe_shared_expert_intermediate_size moe_shared_expert_gate moe_ffn_hidden_size "
        "moe_router_topk moe_router_num_groups moe_router_group_topk moe_router_pre_softmax "
        "moe_router_topk_scaling_factor moe_router_score_function moe_router_dtype "
        "moe_router_enable_expert_bias moe_router_force_load_balancing moe_router_force_biased "
        "moe_z_loss_coeff moe_input_jitter_eps moe_per_layer_logging moe_pad_expert_input_to_capacity "
        "moe_token_drop_policy moe_layer_recompute moe_apply_probs_on_input clone_scatter_output_in_embedding "
        "config_logger_dir"
    ),
    "tensor_parallel_num_weight_shards": Refused(
        "generalized tensor parallelism (sharded weights re-gathered on side streams) is built on CUDA streams "
        "and events and does not run on this backend; drop it and shard model state with "
        "--use-distributed-optimizer or --use-torch-fsdp2",
        requires=("cuda",)),
    "pipeline_model_parallel_comm_backend": Refused(
        "pipeline communication here uses the backend's own collective library (gloo on CPU, hccl on NPU), "
        "so nccl or ucc groups cannot be created; drop it",
        requires=("cuda",)),
    "sequence_parallel": Honoured("torch norms accept it (patches/upstream_fixes/sequence_parallel_torch_norm)"),
    "context_parallel_size": Honoured("patches.long_context.context_parallel (ring, Ulysses or both; no Transformer Engine needed)"),
    "hierarchical_context_parallel_sizes": Honoured("patches.long_context.context_parallel (--cp-comm-type a2a+p2p: Ulysses degree, ring size)"),
    "max_seqlen_per_dp_cp_rank": Refused(
        "only read by hybrid context parallelism, which pretrain_gpt.py does not run; drop it"),
    "hybrid_context_parallel": Refused(
        "pretrain_gpt.py's get_batch does not balance packed sequences across context-parallel ranks "
        "(is_hybrid_cp stays off); drop it"),
    "expert_tensor_parallel_num_weight_shards": Refused(
        "generalized tensor parallelism of the experts (sharded weights re-gathered on side streams) is built on "
        "CUDA streams and events and does not run on this backend; drop it and shard model state with "
        "--use-distributed-optimizer",
        requires=("cuda",)),
    "perform_initialization": HONOURED,  # weights left uninitialised, for a --load that fills them
    "deterministic_mode": Honoured("torch.use_deterministic_algorithms and the deterministic embedding backward"),
    "tp_comm_overlap": NotApplied(
        "overlaps tensor-parallel communication with GEMMs through Transformer Engine's userbuffers, "
        "available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "tp_comm_bulk_wgrad": _TE_USERBUFFERS_TUNING,
    "tp_comm_bulk_dgrad": _TE_USERBUFFERS_TUNING,
    "tp_comm_overlap_ag": _TE_USERBUFFERS_TUNING,
    "tp_comm_overlap_rs": _TE_USERBUFFERS_TUNING,
    "tp_comm_overlap_rs_dgrad": _TE_USERBUFFERS_TUNING,
    "tp_comm_split_ag": _TE_USERBUFFERS_TUNING,
    "tp_comm_split_rs": _TE_USERBUFFERS_TUNING,
    "cross_entropy_loss_fusion": Honoured("the adaptor's chunked vocabulary-parallel cross entropy (patches/fusions/cross_entropy)"),
    "cross_entropy_fusion_impl": Refused(
        "the Transformer Engine parallel cross entropy is disabled in megatron-core 0.19.2; use native "
        "(the default) with --cross-entropy-loss-fusion",
        values=lambda v: v == "te"),
    "tp_comm_bootstrap_backend": NotApplied(
        "bootstraps Transformer Engine's userbuffers overlap (--tp-comm-overlap), available on CUDA with "
        "Transformer Engine only",
        requires=("transformer_engine",)),
    "overlap_moe_expert_parallel_comm": NotApplied(
        "overlaps expert-parallel all-to-all with another micro-batch's compute on CUDA streams "
        "(Tensor.record_stream), available on CUDA only",
        requires=("cuda",)),
    "delay_wgrad_compute": NotApplied(
        "delays weight-gradient GEMMs of Transformer Engine modules to overlap expert-parallel communication, "
        "available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "overlap_dispatch_backward_with_experts_wgrad": NotApplied(
        "overlaps the experts' weight-gradient GEMMs of Transformer Engine's grouped experts with the dispatch "
        "backward, available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "ep_overlap_early_attn_memory_release": NotApplied(
        "reorders the expert-parallel overlap schedule (--overlap-moe-expert-parallel-comm) to free attention "
        "activations early, available on CUDA only",
        requires=("cuda",)),
    "use_ring_exchange_p2p": NotApplied(
        "needs a custom-built torch with torch.distributed.ring_exchange; pipeline stages exchange tensors "
        "with batch_isend_irecv instead"),
    "defer_embedding_wgrad_compute": NotApplied(
        "defers the output layer's weight-gradient GEMMs into the pipeline flush and needs gradient-accumulation "
        "fusion, an apex CUDA kernel",
        requires=("apex",)),
    "wgrad_deferral_limit": NotApplied(
        "tunes --defer-embedding-wgrad-compute, which needs gradient-accumulation fusion, an apex CUDA kernel",
        requires=("apex",)),
    "overlap_p2p_comm_warmup_flush": Honoured("interleaved pipeline schedule with --overlap-p2p-communication"),
    "microbatch_group_size_per_vp_stage": Honoured("interleaved (virtual) pipeline schedule"),
    "mtp_standalone": Honoured("pipeline p2p shape exchange; set from --pipeline-model-parallel-layout when given"),
    "cpu_offloading_num_layers": NotApplied(
        "offloads layer activations to host memory through Transformer Engine's offload context, available "
        "on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "cpu_offloading_retain_pinned_cpu_buffers": NotApplied(
        "keeps the pinned buffers of Transformer Engine's activation offloading (--cpu-offloading-num-layers), "
        "available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "mtp_use_repeated_layer": Honoured("MultiTokenPredictionBlock builds one layer and applies it per depth"),
    "mtp_hybrid_override_pattern": Refused(
        "only read by hybrid (Mamba) models, which pretrain_gpt.py does not build; drop it"),
    "account_for_embedding_in_pipeline_split": _ACCOUNT_FOR_EMBEDDING_IN_PIPELINE_SPLIT,
    "account_for_loss_in_pipeline_split": _ACCOUNT_FOR_EMBEDDING_IN_PIPELINE_SPLIT,
    "attention_backend": Honoured(
        "Transformer Engine's attention with TE; elsewhere rewritten before parsing, printed "
        "(adaptor.command_line.attention_backend): flash/fused -> --use-flash-attn, unfused/local -> "
        "local DotProductAttention, auto -> this backend's default"),
    "flash_attention_version": Refused(
        "it pins the FlashAttention generation of Transformer Engine's attention, which the local layer spec "
        "does not use; drop it (--use-flash-attn picks the adaptor's fused attention)",
        requires=("transformer_engine",)),
    "softmax_type": Honoured("local DotProductAttention; --use-flash-attn accepts vanilla only"),
    "fp32_residual_connection": Honoured("TransformerLayer and the embedding; Megatron requires --bf16 or --fp16"),
    "apply_residual_connection_post_layernorm": Refused(
        "megatron-core's TransformerLayer never reads it (the residual is always taken before the layer norm); "
        "drop it"),
    "layernorm_zero_centered_gamma": Honoured(
        "every norm of the local spec (layers, final, qk-layernorm, MLA, MTP) scales by 1 + gamma, gamma stored "
        "and starting at zero; --use-fused-rmsnorm too; LayerNorm and RMSNorm only"),
    "glu_linear_offset": Honoured("unfused gated activation in MLP and experts; the fused SwiGLU rejects a non-zero offset"),
    "activation_func_clamp_value": Honoured("unfused gated activation in MLP and experts; the fused SwiGLU does not clamp"),
    "rotary_interleaved": Honoured("unfused RoPE; --use-fused-rotary-pos-emb refuses it with one line"),
    "qk_l2_norm": Refused(
        "the layer spec pretrain_gpt.py builds does not pass it on, so queries and keys would not be "
        "L2-normalised; drop it (--qk-layernorm normalises them with --normalization instead)"),
    "qk_clip": Refused(
        "query-key clipping needs the per-head maximum attention logits that only Transformer Engine's attention records; "
        "drop it",
        requires=("transformer_engine",)),
    "qk_clip_alpha": _QK_CLIP_SETTING,
    "qk_clip_threshold": _QK_CLIP_SETTING,
    "multi_latent_attention": Honoured("local spec with the adaptor's MLADotProductAttention"),
    "experimental_attention_variant": Honoured(
        "gated_delta_net: adaptor.layer_specs builds megatron-core's GDN layer pattern from the local spec "
        "(patches/models/gated_delta_net fills fla's kernels with torch ones where fla is missing); dsa is "
        "refused in one line by patches/models/gated_delta_net"),
    "dsa_indexer_n_heads": _DSA_ONLY,
    "dsa_indexer_head_dim": _DSA_ONLY,
    "dsa_indexer_topk": _DSA_ONLY,
    "dsa_indexer_topk_freq": _DSA_ONLY,
    "dsa_indexer_skip_topk_offset": _DSA_ONLY,
    "dsa_indexer_loss_coeff": _DSA_ONLY,
    "dsa_indexer_use_sparse_loss": _DSA_ONLY,
    "dsa_kernel_backend": _DSA_ONLY,
    "dsa_indexer_rope_interleaved": _DSA_ONLY,
    "dsa_indexer_rotate_activation": _DSA_ONLY,
    "dsa_indexer_scoring_relu": _DSA_ONLY,
    "dsa_indexer_k_norm_epsilon": _DSA_ONLY,
    "dsa_indexer_k_norm_fp32": _DSA_ONLY,
    "linear_conv_kernel_dim": _GATED_DELTA_NET_SIZE,
    "linear_key_head_dim": _GATED_DELTA_NET_SIZE,
    "linear_value_head_dim": _GATED_DELTA_NET_SIZE,
    "linear_num_key_heads": _GATED_DELTA_NET_SIZE,
    "linear_num_value_heads": _GATED_DELTA_NET_SIZE,
    "embedding_init_method_std": Honoured("embedding init; the optimizer then skips weight decay on embeddings"),
    "init_model_with_meta_device": Refused(
        "the model is built on the meta device and only Megatron FSDP initialises it afterwards, so under DDP "
        "or --use-torch-fsdp2 the weights would stay uninitialised; drop it"),
    "use_mup": Honoured("init, attention scale and logit scale in TransformerConfig/GPTModel, per-group LR in the optimizer"),
    "mup_width_mult": Refused(
        "under --use-mup it is computed as --hidden-size / --mup-base-hidden-size, overwriting a given value; "
        "set --mup-base-hidden-size instead"),
    "mup_base_hidden_size": _MUP_BASE_HIDDEN_SIZE,
    "mup_embedding_mult": _MUP_BASE_HIDDEN_SIZE,
    "mup_output_mult": _MUP_BASE_HIDDEN_SIZE,
    "mup_base_head_dim": _MUP_BASE_HEAD_DIM,
    "mup_attn_scale_power": _MUP_BASE_HEAD_DIM,
    "disable_bf16_reduced_precision_matmul": Honoured(
        "sets cuBLAS's bf16 reduction flag on CUDA; CPU and NPU matmuls already accumulate bf16 in fp32"),
    "use_fused_weighted_squared_relu": NotApplied(
        "fuses the probability-weighted squared ReLU of Transformer Engine's grouped experts; the local experts "
        "compute the same activation unfused",
        requires=("transformer_engine",)),
    "fused_residual_rmsnorm": NotApplied(
        "fuses the residual add into Transformer Engine's RMSNorm backward, available on CUDA with Transformer "
        "Engine only",
        requires=("transformer_engine",)),
    "use_transformer_engine_op_fuser": NotApplied(
        "lets Transformer Engine's operation fuser merge kernels, available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "distribute_saved_activations": Honoured("with tensor parallelism and full recompute (Megatron checks both)"),
    "recompute_modules": Honoured(
        "with --recompute-granularity selective; layernorm, moe_act, mla_up_proj and gdn_norm_out through "
        "patches/memory/recompute"),
    "fp8": Refused(
        "the FP8 training path runs through Transformer Engine's modules, which the local layer spec does not use, so the "
        "model would train in its usual precision; drop it, or run on CUDA with Transformer Engine",
        requires=("transformer_engine",)),
    "fp8_recipe": _FP8_ONLY,
    "fp8_quantizer_factory": _FP8_ONLY,
    "fp8_margin": _FP8_ONLY,
    "fp8_interval": _FP8_ONLY,
    "fp8_amax_history_len": _FP8_ONLY,
    "fp8_amax_compute_algo": _FP8_ONLY,
    "fp8_wgrad": _FP8_ONLY,
    "fp8_output_proj": _FP8_ONLY,
    "first_last_layers_bf16": _FIRST_LAST_LAYERS_BF16,
    "num_layers_at_start_in_bf16": _FIRST_LAST_LAYERS_BF16,
    "num_layers_at_end_in_bf16": _FIRST_LAST_LAYERS_BF16,
    "use_kitchen_attention": _USE_KITCHEN_ATTENTION,
    "kitchen_attention_backend": _USE_KITCHEN_ATTENTION,
    "fp4": Refused(
        "the FP4 training path runs through Transformer Engine's modules, which the local layer spec does not use, so the "
        "model would train in its usual precision; drop it, or run on CUDA with Transformer Engine",
        requires=("transformer_engine",)),
    "fp4_recipe": _FP4_ONLY,
    "fp4_quantizer_factory": _FP4_ONLY,
    "high_priority_a2a_comm_stream": NotApplied(
        "raises the CUDA stream priority of the expert-parallel overlap (--overlap-moe-expert-parallel-comm), "
        "available on CUDA only",
        requires=("cuda",)),
    "moe_shared_expert_overlap": Honoured("shared experts run beside the alltoall dispatch (streams are no-ops on CPU)"),
    "use_grouped_gemm_for_shared_expert": NotApplied(
        "runs the shared expert as a Transformer Engine grouped GEMM; without Transformer Engine the plain "
        "shared-expert MLP computes the same result",
        requires=("transformer_engine",)),
    "moe_shared_expert_glu_interleave_size": Refused(
        "the block-interleaved GLU layout is read only by Transformer Engine's grouped shared expert, so the "
        "local shared expert would read its weights as plain gate and up halves; drop it",
        requires=("transformer_engine",)),
    "moe_enable_routing_replay": Refused(
        "routing replay is driven by the inference and RL engines, which pretrain_gpt.py does not run; drop it"),
    "moe_router_padding_for_quantization": _MOE_ROUTER_PADDING_FOR_QUANTIZATION,
    "moe_router_padding_for_fp8": _MOE_ROUTER_PADDING_FOR_QUANTIZATION,
    "moe_router_bias_update_rate": Honoured("expert-bias update in finalize_model_grads"),
    "moe_router_quantile_balancing_ema": Honoured("quantile-balancing bias update in finalize_model_grads"),
    "use_grouped_gemm_for_dense_mlp": NotApplied(
        "runs the dense MLP as a Transformer Engine grouped GEMM for an MXFP8 fusion, which the layer spec "
        "pretrain_gpt.py builds does not wire; the plain MLP computes the same result"),
    "moe_grouped_gemm": Honoured("layer-spec swap to the adaptor's GroupedExperts (patches/fusions/grouped_matmul)"),
    "moe_single_grouped_weight": NotApplied(
        "stores the experts' weights as one Transformer Engine GroupedTensor, available on CUDA with Transformer "
        "Engine only",
        requires=("transformer_engine",)),
    "moe_single_grouped_bias": NotApplied(
        "stores the experts' biases as one Transformer Engine GroupedTensor, available on CUDA with Transformer "
        "Engine only",
        requires=("transformer_engine",)),
    "moe_token_dispatcher_type": Refused(
        "the flex dispatcher runs on DeepEP, HybridEP or NCCL EP, CUDA-only libraries; use alltoall or allgather",
        requires=("cuda",),
        values=lambda v: v == "flex"),
    "moe_enable_deepep": Refused(
        "the DeepEP library is a CUDA-only part of the flex token dispatcher; use --moe-token-dispatcher-type alltoall "
        "or allgather",
        requires=("cuda",)),
    "moe_flex_dispatcher_backend": Refused(
        "only used by --moe-token-dispatcher-type flex, whose backends are CUDA-only libraries; drop it and use "
        "alltoall or allgather",
        requires=("cuda",)),
    "moe_permute_fusion_into_hybridep": NotApplied(
        "fuses token permutation into HybridEP dispatch, a CUDA-only backend of the flex token dispatcher",
        requires=("cuda",)),
    "moe_hybridep_pad_uneven_dispatch_inputs": NotApplied(
        "pads HybridEP dispatch inputs, a CUDA-only backend of the flex token dispatcher",
        requires=("cuda",)),
    "moe_expert_capacity_factor": Honoured("router token dropping; the NPU permute kernels refuse it with one line"),
    "moe_pad_experts_for_cuda_graph_inference": Refused(
        "it changes routing only for CUDA-graph inference, which pretrain_gpt.py does not run; drop it"),
    "moe_permute_fusion": Honoured("the adaptor's permute kernels without Transformer Engine (patches/fusions/moe_permute)"),
    "moe_router_fusion": NotApplied(
        "fuses top-k routing and the auxiliary loss in Transformer Engine kernels, available on CUDA with "
        "Transformer Engine only",
        requires=("transformer_engine",)),
    "moe_latent_size": Refused(
        "the MoE latent projections are built only with Transformer Engine and model building stops on an assertion "
        "without it; drop it",
        requires=("transformer_engine",)),
    "moe_flex_dispatcher_num_sms": NotApplied(
        "sets the GPU SMs of the flex token dispatcher's CUDA-only communication kernels",
        requires=("cuda",)),
    "moe_deepep_num_sms": NotApplied(
        "sets the GPU SMs of DeepEP, a CUDA-only backend of the flex token dispatcher",
        requires=("cuda",)),
    "moe_hybridep_num_sms": NotApplied(
        "sets the GPU SMs of HybridEP, a CUDA-only backend of the flex token dispatcher",
        requires=("cuda",)),
    "moe_hybridep_num_blocks_permute": _MOE_HYBRIDEP_NUM_BLOCKS_PERMUTE,
    "moe_hybridep_num_blocks_unpermute": _MOE_HYBRIDEP_NUM_BLOCKS_PERMUTE,
    "moe_hybridep_num_sms_preprocessing": NotApplied(
        "sets the GPU SMs of HybridEP's preprocessing kernel, a CUDA-only backend of the flex token dispatcher",
        requires=("cuda",)),
    "moe_ncclep_static_shape": NotApplied(
        "gives NCCL EP dispatch fixed shapes for Transformer Engine's fused grouped MLP, available on CUDA with "
        "Transformer Engine only",
        requires=("transformer_engine",)),
    "moe_ncclep_zero_copy": NotApplied(
        "uses NCCL symmetric-memory zero-copy buffers in NCCL EP dispatch, available on CUDA with Transformer "
        "Engine only",
        requires=("transformer_engine",)),
    "moe_mlp_glu_interleave_size": Refused(
        "the block-interleaved GLU layout is read only by Transformer Engine's grouped experts, so the local "
        "experts would read their weights as plain gate and up halves; drop it",
        requires=("transformer_engine",)),
    "moe_expert_rank_capacity_factor": Refused(
        "it is the per-rank token budget of the HybridEP and NCCL EP flex dispatchers, which need CUDA and "
        "Transformer Engine; use --moe-expert-capacity-factor for token dropping here",
        requires=("transformer_engine",)),
    "enable_cuda_graph": _ENABLE_CUDA_GRAPH,
    "cuda_graph_warmup_steps": NotApplied(
        "tunes CUDA-graph capture (--cuda-graph-impl), which needs CUDA and Transformer Engine's RNG tracker",
        requires=("transformer_engine",)),
    "external_cuda_graph": _ENABLE_CUDA_GRAPH,
    "cuda_graph_impl": _ENABLE_CUDA_GRAPH,
    "inference_cuda_graph_scope": _INFERENCE_CUDA_GRAPH_SCOPE,
    "flash_decode": Refused(
        "an inference decoding kernel, and pretrain_gpt.py runs no inference engine; drop it"),
    "batch_invariant_mode": Refused(
        "batch-invariant mode swaps matmuls for Triton GPU kernels and needs Transformer Engine's flash "
        "attention; drop it",
        requires=("transformer_engine",)),
    "use_te_activation_func": NotApplied(
        "uses Transformer Engine's activation modules, which the layer spec pretrain_gpt.py builds does not wire; "
        "the same activation runs in torch"),
    "symmetric_ar_type": NotApplied(
        "uses symmetric-memory all-reduce in Transformer Engine's linear layers, available on CUDA with "
        "Transformer Engine only",
        requires=("transformer_engine",)),
    "nccl_all_reduce_for_prefill": _INFERENCE_CUDA_GRAPH_SCOPE,
    "inference_fuse_tp_communication": _INFERENCE_CUDA_GRAPH_SCOPE,
    "inference_disable_triton_nvls_kernels": _INFERENCE_CUDA_GRAPH_SCOPE,
    "inference_grouped_gemm_backend": _INFERENCE_CUDA_GRAPH_SCOPE,
    "inference_moe_disable_fused_quant_kernels": _INFERENCE_CUDA_GRAPH_SCOPE,
    "inference_moe_token_dispatcher_type": _INFERENCE_CUDA_GRAPH_SCOPE,
    "mrope_section": Refused(
        "multimodal RoPE needs per-modality position ids, which pretrain_gpt.py's batches do not carry; drop it"),
    "is_hybrid_model": Refused(
        "pretrain_gpt.py builds no hybrid (Mamba) model, and here it would only change the output layer's "
        "initialisation; drop it"),
    "mamba_state_dim": _MAMBA_STATE_DIM,
    "mamba_head_dim": _MAMBA_STATE_DIM,
    "mamba_num_groups": _MAMBA_STATE_DIM,
    "mamba_num_heads": _MAMBA_STATE_DIM,
    "use_mamba_mem_eff_path": _MAMBA_STATE_DIM,
    "mlp_chunks_for_prefill": Refused(
        "it chunks the MLP only during inference prefill, which pretrain_gpt.py does not run; drop it "
        "(--mlp-chunks-for-training chunks it in training)"),
    "mlp_chunks_for_training": Honoured("TransformerLayer chunks the MLP along the sequence in training"),
    "transformer_impl": Refused(
        "inference-optimized layers are not built by pretrain_gpt.py, which would silently use the local spec; "
        "use local (or transformer_engine on CUDA with Transformer Engine)",
        values=lambda v: v == "inference_optimized"),
    "fine_grained_activation_offloading": Honoured(
        "patches/memory/activation_offload on the local spec (saved-tensor hooks, any backend); Megatron's own with "
        "Transformer Engine"),
    "offload_modules": Honoured(
        "patches/memory/activation_offload: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, "
        "moe_act (sequential or grouped experts); fused_group_mlp (TE's op fuser) is refused without it"),
    "min_offloaded_tensor_size": Honoured("patches/memory/activation_offload (elements), Megatron's with TE"),
    "delay_offload_until_cuda_graph": _MIN_OFFLOADED_TENSOR_SIZE,
    "delta_offload_bytes_across_pp_ranks": _MIN_OFFLOADED_TENSOR_SIZE,
    "activation_offload_fraction": _MIN_OFFLOADED_TENSOR_SIZE,
    "moe_paged_stash": NotApplied(
        "pages routed-expert activations in Transformer Engine's grouped experts with a per-rank capacity, "
        "available on CUDA with Transformer Engine only",
        requires=("transformer_engine",)),
    "moe_paged_stash_page_size": _MOE_PAGED_STASH_PAGE_SIZE,
    "moe_paged_stash_buffer_size_factor_cuda": _MOE_PAGED_STASH_PAGE_SIZE,
    "moe_paged_stash_buffer_size_factor_cpu": _MOE_PAGED_STASH_PAGE_SIZE,
    "fine_grained_offloading_max_inflight_offloads": _MIN_OFFLOADED_TENSOR_SIZE,

    # --- network size ---
    **honoured(
        "group_query_attention window_attn_skip_freq max_position_embeddings rotary_base rotary_percent "
        "use_rope_scaling no_rope_freq make_vocab_size_divisible_by squared_relu swiglu quick_geglu "
        "untie_embeddings_and_output_weights"
    ),
    "encoder_num_layers": Refused(
        "pretrain_gpt.py builds a decoder-only GPTModel with no encoder; give its depth with --num-layers",
    ),
    "decoder_num_layers": Refused("pretrain_gpt.py takes the decoder depth from --num-layers only; use --num-layers"),
    "window_size": HONOURED,  # DotProductAttention's sliding-window mask; --use-flash-attn refuses it itself
    "position_embedding_type": Refused(
        "relative position bias is T5's and mrope needs multimodal 3-D positions, neither of which "
        "pretrain_gpt.py's GPTModel applies; use rope, yarn, learned_absolute or none",
        values=lambda v: v in ("relative", "mrope"),
    ),
    "yarn_original_max_position_embeddings": _YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS,
    "yarn_beta_fast": _YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS,
    "yarn_beta_slow": _YARN_ORIGINAL_MAX_POSITION_EMBEDDINGS,
    # Read for --position-embedding-type yarn without MLA; MLA's YarnRotaryEmbedding always rounds (default).
    "yarn_correction_range_round_to_int": Honoured("non-MLA YaRN (GPTModel's YarnRotaryEmbedding)"),
    "relative_attention_num_buckets": _RELATIVE_ATTENTION_NUM_BUCKETS,
    "relative_attention_max_distance": _RELATIVE_ATTENTION_NUM_BUCKETS,
    "use_rotary_position_embeddings": Honoured("deprecated alias: Megatron sets --position-embedding-type rope"),
    "rotary_seq_len_interpolation_factor": Honoured("pretrain_gpt.py passes it to GPTModel (linear RoPE scaling)"),
    "rope_scaling_factor": Honoured("pretrain_gpt.py passes it to GPTModel with --use-rope-scaling"),
    "add_position_embedding": Refused(
        "deprecated (Megatron stops on it unless RoPE is used); choose --position-embedding-type rope or none instead"
    ),
    "openai_gelu": Refused(
        "megatron-core's GPTModel reads it nowhere and keeps torch's exact GeLU; drop it"
    ),
    "onnx_safe": Refused("megatron-core 0.19.2 reads it nowhere (ONNX export is not part of training); drop it"),
    "bert_binary_head": Refused("it configures BERT's binary head and pretrain_gpt.py builds GPT only; drop it"),
    # --- regularization ---
    **honoured(
        "weight_decay adam_beta1 adam_beta2 adam_eps sgd_momentum"
    ),
    "apply_wd_to_qk_layernorm": HONOURED,  # optimizer param groups match q_layernorm./k_layernorm. names
    "clip_grad": Honoured("Megatron's clipping, dtype check made device-agnostic by patches.device.device_agnostic_clip_grads"),
    "muon_momentum": _MUON_MOMENTUM,
    "muon_split_qkv": Honoured("patches.optimizers.muon: the fused QKV weight orthogonalised per Q, K and V "
                               "block (Megatron's default), whole with --muon-no-split-qkv"),
    "muon_nesterov": _MUON_MOMENTUM,
    "muon_scale_mode": _MUON_MOMENTUM,
    "muon_fp32_matmul_prec": Honoured("patches.optimizers.muon: medium iterates Newton-Schulz in bf16, high and "
                                      "low in float32 (adaptor.optimizers.newton_schulz)"),
    "muon_coefficient_type": Refused(
        "custom has no flag for its coefficients; use simple, quintic, polar_express or aol",
        values=lambda v: v not in ("simple", "quintic", "polar_express", "aol")),
    "muon_num_ns_steps": _MUON_MOMENTUM,
    "muon_tp_mode": Refused(
        "Muon here orthogonalises each tensor-parallel shard on its own (blockwise; duplicated "
        "equals it at TP=1); drop it", values=lambda v: v == "distributed"),
    "muon_extra_scale_factor": Honoured("patches.optimizers.muon: scales the update, not the weight decay"),
    "muon_scalar_optimizer": Refused("lion needs the emerging-optimizers package; use adam",
                                     values=lambda v: v != "adam"),
    "lion_beta1": _LION_BETA1,
    "lion_beta2": _LION_BETA1,
    "no_weight_decay_cond_type": Honoured("deprecated alias: Megatron turns it into --apply-wd-to-qk-layernorm"),
    # --- training ---
    **honoured(
        "micro_batch_size global_batch_size step_batch_size_schedule decrease_batch_size_if_needed "
        "empty_unused_memory_level check_weight_hash_across_dp_replicas_interval train_sync_interval "
        "train_iters train_samples exit_interval exit_duration_in_mins exit_signal_handler exit_signal "
        "exit_signal_handler_for_training manual_gc manual_gc_interval manual_gc_eval iterations_to_skip "
        "check_for_large_grads result_rejected_tracker_filename bias_swiglu_fusion bias_dropout_fusion "
        "apply_rope_fusion rope_type dump_param_to_param_group_map no_persist_layer_norm"
    ),
    "rampup_batch_size": Refused(
        "megatron-core 0.19.2's training loop no longer reads it, so the batch size stays --global-batch-size; "
        "use --step-batch-size-schedule"
    ),
    "gpu_sniff_test_interval": Refused(
        "benchmarks CUDA GEMMs and NCCL collectives, which exist on the CUDA backend only; drop it",
        requires=("cuda",),
    ),
    "exit_signal_handler_for_dataloader": Refused(
        "megatron-core 0.19.2 reads it nowhere (data-loader workers get the handler from "
        "--exit-signal-handler); drop it"
    ),
    "batch_size": Refused("no longer valid in Megatron; use --micro-batch-size"),
    "recompute_activations": Honoured("selective recompute of core attention on the local spec"),
    "check_for_nan_in_loss_and_grad": Honoured("pretrain_gpt.py's loss_func and Megatron's gradient check"),
    "tp_comm_overlap_cfg": NotApplied(
        "configures Transformer Engine's userbuffers overlap of tensor-parallel communication with GEMMs",
        requires=("transformer_engine",),
    ),
    "checkpoint_activations": Refused(
        "no longer valid in Megatron (it exits at start); use --recompute-activations or "
        "--recompute-granularity with --recompute-method"
    ),
    "masked_softmax_fusion": HONOURED,  # --no-masked-softmax-fusion: the unfused softmax, which runs everywhere
    "bias_gelu_fusion": HONOURED,  # --no-*-fusion flags select the unfused code, which runs everywhere
    "use_flash_attn": Honoured("layer-spec swap to adaptor.ops.flash_attention.FlashAttention; TE's attention with TE"),
    "optimizer": Refused(
        "only adam, sgd, muon (patches.optimizers.muon) and dist_muon (Megatron maps it to muon with its "
        "layer-wise distributed optimizer) run here; lion, soap and adaptive_muon need the "
        "emerging-optimizers package; use adam or muon",
        values=lambda v: v in ("adaptive_muon", "lion", "soap"),
    ),
    "optimizer_cpu_offload": Honoured(
        "patches.memory.optimizer_offload: torch's Adam keeps and steps a fraction of the state in host memory, "
        "on every backend, without --use-precision-aware-optimizer"),
    "optimizer_cuda_graph": NotApplied("captures the optimizer step in a CUDA graph", requires=("cuda",)),
    "optimizer_offload_fraction": Honoured("patches.memory.optimizer_offload: the leading fraction of the "
                                           "elements, in parameter order; [0, 1], with --optimizer-cpu-offload"),
    "use_torch_optimizer_for_cpu_offload": Honoured("patches.memory.optimizer_offload: with "
                                                    "--optimizer-cpu-offload both parts always run torch's Adam"),
    "overlap_cpu_optimizer_d2h_h2d": Honoured(
        "patches.memory.optimizer_offload: the device, not the host, waits for the updated parameters' copies "
        "(on its stream, CUDA/NPU); on the CPU backend copies are synchronous either way"),
    "pin_cpu_grads": Honoured("patches.memory.optimizer_offload: pinned host gradient buffers on CUDA/NPU "
                              "(the CPU backend has no device to pin for)"),
    "pin_cpu_params": Honoured("patches.memory.optimizer_offload: pinned host master copies on CUDA/NPU "
                               "(the CPU backend has no device to pin for)"),
    "dataloader_type": Refused(
        "external passes the dataset through as the iterator, but pretrain_gpt.py's provider returns "
        "GPTDataset samples, not a loader; use single or cyclic",
        values=lambda v: v == "external",
    ),
    "gradient_accumulation_fusion": HONOURED,  # --no-gradient-accumulation-fusion: plain weight-gradient GEMMs
    "deprecated_use_mcore_models": Honoured("no-op: megatron-core models are the only ones, as asked"),
    # --- RNG and initialization ---
    **honoured(
        "seed data_parallel_random_init init_method_xavier_uniform"
    ),
    "te_rng_tracker": Refused(
        "selects Transformer Engine's RNG tracker; without it Megatron silently keeps its own, so drop it",
        requires=("transformer_engine",),
    ),
    "inference_rng_tracker": Refused(
        "an inference RNG tracker that skips the model-parallel RNG streams training relies on; drop it for training"
    ),
    # --- learning rate and weight decay ---
    **honoured(
        "lr_decay_style lr_wsd_decay_style lr_decay_iters lr_decay_samples lr_wsd_decay_iters "
        "lr_wsd_decay_samples lr_warmup_fraction lr_warmup_iters lr_warmup_samples lr_warmup_init "
        "override_opt_param_scheduler use_checkpoint_opt_param_scheduler start_weight_decay end_weight_decay "
        "weight_decay_incr_style lr min_lr decoupled_min_lr"
    ),
    "warmup": Refused("no longer valid in Megatron; use --lr-warmup-fraction or --lr-warmup-iters"),
    "decoupled_lr": HONOURED,  # embedding/output params carry is_embedding_or_output_parameter
    "freeze_all_layers": HONOURED,  # Megatron freezes every parameter (and expert biases); backward is skipped
    # --- checkpointing ---
    **honoured(
        "save save_interval load non_persistent_save_interval non_persistent_global_ckpt_dir finetune "
        "pretrained_checkpoint ckpt_step use_mp_args_from_checkpoint_args "
        "use_tokenizer_model_from_checkpoint_args exit_on_missing_checkpoint ckpt_convert_format "
        "ckpt_convert_save ckpt_convert_update_legacy_dist_opt_format use_persistent_ckpt_worker "
        "async_ckpt_io_priority ckpt_fully_parallel_save_process_group ckpt_load_validate_sharding_integrity "
        "dist_ckpt_strictness dist_ckpt_optim_fully_reshardable distrib_optim_fully_reshardable_mem_efficient "
        "no_save_optim no_save_rng no_load_optim no_load_rng override_ckpt_iteration"
    ),
    "save_params_interval": HONOURED,  # torch.save of named params under --save/params
    "save_activations_interval": HONOURED,  # forward hooks on the local spec's parallel linears
    "save_tokens_per_expert_interval": Refused(
        "records tokens per expert from Transformer Engine's grouped-GEMM experts only, so nothing is written "
        "here; drop it",
        requires=("transformer_engine",),
    ),
    "save_wgrads_interval": HONOURED,  # DDP main_grad buffers
    "save_dgrads_interval": HONOURED,  # backward hooks on the local spec's parallel linears
    "save_retain_interval": HONOURED,  # Megatron's pruning; --keep-checkpoint-max respects it too
    # Reads main params from the checkpoint's model tensors with the distributed optimizer; Megatron's
    # non-distributed fp16/bf16 optimizer asserts that it cannot.
    "load_main_params_from_ckpt": Honoured("with --use-distributed-optimizer and --no-load-optim"),
    "non_persistent_ckpt_type": Refused(
        "local and in_memory non-persistent checkpoints need nvidia-resiliency-ext's local checkpoint manager "
        "(in_memory is not implemented at all); use global",
        values=lambda v: v in ("local", "in_memory"),
    ),
    "non_persistent_local_ckpt_dir": _NON_PERSISTENT_LOCAL_CKPT_DIR,
    "non_persistent_local_ckpt_algo": _NON_PERSISTENT_LOCAL_CKPT_DIR,
    "use_checkpoint_args": HONOURED,  # args come from the common state (JSON in safetensors checkpoints)
    # torch_dcp: with --use-torch-fsdp2 (Megatron's own requirement; adaptor/preflight/parallel_layout.py).
    "ckpt_format": Honoured(
        "safetensors (patches.checkpoint.safetensors_format), torch_dist, torch, torch_dcp (FSDP2) and "
        "fsdp_dtensor (Megatron-FSDP)"),
    "auto_detect_ckpt_format": HONOURED,  # a safetensors checkpoint has metadata.json, so it reads as sharded
    "ckpt_fully_parallel_save": HONOURED,  # safetensors spreads replicas only under the fully-parallel strategy
    # Megatron's persistent worker writes; Megatron turns --async-save off for torch_dist and torch_dcp
    # without --use-persistent-ckpt-worker (safetensors sets it). backend_defaults picks --async-strategy
    # mcore where nvidia-resiliency-ext (the default nvrx) is missing.
    "async_save": Honoured(
        "safetensors; torch_dist and torch_dcp with --use-persistent-ckpt-worker; Megatron's own writer "
        "(--async-strategy mcore) where nvidia-resiliency-ext is not installed"
    ),
    "async_strategy": HONOURED,  # mcore, Megatron's own worker, is the default here without nvidia-resiliency-ext
    "async_ckpt_cpu_priority": HONOURED,  # nice value of the persistent worker
    "async_ckpt_use_cpu_shm": NotApplied(
        "only nvidia-resiliency-ext's async writer stages tensors in shared memory; Megatron's own (mcore) "
        "writer runs here"
    ),
    "ckpt_fully_parallel_load": Honoured("torch_dist loads; safetensors ranks read only their own ranges anyway"),
    "ckpt_fully_parallel_load_exchange_algo": _CKPT_FULLY_PARALLEL_LOAD_EXCHANGE_ALGO,
    "ckpt_fully_parallel_load_process_group": _CKPT_FULLY_PARALLEL_LOAD_EXCHANGE_ALGO,
    "ckpt_assume_constant_structure": Honoured(
        "torch_dist save-plan cache; sharding checks skipped after the first save",
    ),
    "strict_fsdp_dtensor_load": Honoured("--ckpt-format fsdp_dtensor loads (Megatron-FSDP)"),
    "dist_ckpt_save_pre_mcore_014": Refused("megatron-core 0.19.2 reads it nowhere; drop it"),
    "replication": _NON_PERSISTENT_LOCAL_CKPT_DIR,
    "replication_jump": _NON_PERSISTENT_LOCAL_CKPT_DIR,
    "replication_factor": _NON_PERSISTENT_LOCAL_CKPT_DIR,
    "verify_integrity": Honoured("torch_dist; the adaptor refuses it with --ckpt-format safetensors"),
    "stream_ckpt_dequant": NotApplied(
        "changes how FP8/FP4 parameters are dequantized while loading, and such parameters need Transformer Engine",
        requires=("transformer_engine",),
    ),
    "use_dist_ckpt_deprecated": _DEPRECATED_NO_EFFECT,
    "dist_ckpt_format_deprecated": Refused(
        "deprecated and ignored by Megatron, so this format would not be used; choose it with --ckpt-format "
        "(safetensors, torch_dist, torch or torch_dcp)"),
    "dist_ckpt_workers": Honoured("torch_dist async saves with --ckpt-assume-constant-structure"),
    "ckpt_fully_parallel_save_deprecated": _DEPRECATED_NO_EFFECT,
    # --- mixed precision ---
    **honoured(
        "grad_reduce_in_bf16 loss_scale initial_loss_scale min_loss_scale loss_scale_window hysteresis "
        "accumulate_allreduce_grads_in_fp32"
    ),
    "attention_softmax_in_fp32": HONOURED,  # DotProductAttention's FusedScaleMaskSoftmax
    "fp16_lm_cross_entropy": HONOURED,  # passed to GPTModel by pretrain_gpt.py
    "reuse_grad_buf_for_mxfp8_param_ag": NotApplied(
        "reuses gradient buffers for the all-gather of MXFP8 parameters, which need Transformer Engine",
        requires=("transformer_engine",),
    ),
    "mamba_training_ssm_states_dtype": Refused(
        "applies to Mamba layers, which pretrain_gpt.py's GPTModel does not have; drop it"
    ),
    # --- moe ---
    **honoured(
        "num_experts moe_layer_freq moe_router_load_balancing_type moe_aux_loss_coeff "
        "moe_upcycling_granularity"
    ),
    "moe_use_upcycling": HONOURED,  # Megatron's upcycling; GroupedExperts is a SequentialMLP with its state dict
    # --- mla ---
    **honoured(
        "q_lora_rank kv_lora_rank qk_head_dim qk_pos_emb_head_dim v_head_dim rotary_scaling_factor mscale "
        "mscale_all_dim"
    ),
    "cache_mla_latents": Refused(
        "caches MLA latents for the dynamic inference engine only (MLA asserts it is off while training); drop it"
    ),
    "mla_down_proj_fusion": NotApplied(
        "fuses MLA's q/kv down-projections (and the input norm) into Transformer Engine modules; the local "
        "spec runs them unfused",
        requires=("transformer_engine",),
    ),
    # --- experimental_attention_variant ---
    "linear_attention_freq": _GATED_DELTA_NET_SIZE,
    # --- heterogeneous architecture ---
    "heterogeneous_layers_config_path": _HETEROGENEOUS_LAYERS_CONFIG_PATH,
    "heterogeneous_layers_config_encoded_json": _HETEROGENEOUS_LAYERS_CONFIG_PATH,

    # --- profiling ---
    **honoured(
        "profile_step_start profile_step_end pytorch_profiler_collect_shapes "
        "pytorch_profiler_collect_callstack profile_ranks"
    ),
    "profile": Honoured("on CUDA Megatron's nsys range or --use-pytorch-profiler; on NPU and CPU, or with MindSpeed's "
                        "--profile-* flags, torch_npu.profiler / torch.profiler (patches.diagnostics.profiling)"),
    "use_pytorch_profiler": Honoured("Megatron's torch.profiler path on CUDA; on NPU/CPU patches.diagnostics.profiling "
                                     "profiles with or without it"),
    "pytorch_profiler_collect_chakra": Honoured("on CUDA through Megatron's --use-pytorch-profiler path; refused "
                                                "where patches.diagnostics.profiling profiles"),
    "record_memory_history": Refused(
        "records the CUDA caching allocator's history, which only the CUDA backend keeps here; set "
        "ADAPTOR_REPORT_MEMORY=1 for each rank's memory instead", requires=("cuda",)),
    "memory_snapshot_path": Refused(
        "is where --record-memory-history writes CUDA allocator snapshots, which only the CUDA backend "
        "keeps here; drop it", requires=("cuda",)),
    "record_shapes": Refused(
        "adds shapes to the NVTX ranges of an Nsight Systems capture, which needs CUDA; use "
        "--use-pytorch-profiler --pytorch-profiler-collect-shapes instead", requires=("cuda",)),
    "nvtx_ranges": Refused(
        "adds NVTX ranges for Nsight Systems, which needs CUDA; use --use-pytorch-profiler instead",
        requires=("cuda",)),
    # --- distributed init ---
    **honoured(
        "distributed_timeout_minutes local_rank use_tp_pp_dp_mapping use_gloo_process_groups "
        "decoder_first_pipeline_num_layers decoder_last_pipeline_num_layers "
        "num_virtual_stages_per_pipeline_rank overlap_p2p_comm overlap_grad_reduce ddp_num_buckets "
        "ddp_bucket_size ddp_pad_buckets_for_high_nccl_busbw "
        "ddp_param_name_patterns_for_fp32_local_accumulation overlap_param_gather "
        "overlap_param_gather_with_optimizer_step align_param_gather use_distributed_optimizer "
        "num_distributed_optimizer_instances"
    ),
    "distributed_backend": Honoured("init_process_group; backend_defaults picks gloo/nccl/hccl when not given"),
    "align_grad_reduce": HONOURED,  # with --overlap-grad-reduce and pipeline stages
    "lazy_mpu_init": Refused(
        "skips setting up torch.distributed so that an external launcher can finish it, which "
        "pretrain_gpt.py never does; drop it"),
    "use_megatron_fsdp": Honoured(
        "megatron-core's Megatron-FSDP on every backend; off CUDA patches.command_line.backend_defaults "
        "leaves CUDA_DEVICE_MAX_CONNECTIONS unset and turns off the NCCL-only divide-in-reduce"),
    "use_torch_fsdp2": Honoured("patches.fsdp2.torch_fsdp2"),
    "nccl_communicator_config_path": NotApplied(
        "tunes NCCL communicators (CTAs, cluster size, network) on CUDA; this backend's collectives are "
        "not NCCL's", requires=("cuda",)),
    "use_sharp": NotApplied(
        "offloads data-parallel NCCL collectives to InfiniBand SHARP switches on CUDA; this backend's collectives "
        "are not NCCL's",
        requires=("cuda",)),
    "sharp_enabled_group": NotApplied(
        "picks the group whose NCCL collectives InfiniBand SHARP offloads on CUDA; this backend's collectives "
        "are not NCCL's",
        requires=("cuda",)),
    "high_priority_stream_groups": NotApplied(
        "gives NCCL communicators high-priority CUDA streams to overlap communication on CUDA; this backend's collectives "
        "are not NCCL's",
        requires=("cuda",)),
    "distributed_timeout_seconds_after_init": HONOURED,  # ProcessGroup.set_timeout after the first iteration
    "flight_recorder_dump_path": Honoured("sets torch's flight-recorder environment variables before init_process_group"),
    "flight_recorder_trace_buffer_size": HONOURED,  # flight-recorder environment variable, as above
    "flight_recorder_dump_on_timeout": HONOURED,  # flight-recorder environment variable, as above
    "flight_recorder_include_stack_trace": HONOURED,  # flight-recorder environment variable, as above
    "flight_recorder_include_only_active": HONOURED,  # flight-recorder environment variable, as above
    "flight_recorder_extra_dump_on_exec": HONOURED,  # flight-recorder environment variable, as above
    "disable_jit_fuser": Honoured("torch.compile is off for the run (patches/upstream_fixes/disable_jit_fuser)"),
    "pipeline_model_parallel_layout": HONOURED,  # pretrain_gpt.py places MTP and data by the layout
    "model_parallel_size": Refused(
        "an old spelling Megatron no longer accepts; pass --tensor-model-parallel-size instead"),
    "num_layers_per_virtual_pipeline_stage": HONOURED,  # vp_stage reaches model and dataset providers
    "ddp_reduce_scatter_with_fp32_accumulation": HONOURED,  # all_to_all_single + local fp32 sum
    "ddp_average_in_collective": NotApplied(
        "averages gradients inside the collective (ReduceOp.AVG), which gloo and hccl lack; gradients are "
        "scaled by 1/data-parallel size before the sum instead, the same average", requires=("cuda",)),
    "use_layer_wise_param_layout": HONOURED,  # read by the layer-wise (dist_*) optimizers
    "nccl_ub": NotApplied(
        "registers data-parallel buffers with NCCL (user buffers) to spare SMs on CUDA; this backend's collectives "
        "are not NCCL's",
        requires=("cuda",)),
    "disable_symmetric_registration": NotApplied(
        "chooses how --use-nccl-ub registers NCCL user buffers on CUDA; this backend's collectives are "
        "not NCCL's", requires=("cuda",)),
    "fsdp_manual_registration": NotApplied(
        "registers Megatron-FSDP's buffers with NCCL by hand on CUDA; Megatron-FSDP does not run on this backend (shard with --use-torch-fsdp2 here)", requires=("cuda",)),
    "create_all_gather_group": Honoured("Megatron-FSDP: a second data-parallel group for its all-gathers, so they overlap its reduce-scatters"),
    "data_parallel_sharding_strategy": Honoured("Megatron-FSDP: no_shard, optim, optim_grads, optim_grads_params"),
    "outer_dp_sharding_strategy": Honoured(
        "Megatron-FSDP: no_shard or optim over the outer data-parallel group (hybrid sharding, with "
        "--num-distributed-optimizer-instances > 1, which patches.command_line.backend_defaults refuses off CUDA)"),
    "gradient_reduce_div_fusion": Honoured(
        "Megatron-FSDP's divide-in-reduce (NCCL's pre-multiplied sum); off CUDA patches.command_line."
        "backend_defaults turns it off, since gloo and HCCL have no such reduction"),
    "fsdp_double_buffer": _MEGATRON_FSDP_MEMORY,
    "suggested_communication_unit_size": _MEGATRON_FSDP_MEMORY,
    "keep_fp8_transpose_cache": NotApplied(
        "keeps Transformer Engine's FP8 transpose cache under Megatron-FSDP on CUDA; neither runs on this "
        "backend", requires=("cuda", "transformer_engine")),
    "enable_full_sharding_in_hsdp": Refused(
        "is read by nothing in megatron-core 0.19.2, so it changes nothing; drop it"),
    "torch_fsdp2_reshard_after_forward": Honoured("patches.fsdp2.torch_fsdp2 (reshard_after_forward: false)"),
    "cp_comm_type": Honoured("patches.long_context.context_parallel: p2p, a2a, a2a+p2p (allgather refused)"),
    "fake_process_group": Refused(
        "a fake process group skips every collective to profile one GPU's CUDA memory, which this backend "
        "does not have; train with real processes instead", requires=("cuda",)),
    # --- validation ---
    **honoured(
        "eval_iters eval_interval start_eval_at_iter eval_global_batch_size skip_train"
    ),
    "eval_micro_batch_size": Refused(
        "pretrain_gpt.py receives batches on tensor-parallel ranks at --micro-batch-size, so a different evaluation micro-batch fails once tensor parallelism is on; drop it "
        "(evaluation then uses --micro-batch-size)"),
    "test_mode": Honoured("Megatron's check that q/k-norm parameters agree across DP and TP ranks, every step; "
                          "upstream_fixes.qk_norm_consistency_check makes it work for RMSNorm"),
    "full_validation": Refused(
        "full validation reads one sample per micro-batch, while pretrain_gpt.py receives batches on tensor-parallel ranks at --micro-batch-size; evaluate a fixed number of "
        "batches with --eval-iters instead"),
    "multiple_validation_sets": Refused(
        "pretrain_gpt.py blends the --valid-data-path prefixes into one validation dataset; evaluate each "
        "set in a run of its own (--skip-train with --load) or drop it"),
    "validation_set_names": Refused(
        "names the separate validation sets of --multiple-validation-sets, which pretrain_gpt.py does not "
        "build; drop it"),
    # --- data and dataloader ---
    **honoured(
        "data_path phase_transition_iterations split train_data_path valid_data_path test_data_path "
        "per_split_data_args_path data_cache_path mmap_bin_files mock_data seq_length num_workers "
        "eod_mask_loss create_attention_mask_in_dataloader num_dataset_builder_threads "
        "mid_level_dataset_surplus allow_ambiguous_pad_tokens"
    ),
    "data_args_path": HONOURED,  # get_blend_and_blend_per_split in pretrain_gpt.py
    "per_dataset_sequences_path": NotApplied(
        "reads sequence counts from a JSON file to speed up dataset start-up, and pretrain_gpt.py does not "
        "pass it to GPTDataset; the counts are read from the .idx files"),
    "dataloader_fast_cache_load": NotApplied(
        "loads the prebuilt index caches without the usual checks to speed up dataset start-up, and "
        "pretrain_gpt.py does not pass it to GPTDataset; the caches are checked and built as usual"),
    "dataloader_defer_npy_index_mmap": NotApplied(
        "defers mapping the index caches until first use to speed up dataset start-up, and pretrain_gpt.py "
        "does not pass it to GPTDataset; they are mapped when the datasets are built"),
    "encoder_seq_length": HONOURED,  # becomes --seq-length when that is not given
    "decoder_seq_length": Refused(
        "sets the decoder length of encoder-decoder models, and under pipeline parallelism a GPT model "
        "would exchange activations of that length; use --seq-length"),
    "sample_rate": Refused("is read by none of the code pretrain_gpt.py runs (no dataset here subsamples); drop it"),
    "mask_prob": _MASK_PROB,
    "short_seq_prob": _MASK_PROB,
    "reset_position_ids": HONOURED,  # positions reach learned absolute embeddings; RoPE ignores them (as upstream)
    "reset_attention_mask": Honoured("patches.long_context.packed_sequences: THD boundaries with the fused attention, the dense mask otherwise"),
    "dataloader_inter_document_masking": Honoured("patches.long_context.packed_sequences (document boundaries reach attention as THD)"),
    "object_storage_cache_path": Refused(
        "pretrain_gpt.py does not pass it to GPTDataset, so object-storage (s3://, msc://) datasets cannot "
        "be read; copy the data to a local or mounted filesystem"),
    "fim_data": Honoured("pretrain_gpt.py builds Megatron's GPTFIMDataset; adaptor.fim_data checks its tokens first"),
    **honoured("fim_rate fim_spm_rate fim_split_sample fim_fragment_rate fim_no_prefix fim_prefix_token "
               "fim_middle_token fim_suffix_token fim_pad_token fim_eod_token"),
    # --- tokenizer ---
    **honoured(
        "padded_vocab_size vocab_file merge_file tokenizer_model metadata_path tiktoken_num_special_tokens "
        "tokenizer_sentencepiece_ignore_extra_whitespaces null_tokenizer_eod_id null_tokenizer_pad_id"
    ),
    "vocab_size": HONOURED,  # NullTokenizer's and TikTokenizer's vocabulary; other tokenizers report their own
    "pad_vocab_size": Refused(
        "pretrain_gpt.py sizes the model by the padded vocabulary, which this leaves unset; set it exactly "
        "with --padded-vocab-size instead"),
    "vocab_extra_ids": Refused(
        "adds T5 span-masking tokens, which none of the tokenizers built here reads; drop it"),
    "tokenizer_type": Refused(
        "builds the multimodal prompt tokenizer of other Megatron-LM programs; use a text tokenizer "
        "such as HuggingFaceTokenizer (a tokenizer.json needs no transformers) or NullTokenizer",
        values=lambda v: v in ("MultimodalTokenizer", "NullMultimodalTokenizer")),  # SFTTokenizer: with --sft
    "special_tokens": HONOURED,  # added to the tokenizer (tokenizer.json reader included): vocabulary grows
    "tiktoken_pattern": HONOURED,  # TikTokenizer needs the tiktoken package; Megatron says so without it
    "tokenizer_sentencepiece_legacy": HONOURED,  # sentencepiece tokenizers (package optional, checked by Megatron)
    "tokenizer_hf_no_use_fast": HONOURED,  # the tokenizer comes from transformers, as upstream builds it
    "tokenizer_hf_no_include_special_tokens": HONOURED,  # the tokenizer.json reader takes it too
    "trust_remote_code": HONOURED,  # passed to transformers when it builds the tokenizer
    "chat_template": Refused(
        "pretraining reads tokenized data and renders no chat template; drop it"),
    # --- autoresume ---
    "adlr_autoresume": Refused(
        "needs ADLR's cluster library userlib.auto_resume, which no public package provides, and without it "
        "Megatron exits before training; resume with --save/--load instead (--exit-duration-in-mins saves "
        "before a time limit)"),
    "adlr_autoresume_interval": Refused(
        "is read only by --adlr-autoresume, which needs ADLR's unpublished userlib.auto_resume; drop it"),
    # --- logging ---
    **honoured(
        "log_interval log_params_norm log_progress timing_log_level timing_log_option "
        "tensorboard_log_interval tensorboard_queue_size log_timers_to_tensorboard "
        "log_loss_scale_to_tensorboard log_validation_ppl_to_tensorboard log_num_zeros_in_grad "
        "log_world_size_to_tensorboard wandb_exp_name wandb_save_dir wandb_entity logging_level"
    ),
    "log_throughput": Honoured("TFLOP/s per device and MFU (patches.diagnostics.throughput)"),
    "tensorboard_dir": HONOURED,  # needs the tensorboard package (.[tensorboard]); without it Megatron warns and writes no events
    "log_memory_to_tensorboard": Honoured(
        "the CUDA allocator's statistics on CUDA; on CPU and NPU patches.diagnostics.tensorboard_memory writes "
        "the host's RSS and the NPU allocator's figures"),
    "log_memory_interval": HONOURED,  # Megatron's memory report; its allocator figures read 0 on CPU
    "log_device_memory_used": Refused(
        "reads device memory through NVIDIA's NVML, which only the CUDA backend has; set "
        "ADAPTOR_REPORT_MEMORY=1 for each rank's memory instead", requires=("cuda",)),
    "log_max_attention_logit": Refused(
        "only Transformer Engine's attention records the largest attention logit, and the local attention "
        "used here does not; drop it", requires=("transformer_engine",)),
    "barrier_with_L1_time": HONOURED,
    "wandb_project": HONOURED,  # needs wandb (.[wandb]): without it the last rank stops at start-up (ModuleNotFoundError)
    "log_energy": Refused(
        "reads GPU energy from NVIDIA's NVML, which only the CUDA backend has; drop it", requires=("cuda",)),
    "moe_routing_trace_path": Honoured("forward hooks on every TopKRouter, one JSONL file per rank, on every backend"),
    "moe_routing_trace_max_training_iters": HONOURED,  # router trace, as above
    "moe_routing_trace_capture_logits": HONOURED,  # router trace, as above
    "moe_routing_trace_capture_hidden_states": HONOURED,  # router trace, as above
    "moe_routing_trace_dump_weights": HONOURED,  # router trace, as above

    # --- options ---
    **honoured(
        "help"
    ),
    # --- rl ---
    "perform_rl_step": Refused(
        "reinforcement-learning (GRPO) training needs the megatron.rl package and Megatron-LM's RL "
        "programs, which this installation does not include; drop it (pretrain_gpt.py does pretraining "
        "only)",
    ),
    "rl_prompts_per_eval": _RL_PROMPTS_PER_EVAL,
    "grpo_prompts_per_step": _RL_PROMPTS_PER_EVAL,
    "grpo_group_size": _RL_PROMPTS_PER_EVAL,
    "rl_generation_lag": _RL_PROMPTS_PER_EVAL,
    "rl_submission_granularity": _RL_PROMPTS_PER_EVAL,
    "rl_consumption_granularity": _RL_PROMPTS_PER_EVAL,
    "grpo_iterations": _RL_PROMPTS_PER_EVAL,
    "grpo_clamp_eps_lower": _RL_PROMPTS_PER_EVAL,
    "grpo_clamp_eps_upper": _RL_PROMPTS_PER_EVAL,
    "grpo_kl_beta": _GRPO_KL_BETA,
    "grpo_entropy_term_weight": _RL_PROMPTS_PER_EVAL,
    "grpo_filter_groups_with_same_reward": _RL_PROMPTS_PER_EVAL,
    "langrl_env_config": _RL_PROMPTS_PER_EVAL,
    "rl_default_temperature": _RL_PROMPTS_PER_EVAL,
    "rl_default_top_p": _RL_PROMPTS_PER_EVAL,
    "rl_default_top_k": _RL_PROMPTS_PER_EVAL,
    "rl_offload_optimizer_during_inference": _RL_PROMPTS_PER_EVAL,
    "rl_kv_cache_management_mode": _RL_PROMPTS_PER_EVAL,
    "rl_persist_cuda_graphs": _RL_PROMPTS_PER_EVAL,
    "rl_partial_rollouts": _RL_PROMPTS_PER_EVAL,
    "rl_inference_logprobs_is_correction": _RL_PROMPTS_PER_EVAL,
    "rl_importance_sampling_truncation_coef": _RL_PROMPTS_PER_EVAL,
    "rl_use_sequence_packing": _RL_PROMPTS_PER_EVAL,
    "rl_sequence_packing_max_sequences_per_bin": _RL_PROMPTS_PER_EVAL,
    "rl_sequence_packing_algo": _RL_PROMPTS_PER_EVAL,
    "rl_training_cuda_graphs": _RL_PROMPTS_PER_EVAL,
    "rl_inference_tensor_model_parallel_size": _RL_PROMPTS_PER_EVAL,
    "rl_inference_pipeline_model_parallel_size": _RL_PROMPTS_PER_EVAL,
    "rl_inference_expert_model_parallel_size": _RL_PROMPTS_PER_EVAL,
    "rl_inference_expert_tensor_model_parallel_size": _RL_PROMPTS_PER_EVAL,
    "rl_inference_model_unified_memory_level": _RL_PROMPTS_PER_EVAL,
    "rl_offload_inference_model_weights_when_idle": _RL_PROMPTS_PER_EVAL,
    "refit_method": _GRPO_KL_BETA,
    "rl_verify_model_weights_swap": _RL_PROMPTS_PER_EVAL,
    "rl_skip_bos_token": _RL_PROMPTS_PER_EVAL,
    "rl_profile": _GRPO_KL_BETA,
    "rl_profile_dir": _GRPO_KL_BETA,
    "rl_inference_parsers": _RL_PROMPTS_PER_EVAL,
    # --- biencoder ---
    "ict_head_size": _ICT_HEAD_SIZE,
    "biencoder_projection_dim": _ICT_HEAD_SIZE,
    "biencoder_shared_query_context_model": _ICT_HEAD_SIZE,
    "ict_load": _ICT_HEAD_SIZE,
    "bert_load": _ICT_HEAD_SIZE,
    "titles_data_path": _ICT_HEAD_SIZE,
    "query_in_block_prob": _ICT_HEAD_SIZE,
    "use_one_sent_docs": _ICT_HEAD_SIZE,
    "evidence_data_path": _ICT_HEAD_SIZE,
    "retriever_report_topk_accuracies": _ICT_HEAD_SIZE,
    "retriever_score_scaling": _ICT_HEAD_SIZE,
    "block_data_path": _ICT_HEAD_SIZE,
    "embedding_path": _ICT_HEAD_SIZE,
    "indexer_batch_size": _ICT_HEAD_SIZE,
    "indexer_log_interval": _ICT_HEAD_SIZE,
    # --- vision ---
    "num_classes": _NUM_CLASSES,
    "img_h": _NUM_CLASSES,
    "img_w": _NUM_CLASSES,
    "num_channels": _NUM_CLASSES,
    "patch_dim": _NUM_CLASSES,
    "classes_fraction": _NUM_CLASSES,
    "data_per_class_fraction": _NUM_CLASSES,
    "data_sharding": Honoured(
        "Megatron's random sampler (--dataloader-type cyclic); the default single sampler has no shards",
    ),
    "head_lr_mult": _NUM_CLASSES,
    "vision_pretraining": _NUM_CLASSES,
    "vision_pretraining_type": _NUM_CLASSES,
    "vision_backbone_type": _NUM_CLASSES,
    "swin_backbone_type": _NUM_CLASSES,
    "mask_type": _NUM_CLASSES,
    "mask_factor": _NUM_CLASSES,
    "iter_per_epoch": _NUM_CLASSES,
    "dino_local_img_size": _NUM_CLASSES,
    "dino_local_crops_number": _NUM_CLASSES,
    "dino_head_hidden_size": _NUM_CLASSES,
    "dino_bottleneck_size": _NUM_CLASSES,
    "dino_freeze_last_layer": _NUM_CLASSES,
    "dino_norm_last_layer": _NUM_CLASSES,
    "dino_warmup_teacher_temp": _NUM_CLASSES,
    "dino_teacher_temp": _NUM_CLASSES,
    "dino_warmup_teacher_temp_epochs": _NUM_CLASSES,
    # --- Logits Distillation ---
    "logits_save_top_k": _LOGITS_SAVE_TOP_K,
    "logits_save_top_p": _LOGITS_SAVE_TOP_K,
    "logits_save_top_p_min_k": _LOGITS_SAVE_TOP_K,
    "logits_save_dir": Refused(
        "caching teacher log-probs for distillation is not supported here (the files would be written "
        "only at --async-save checkpoints, and pretrain_gpt.py has no distillation loss to read them); "
        "drop it",
    ),
    "logits_save_dtype": _LOGITS_SAVE_TOP_K,
    "logits_load_dir": Refused(
        "pretrain_gpt.py's loss is the language-model loss only and reads no cached teacher log-probs (no"
        " knowledge distillation); drop it",
    ),
    "logits_load_decode_threads": _LOGITS_LOAD_DECODE_THREADS,
    "logits_load_prefetch_factor": _LOGITS_LOAD_DECODE_THREADS,
    "logits_load_msc_prefetch_depth": _LOGITS_LOAD_DECODE_THREADS,
    "logits_load_kd_loss_alpha": _LOGITS_LOAD_DECODE_THREADS,
    "logits_load_ignore_errors": _LOGITS_LOAD_DECODE_THREADS,
    # --- straggler ---
    "log_straggler": Refused(
        "the straggler detector needs the timing hooks of Megatron-LM's own pretrain_gpt.py, which this "
        "pretrain_gpt.py does not have (off CUDA it stays off, on CUDA its first report fails); drop it",
    ),
    "straggler_ctrlr_port": _STRAGGLER_CTRLR_PORT,
    "straggler_minmax_count": _STRAGGLER_CTRLR_PORT,
    "disable_straggler_on_startup": _STRAGGLER_CTRLR_PORT,
    # --- workload inspector ---
    "run_workload_inspector_server": Honoured(
        "Megatron's training loop starts the workload_inspector package's server, or prints that the "
        "package is missing",
    ),
    # --- inference ---
    "inference_batch_times_seqlen_threshold": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "max_tokens_to_oom": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "output_bert_embeddings": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "bert_embedder_type": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "cuda_graph_scope_deprecated": _CUDA_GRAPH_SCOPE_DEPRECATED,
    "cuda_graph_modules": _CUDA_GRAPH_SCOPE_DEPRECATED,
    "use_legacy_static_engine": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_max_requests": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_max_seq_length": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_buffer_size_gb": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_paused_buffer_size_gb": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_mamba_memory_ratio": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_block_size": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_max_requests": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_max_tokens": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_num_cuda_graphs": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_track_paused_request_events": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_track_generated_token_events": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "decode_only_cuda_graphs": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_cuda_graph_all_prefills": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_cuda_graph_max_tokens": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_unified_memory_level": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "enable_chunked_prefill": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "num_speculative_tokens": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_enable_prefix_caching": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_prefix_caching_eviction_policy": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_prefix_caching_coordinator_policy": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_prefix_caching_routing_alpha": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_prefix_caching_mamba_gb": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_cuda_graph_mixed_prefill_count": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_cuda_graph_sizing_distribution": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_sampling_backend": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "offset_sampling_seed_by_dp_rank": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_async_sched_mode": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_dynamic_batching_logprobs_mode": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_logging_step_interval": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_text_gen_server_logging": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_wandb_logging": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_coordinator_port": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "mamba_inference_conv_states_dtype": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "mamba_inference_ssm_states_dtype": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_use_synchronous_zmq_collectives": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_disable_ep_consensus": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    "inference_shards": _INFERENCE_BATCH_TIMES_SEQLEN_THRESHOLD,
    # --- Transformer-Engine ---
    "fp4_param_gather": Refused(
        "keeping parameters in FP4 needs Transformer Engine's NVFP4 weights (with --fp4-format and "
        "--transformer-impl transformer_engine); drop it",
        requires=("transformer_engine",),
    ),
    "fp8_param_gather": Refused(
        "keeping parameters in FP8 needs Transformer Engine's FP8 weights (with --fp8-format and "
        "--transformer-impl transformer_engine); drop it",
        requires=("transformer_engine",),
    ),
    "te_precision_config_file": Refused(
        "per-module precision overrides are applied by Transformer Engine's modules only; drop it",
        requires=("transformer_engine",),
    ),
    # --- experimental ---
    "enable_experimental": HONOURED,  # megatron-core's experimental switch (read by its fused MoE routing-map paths)
    "spec": Refused(
        "pretrain_gpt.py always builds the layer spec the adaptor picks (megatron-core's local spec, or "
        "Transformer Engine's under --transformer-impl transformer_engine) and imports no spec module; "
        "drop it ('--spec local' is accepted)",
        values=lambda v: list(v or []) != ["local"],
    ),
    "hybrid_layer_pattern": _HYBRID_LAYER_PATTERN,
    "hybrid_override_pattern": _HYBRID_LAYER_PATTERN,
    "yaml_cfg": Refused(
        "a YAML file replaces the command-line arguments through Megatron's experimental path, which "
        "skips the adaptor's backend defaults and checks; pass the flags on the command line instead",
    ),
    "use_precision_aware_optimizer": Refused(
        "lower-precision optimizer state needs Transformer Engine's FusedAdam; drop it (the optimizer "
        "keeps fp32 state; --optimizer-cpu-offload does not need it here)",
        requires=("transformer_engine",),
    ),
    "main_grads_dtype": _MAIN_GRADS_DTYPE,
    "main_params_dtype": _MAIN_GRADS_DTYPE,
    "exp_avg_dtype": _MAIN_GRADS_DTYPE,
    "exp_avg_sq_dtype": _MAIN_GRADS_DTYPE,
    "megatron_fsdp_main_params_dtype": _MEGATRON_FSDP_DTYPE,
    "megatron_fsdp_main_grads_dtype": _MEGATRON_FSDP_DTYPE,
    "megatron_fsdp_grad_comm_dtype": _MEGATRON_FSDP_DTYPE,
    "megatron_fsdp_enable_fine_grained_param_gather": _MEGATRON_FSDP_MEMORY,
    "megatron_fsdp_max_pool_double_buffer": _MEGATRON_FSDP_MEMORY,
    "fsdp_db_use_persist_buf_on_alloc_fail": _MEGATRON_FSDP_MEMORY,
    # --- one logger ---
    **honoured(
        "one_logger_project one_logger_run_name one_logger_async app_tag_run_name app_tag_run_version"
    ),
    "enable_one_logger": HONOURED,  # Megatron's loop; E2E metrics need the one_logger package (it warns when missing)
    # --- In-process restart ---
    "inprocess_restart": Refused(
        "pretrain_gpt.py does not wrap training in nvidia-resiliency-ext's in-process restart; drop it "
        "and let torchrun restart a failed job (--max-restarts)",
    ),
    "inprocess_max_iterations": _INPROCESS_MAX_ITERATIONS,
    "inprocess_monitor_thread_interval": _INPROCESS_MAX_ITERATIONS,
    "inprocess_monitor_process_interval": _INPROCESS_MAX_ITERATIONS,
    "inprocess_progress_watchdog_interval": _INPROCESS_MAX_ITERATIONS,
    "inprocess_heartbeat_interval": _INPROCESS_MAX_ITERATIONS,
    "inprocess_soft_timeout": _INPROCESS_MAX_ITERATIONS,
    "inprocess_hard_timeout": _INPROCESS_MAX_ITERATIONS,
    "inprocess_heartbeat_timeout": _INPROCESS_MAX_ITERATIONS,
    "inprocess_barrier_timeout": _INPROCESS_MAX_ITERATIONS,
    "inprocess_completion_timeout": _INPROCESS_MAX_ITERATIONS,
    "inprocess_last_call_wait": _INPROCESS_MAX_ITERATIONS,
    "inprocess_termination_grace_time": _INPROCESS_MAX_ITERATIONS,
    "inprocess_granularity": _INPROCESS_MAX_ITERATIONS,
    "inprocess_active_world_size": _INPROCESS_MAX_ITERATIONS,
    "inprocess_empty_cuda_cache": _INPROCESS_MAX_ITERATIONS,
    # --- ft_package ---
    **honoured(
        "calc_ft_timeouts ft_num_warmup_iters"
    ),
    "enable_ft_package": HONOURED,  # Megatron's loop; needs nvidia-resiliency-ext and ft_launcher
    # --- rerun engine ---
    **honoured(
        "error_injection_type rerun_mode"
    ),
    "error_injection_rate": HONOURED,  # Megatron's rerun state machine; injects into the loss/grad checks
    "check_for_spiky_loss": Refused(
        "pretrain_gpt.py's loss check covers NaN and Inf only (--check-for-nan-in-loss-and-grad); the "
        "spiky-loss check is not implemented, so drop it",
    ),
    # --- msc ---
    "enable_msc": Refused(
        "remote Multi-Storage Client paths are not supported here: pretrain_gpt.py's datasets and "
        "checkpoints read and write local paths; drop it and use local or mounted paths",
    ),
    "disable_msc_deprecated": HONOURED,  # a deprecated no-op, as its help says
    # --- sft ---
    "sft": Honoured("Megatron's SFTDataset and SFTTokenizer; pretrain_gpt.py and posttrain_gpt.py pass its "
                    "conversation boundaries to attention"),
    "sft_tokenizer_prompt_format": Honoured("SFTTokenizer's prompt format"),
    # --- fault injector ---
    **honoured(
        "fault_injector_num_ranks fault_injector_fault_types fault_injector_fault_probabilities "
        "fault_injector_fault_delay fault_injector_delay_start_iteration fault_injector_mtti_seconds "
        "fault_injector_offset_seconds fault_injector_seed"
    ),
    "fault_injector_ranks": HONOURED,  # Megatron's training loop; needs nvidia-resiliency-ext
}
