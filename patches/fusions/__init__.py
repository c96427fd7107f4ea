"""Fused-operator flags: one module per flag, named like the ``adaptor/ops/`` module it selects.

Each feature declares the layer-spec swaps its flag causes (``Feature.module_swaps``) and
patches the upstream functions the flag reaches outside the spec."""
