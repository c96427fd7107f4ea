"""The accelerator Megatron runs on: CUDA calls redirected to CPU or NPU, and the type-name,
initialisation and collective fixes that let Megatron's CUDA-only code accept those devices."""
