"""One module per feature or fix; each module's docstring names what it changes upstream.

``all_features()`` lists them in the order their patches are registered.
"""
from __future__ import annotations


def all_features():
    from patches.all_to_all_split_sizes import AllToAllSplitSizes
    from patches.argument_checks import ArgumentChecks
    from patches.backend_defaults import BackendDefaults
    from patches.checkpoint_fit import CheckpointFit
    from patches.clip_grads import DeviceAgnosticClipGrads
    from patches.cpu_device import CpuDevice
    from patches.dataset_helpers import PrebuiltDatasetHelpers
    from patches.first_iteration_log import FirstIterationLog
    from patches.flash_attention import FlashAttention
    from patches.fused_cross_entropy import FusedCrossEntropy
    from patches.fused_rmsnorm import FusedRmsNorm
    from patches.fused_rope import FusedRope
    from patches.fused_swiglu import FusedSwiglu
    from patches.gloo_uneven_collectives import GlooUnevenCollectives
    from patches.moe_grouped_gemm import MoeGroupedGemm
    from patches.moe_permute import MoePermuteFusion
    from patches.distributed_optimizer_resume import DistributedOptimizerResume
    from patches.empty_dataset_split import EmptyDatasetSplitGuard
    from patches.hf_checkpoint import HfCheckpointFlags
    from patches.hf_tokenizer import TokenizerJsonTokenizer
    from patches.megatron_initialize import AllowNoCuda
    from patches.mm_arguments import MultimodalArguments
    from patches.memory_report import MemoryReport
    from patches.megatron_flag_policy import MegatronFlagPolicy
    from patches.mindspeed_llm_arguments import MindSpeedLlmArguments
    from patches.mla_yarn_arguments import MlaYarnArguments
    from patches.npu_device import NpuDevice
    from patches.safetensors_checkpoint import SafetensorsCheckpoint
    from patches.sequence_parallel_torch_norm import SequenceParallelTorchNorm
    from patches.single_process_launch import SingleProcessLaunch
    from patches.tensor_type_names import CudaTypeNamesInOptimizers
    from patches.vision_norms import VisionTowerNorms
    from patches.torch_fsdp2 import TorchFsdp2

    return [
        MindSpeedLlmArguments(),
        BackendDefaults(),
        SingleProcessLaunch(),
        ArgumentChecks(),
        AllowNoCuda(),
        PrebuiltDatasetHelpers(),
        TokenizerJsonTokenizer(),
        EmptyDatasetSplitGuard(),
        CpuDevice(),
        NpuDevice(),
        DeviceAgnosticClipGrads(),
        FirstIterationLog(),
        DistributedOptimizerResume(),
        CudaTypeNamesInOptimizers(),
        # Fused operators (issue 4): flags, layer-spec swaps and function patches.
        FusedRmsNorm(),
        FusedSwiglu(),
        FusedRope(),
        FlashAttention(),
        FusedCrossEntropy(),
        MoeGroupedGemm(),
        MoePermuteFusion(),
        AllToAllSplitSizes(),
        SequenceParallelTorchNorm(),
        MlaYarnArguments(),
        GlooUnevenCollectives(),
        HfCheckpointFlags(),
        SafetensorsCheckpoint(),
        CheckpointFit(),
        # Vision-language pretraining (pretrain_mm.py, issue 8).
        MultimodalArguments(),
        VisionTowerNorms(),
        # FSDP2 (issue 7): --use-torch-fsdp2 on every backend, --fsdp2-config-path.
        TorchFsdp2(),
        MemoryReport(),
        # Last: a feature's own check of a flag speaks before the table's general line.
        MegatronFlagPolicy(),
    ]
