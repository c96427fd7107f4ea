"""Megatron's ``--test-mode`` check of the q/k norms, for norms without a bias (RMSNorm).

Upstream: with ``--test-mode``, ``megatron.core.transformer.attention.SelfAttention.run_realtime_tests``
gathers the q- and k-norm weights *and biases* over the data- and tensor-parallel groups on every
forward step and asserts they are equal on every rank (a guard against silent memory or network
corruption). It reads ``.bias.data`` unconditionally, so with ``--normalization RMSNorm`` (no bias,
the norm of Qwen3 and Llama) every step ended in ``AttributeError: 'NoneType' object has no
attribute 'data'``, on every backend. We run the same check over the parameters the norms have.

Remove when: ``SelfAttention.run_realtime_tests`` compares only the norm parameters that exist, so an
RMSNorm without bias passes; megatron-core 0.19.2 and Megatron-LM main
(d98e8a64, 2026-08-22) read ``q_layernorm.bias.data``. No upstream issue or PR found.
"""
from __future__ import annotations

from adaptor.features import Feature

OWNER = __name__


def check_qk_norms_agree(attention) -> None:
    """Assert that every q/k-norm parameter is equal on all data- and tensor-parallel ranks."""
    import torch
    from megatron.core import parallel_state as ps

    if not attention.config.qk_layernorm:
        return
    names, tensors = [], []
    for norm_name in ("q_layernorm", "k_layernorm"):
        norm = getattr(attention, norm_name)
        for kind in ("weight", "bias"):
            param = getattr(norm, kind, None)
            if param is not None:
                names.append(f"{norm_name}.{kind}")
                tensors.append(param.data.reshape(-1))
    mine = torch.cat(tensors)
    for parallelism, group in (("data-parallel", ps.get_data_parallel_group()),
                               ("tensor-parallel", ps.get_tensor_model_parallel_group())):
        gathered = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(gathered, mine, group=group)
        for other_rank, theirs in enumerate(gathered):
            if not torch.equal(theirs, mine):
                offsets = [0]
                for t in tensors:
                    offsets.append(offsets[-1] + t.numel())
                differ = [n for n, a, b in zip(names, offsets, offsets[1:]) if not torch.equal(theirs[a:b], mine[a:b])]
                raise AssertionError(
                    f"--test-mode: {', '.join(differ)} differ between {parallelism} ranks "
                    f"{other_rank} and {torch.distributed.get_rank(group)}")


class QkNormConsistencyCheck(Feature):
    name = "qk_norm_consistency_check"

    def register_patches(self, pm, ctx) -> None:
        pm.register_replacement(
            "megatron.core.transformer.attention.SelfAttention.run_realtime_tests",
            check_qk_norms_agree, OWNER)
