"""Fused operators, one file per operator.

Each file holds the operator's NPU (torch_npu), CUDA and CPU implementations
and picks one for the backend in use; the matching ``patches/`` module owns
the command-line flag and wires the operator into Megatron (a layer-spec swap
in ``adaptor/layer_specs.py`` or a patch of the upstream function).
"""
