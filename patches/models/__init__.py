"""Model architectures megatron-core's local spec lacks a piece of: multi-latent attention, Gated
DeltaNet layers, zero-centred layer norms."""
