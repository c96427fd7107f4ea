"""The features: one module each, grouped by concern; each module's docstring names the
upstream code it changes and why.

``all_features()`` lists them in registry order: the order their command-line rewrites,
defaults, checks and patches run, and the order their layer-spec swaps are applied (a later
feature's swap of the same upstream class wins).
"""
from __future__ import annotations


def all_features():
    from patches.checkpoint.load_shape_check import LoadShapeCheck
    from patches.checkpoint.optimizer_state_from_start import OptimizerStateFromStart
    from patches.checkpoint.safe_torch_load import SafeTorchLoad
    from patches.checkpoint.safetensors_format import SafetensorsFormat
    from patches.checkpoint.save_failures import SaveFailures
    from patches.command_line.argument_checks import ArgumentChecks
    from patches.command_line.backend_defaults import BackendDefaults
    from patches.command_line.megatron_flag_policy import MegatronFlagPolicy
    from patches.command_line.mindspeed_llm_arguments import MindSpeedLlmArguments
    from patches.command_line.single_process_launch import SingleProcessLaunch
    from patches.device.all_to_all_split_sizes import AllToAllSplitSizes
    from patches.device.allow_no_cuda import AllowNoCuda
    from patches.device.cpu_device import CpuDevice
    from patches.device.device_agnostic_clip_grads import DeviceAgnosticClipGrads
    from patches.device.elastic_restarts import ElasticRestarts
    from patches.device.gloo_uneven_collectives import GlooUnevenCollectives
    from patches.device.npu_device import NpuDevice
    from patches.device.optimizer_tensor_type_names import OptimizerTensorTypeNames
    from patches.diagnostics.collective_timeouts import CollectiveTimeouts
    from patches.diagnostics.memory_report import MemoryReport
    from patches.diagnostics.cpu_precision import CpuPrecision
    from patches.diagnostics.profiling import Profiling
    from patches.diagnostics.tensorboard_memory import TensorboardMemory
    from patches.diagnostics.throughput import Throughput
    from patches.finetune.lora import Lora
    from patches.finetune.preference_training import PreferenceTraining
    from patches.finetune.supervised_fine_tuning import SupervisedFineTuning
    from patches.fsdp2.sharded_checkpoint import ShardedCheckpoint
    from patches.fsdp2.torch_fsdp2 import TorchFsdp2
    from patches.fusions.cross_entropy import CrossEntropyFusion
    from patches.fusions.flash_attention import FlashAttentionFusion
    from patches.fusions.fused_adam import FusedTorchAdam
    from patches.fusions.grouped_matmul import GroupedMatmulFusion
    from patches.fusions.moe_permute import MoePermuteFusion
    from patches.fusions.rmsnorm import RmsNormFusion
    from patches.fusions.rope import RopeFusion
    from patches.fusions.swiglu import SwigluFusion
    from patches.hf.architecture_from_config import ArchitectureFromConfig
    from patches.hf.online_conversion import OnlineConversion
    from patches.inference.evaluation import Evaluation
    from patches.inference.generation import Generation
    from patches.long_context.context_parallel import ContextParallel
    from patches.long_context.packed_sequences import PackedSequences
    from patches.memory.activation_offload import ActivationOffload
    from patches.memory.optimizer_offload import OptimizerOffload
    from patches.memory.recompute import Recompute
    from patches.hf.tokenizer_json import TokenizerJsonSupport
    from patches.models.gated_delta_net import GatedDeltaNetWithoutFla
    from patches.models.layernorm_1p import Layernorm1p
    from patches.models.mla import MlaWithoutTransformerEngine
    from patches.multimodal.mm_arguments import MultimodalArguments
    from patches.multimodal.qwen_vl_hf_save import QwenVlHfSave
    from patches.multimodal.vision_tower_norms import VisionTowerNorms
    from patches.optimizers.muon import MuonOptimizer
    from patches.preflight.checkpoint_inputs import CheckpointInputs
    from patches.preflight.data_files import DataFiles
    from patches.preflight.output_dirs import OutputDirs
    from patches.upstream_fixes.async_save_host_snapshot import AsyncSaveHostSnapshot
    from patches.upstream_fixes.atomic_tracker import AtomicTracker
    from patches.upstream_fixes.checkpoint_results_queue import CheckpointResultsQueue
    from patches.upstream_fixes.disable_jit_fuser import DisableJitFuser
    from patches.upstream_fixes.distributed_optimizer_resume import DistributedOptimizerResume
    from patches.upstream_fixes.empty_dataset_split import EmptyDatasetSplit
    from patches.upstream_fixes.first_iteration_log import FirstIterationLog
    from patches.upstream_fixes.fsdp_dtensor_checkpoint import FsdpDtensorCheckpoint
    from patches.upstream_fixes.layer_wise_optimizer_fp32 import LayerWiseOptimizerFp32
    from patches.upstream_fixes.megatron_fsdp_grad_scaling import MegatronFsdpGradScaling
    from patches.upstream_fixes.mtp_loss_context_parallel import MtpLossContextParallel
    from patches.upstream_fixes.no_validation_split import NoValidationSplit
    from patches.upstream_fixes.prebuilt_dataset_helpers import PrebuiltDatasetHelpers
    from patches.upstream_fixes.qk_norm_consistency_check import QkNormConsistencyCheck
    from patches.upstream_fixes.resume_rng_state import ResumeRngState
    from patches.upstream_fixes.sequence_parallel_torch_norm import SequenceParallelTorchNorm
    from patches.upstream_fixes.torch_dcp_checkpoints import TorchDcpCheckpoints

    return [
        # The command line first: rewrites, backend defaults, launch, early checks.
        MindSpeedLlmArguments(),
        BackendDefaults(),
        SingleProcessLaunch(),
        ArgumentChecks(),
        # Every file and directory the run reads or writes, before the first step.
        DataFiles(),
        CheckpointInputs(),
        OutputDirs(),
        # The device Megatron runs on.
        AllowNoCuda(),
        CpuDevice(),
        NpuDevice(),
        DeviceAgnosticClipGrads(),
        OptimizerTensorTypeNames(),
        AllToAllSplitSizes(),
        GlooUnevenCollectives(),
        ElasticRestarts(),
        # Data and tokenizers.
        PrebuiltDatasetHelpers(),
        TokenizerJsonSupport(),
        EmptyDatasetSplit(),
        NoValidationSplit(),
        SupervisedFineTuning(),
        PreferenceTraining(),
        # Upstream fixes that hold on every backend.
        FirstIterationLog(),
        DisableJitFuser(),
        AtomicTracker(),
        CheckpointResultsQueue(),
        AsyncSaveHostSnapshot(),
        DistributedOptimizerResume(),
        SequenceParallelTorchNorm(),
        ResumeRngState(),
        TorchDcpCheckpoints(),
        FsdpDtensorCheckpoint(), LayerWiseOptimizerFp32(), MegatronFsdpGradScaling(), MtpLossContextParallel(),
        QkNormConsistencyCheck(),
        # Models, then the fused operators (their swaps win over the model's).
        MlaWithoutTransformerEngine(),
        GatedDeltaNetWithoutFla(),
        Layernorm1p(),
        RmsNormFusion(),
        SwigluFusion(),
        RopeFusion(),
        FlashAttentionFusion(),
        # Long sequences: their core-attention swaps come after the fused operators'.
        ContextParallel(),
        PackedSequences(),
        CrossEntropyFusion(),
        GroupedMatmulFusion(),
        MoePermuteFusion(),
        FusedTorchAdam(),
        MuonOptimizer(),
        # Checkpoints and Hugging Face.
        OnlineConversion(),
        ArchitectureFromConfig(),
        SafetensorsFormat(),
        SaveFailures(),
        LoadShapeCheck(),
        SafeTorchLoad(),
        # inference.py's and evaluation.py's flags.
        Generation(),
        Evaluation(),
        # LoRA after them: its load and save wrappers go around theirs.
        Lora(),
        # pretrain_mm.py.
        MultimodalArguments(),
        QwenVlHfSave(),
        VisionTowerNorms(),
        TorchFsdp2(),
        ShardedCheckpoint(),
        ActivationOffload(),
        OptimizerOffload(),
        # After every builder wrapper above (fused kernel, offload): the state follows their groups.
        OptimizerStateFromStart(),
        Recompute(),
        MemoryReport(),
        CollectiveTimeouts(),
        # Seeing a run: MFU, memory in TensorBoard, profiles, slow CPU precisions.
        Throughput(),
        TensorboardMemory(),
        Profiling(),
        CpuPrecision(),
        # Last: a feature's own check of a flag speaks before the table's general line.
        MegatronFlagPolicy(),
    ]

