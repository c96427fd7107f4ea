"""Fused operators, one file per operator.

Each file holds the operator's NPU (torch_npu), CUDA and CPU implementations
and picks one for the backend in use; the ``patches/fusions/`` module of the
same name owns the command-line flag and wires the operator into Megatron (a
``module_swaps`` row of the feature, or a patch of the upstream function).
``mla_attention.py`` is the exception: MLA's core attention, swapped in by ``patches/models/mla.py``.
"""
