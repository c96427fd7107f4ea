"""Fixes to megatron-core 0.19.2 behaviour that is wrong or CUDA-only whatever the backend."""
