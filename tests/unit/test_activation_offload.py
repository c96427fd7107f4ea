"""The activation offload mechanism on real modules, and the feature's one-line refusals.

Offloading copies a saved tensor to a host buffer and back: bytes are copied, never computed, so
gradients must be bit-identical to the run without offload (``torch.equal``, no tolerance).
"""
from __future__ import annotations

import argparse
import weakref

import pytest
import torch

from adaptor.features import ArgumentError
from adaptor.memory.activation_offload import ActivationOffloader, _Offloaded, attach, attach_pass_start
from patches.memory.activation_offload import ActivationOffload


class Block(torch.nn.Module):
    """Two offloadable submodules; ``inner`` remembers (weakly) the activation it saved."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 64)
        self.down = torch.nn.Linear(64, 16)
        self.saved = None

    def forward(self, x):
        h = self.up(x)
        a = torch.nn.functional.gelu(h)  # saves h
        self.saved = weakref.ref(h)
        return self.down(a)  # saves a


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def _grads(model, inputs):
    # several micro-batches in flight: all forwards, then the backwards in reverse
    losses = [model(x).square().sum() for x in inputs]
    for loss in reversed(losses):
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_offload_moves_saved_activations_and_changes_no_bit():
    inputs = [torch.randn(8, 16, requires_grad=False) for _ in range(3)]
    reference = _grads(_model(), inputs)

    model = _model()
    offl = ActivationOffloader("cpu", min_numel=8 * 64)
    for block in model:
        attach(block, "block", offl)
    attach_pass_start(model, offl)
    unpacked = []
    unpack = offl._unpack
    offl._unpack = lambda h: unpacked.append((h, unpack(h))) or unpacked[-1][1]

    losses = [model(x).square().sum() for x in inputs]
    # The device tensor really left: the graph holds only the handle, so nothing keeps h alive.
    assert all(block.saved() is None for block in model)
    assert offl.packed == 3 * 2 * 2  # h and a of each block, each micro-batch; not the 8x16 input nor weights
    assert offl.bytes["block"] == offl.packed * 8 * 64 * 4
    for loss in reversed(losses):
        loss.backward()
    assert offl.unpacked == offl.packed
    handles = [(h, t) for h, t in unpacked if isinstance(h, _Offloaded)]
    assert len(handles) == offl.packed
    for handle, tensor in handles:  # backward got a fresh copy, not the host buffer
        assert tensor.untyped_storage().data_ptr() != handle.host.untyped_storage().data_ptr()
    for got, want in zip((p.grad for p in model.parameters()), reference):
        assert torch.equal(got, want)


def test_small_tensors_parameters_and_recomputation_stay():
    model = _model()
    offl = ActivationOffloader("cpu", min_numel=10**9)
    attach(model, "all", offl)
    model(torch.randn(8, 16)).sum().backward()
    assert offl.packed == 0 and not offl.bytes

    offl = ActivationOffloader("cpu", min_numel=0)
    attach(model, "all", offl)  # the outer scope; each Block's own tensors are saved inside it
    x = torch.randn(8, 16, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=True)
    packed_in_forward = offl.packed
    out.sum().backward()
    assert packed_in_forward == 0  # the first forward runs without autograd
    assert offl.packed == 0  # the recomputation inside backward offloads nothing


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_experts", "sequential_mlp"])
def test_expert_fc1_and_activation_offload_in_megatron_moe_layers(grouped, model_parallel):
    """``--offload-modules moe_act expert_fc1`` on real MoE layers, the experts grouped (--moe-grouped-gemm)
    or sequential: each name offloads what its part saves, and the gradients do not change by a bit."""
    from helpers.blocks import B, FFN, H, S, build
    from patches.memory.activation_offload import attach_to_layer

    def grads(block):
        torch.manual_seed(0)
        x = torch.randn(S, B, H, requires_grad=True)
        block(x, attention_mask=None).square().sum().backward()
        return [x.grad] + [p.grad for p in block.parameters()]

    reference = grads(build(num_experts=2, grouped=grouped))
    block = build(num_experts=2, grouped=grouped)
    offl = ActivationOffloader("cpu", min_numel=1)
    for layer in block.layers:
        attach_to_layer(layer, ["moe_act", "expert_fc1"], offl)  # the scopes nest the same either order
    got = grads(block)
    assert not offl._open and offl.unpacked == offl.packed > 0
    rows = S * B  # top-1: every token's row goes through one expert, in each of the two layers
    assert offl.bytes["expert_fc1"] >= 2 * rows * H * 4  # fc1's input rows
    assert offl.bytes["moe_act"] >= 2 * rows * 2 * FFN * 4  # SwiGLU's input, both halves of fc1's output
    for name in ("attn_norm", "core_attn", "mlp_norm"):
        assert name not in offl.bytes
    for a, b in zip(got, reference):
        assert torch.equal(a, b)


def _args(**values):
    base = dict(swap_attention=False, swap_modules=None, min_offloaded_tensor_size=1024,
                offload_modules=["core_attn"], fine_grained_activation_offloading=False,
                activation_offload_takeover=True, moe_grouped_gemm=False)
    return argparse.Namespace(**{**base, **values})


@pytest.mark.parametrize("values, message", [
    ({"offload_modules": ["core_attn", "lm_head"]}, "--offload-modules: unknown module 'lm_head'"),
    ({"offload_modules": ["fused_group_mlp"]},
     "--offload-modules fused_group_mlp is not available without Transformer Engine"),
    ({"min_offloaded_tensor_size": -1}, "--min-offloaded-tensor-size must be >= 0 elements, not -1"),
    ({"offload_modules": []}, "--fine-grained-activation-offloading needs --offload-modules"),
    ({"swap_attention": True, "swap_modules": "self_attention,mlp"}, "--swap-modules: unknown module 'mlp'"),
])
def test_bad_input_is_one_line(values, message):
    with pytest.raises(ArgumentError, match=message) as error:
        ActivationOffload().validate(_args(**values), None)
    assert "\n" not in str(error.value)
