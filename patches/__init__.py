"""One module per feature or fix; each module's docstring names what it changes upstream.

``all_features()`` lists them in the order their patches are registered.
"""
from __future__ import annotations


def all_features():
    from patches.argument_checks import ArgumentChecks
    from patches.backend_defaults import BackendDefaults
    from patches.clip_grads import DeviceAgnosticClipGrads
    from patches.cpu_device import CpuDevice
    from patches.dataset_helpers import PrebuiltDatasetHelpers
    from patches.empty_dataset_split import EmptyDatasetSplitGuard
    from patches.hf_tokenizer import TokenizerJsonTokenizer
    from patches.megatron_initialize import AllowNoCuda
    from patches.npu_device import NpuDevice
    from patches.tensor_type_names import CudaTypeNamesInOptimizers

    return [
        BackendDefaults(),
        ArgumentChecks(),
        AllowNoCuda(),
        PrebuiltDatasetHelpers(),
        TokenizerJsonTokenizer(),
        EmptyDatasetSplitGuard(),
        CpuDevice(),
        NpuDevice(),
        DeviceAgnosticClipGrads(),
        CudaTypeNamesInOptimizers(),
    ]
