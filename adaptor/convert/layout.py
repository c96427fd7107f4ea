"""Parallel layouts and how one full tensor becomes each rank's part (and back).

Each rule turns the HF tensor(s) of one parameter into the part Megatron rank `rank`
of `size` holds (``shard``), and the parts of all ranks back into the HF tensor(s)
(``merge``); applied to meta tensors they give shapes without reading data.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """Tensor, pipeline and expert parallel sizes; expert tensor parallel is tp (Megatron's default) or 1;
    ``vpp`` virtual pipeline stages (model chunks) per pipeline rank.

    Megatron's interleaved schedule splits the L layers into ``pp * vpp`` runs of consecutive layers:
    chunk v of pipeline rank p holds run ``v * pp + p`` (``get_transformer_layer_offset``), the embedding
    lives in chunk 0 of rank 0, the final norm, output layer and MTP in the last chunk of the last rank.
    The mappings place parameters on these runs (:attr:`stages`); :meth:`stage` numbers a chunk's run.
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int = 1

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def stages(self) -> int:
        """Pipeline stages counting each virtual stage: runs of consecutive layers."""
        return self.pp * self.vpp

    def stage(self, pp_rank: int, vp_stage: int = 0) -> int:
        """The run of layers chunk ``vp_stage`` of pipeline rank ``pp_rank`` holds."""
        return vp_stage * self.pp + pp_rank

    def flat(self) -> Layout:
        """The same placement with each virtual stage as a pipeline rank of its own (one chunk per rank)."""
        return Layout(self.tp, self.stages, self.ep, self.etp)

    @classmethod
    def of(cls, args) -> Layout:
        """The layout of a run's (or a saved checkpoint's) arguments."""
        tp, etp = args.tensor_model_parallel_size, getattr(args, "expert_tensor_parallel_size", None)
        return cls(tp, args.pipeline_model_parallel_size, getattr(args, "expert_model_parallel_size", 1),
                   None if etp in (None, tp) else etp, getattr(args, "virtual_pipeline_model_parallel_size", None) or 1)

    def rank_keys(self):
        """(tp_rank, pp_rank, ep_rank) of every checkpoint file."""
        return [(t, p, e) for p in range(self.pp) for e in range(self.ep) for t in range(self.tp)]


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """As megatron.training's _vocab_size_with_padding: a multiple of divisible_by * tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


class Replicated:
    """Every rank holds the whole tensor (norms, router, MLA down projections)."""

    def shard(self, hf, rank, size):
        return hf[0]

    def merge(self, parts):
        return [parts[0]]


class Split:
    """Column parallel (dim 0) or row parallel (dim 1): contiguous equal chunks."""

    def __init__(self, dim: int):
        self.dim = dim

    def shard(self, hf, rank, size):
        return hf[0].chunk(size, dim=self.dim)[rank]

    def merge(self, parts):
        return [torch.cat(parts, dim=self.dim) if len(parts) > 1 else parts[0]]


class VocabSplit:
    """Embedding / output layer rows: padded with zero rows to the padded vocabulary, then split."""

    def __init__(self, vocab_size: int, padded_size: int):
        self.vocab_size, self.padded_size = vocab_size, padded_size

    def shard(self, hf, rank, size):
        rows = self.padded_size // size
        begin, end = rank * rows, (rank + 1) * rows
        weight = hf[0]
        if weight.shape[0] != self.vocab_size:
            raise RuntimeError(f"{weight.shape[0]} rows, config.json says vocab_size={self.vocab_size}")
        if end <= self.vocab_size:
            return weight[begin:end]
        real = weight[begin:self.vocab_size] if begin < self.vocab_size else weight[:0]
        pad = torch.zeros((end - max(begin, self.vocab_size),) + tuple(weight.shape[1:]),
                          dtype=weight.dtype, device=weight.device)
        return torch.cat([real, pad])

    def merge(self, parts):
        full = torch.cat(parts) if len(parts) > 1 else parts[0]
        return [full[: self.vocab_size]]


class GateUp:
    """linear_fc1 of a SwiGLU MLP: rank r holds [gate rows of r; up rows of r]."""

    def shard(self, hf, rank, size):
        gate, up = hf
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])

    def merge(self, parts):
        halves = [part.chunk(2) for part in parts]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]


class GroupedQKV:
    """linear_qkv: per query group g, [q rows of the group's heads; k_g; v_g]; TP splits whole groups."""

    def __init__(self, heads: int, groups: int, head_dim: int):
        self.heads, self.groups, self.head_dim = heads, groups, head_dim

    def shard(self, hf, rank, size):
        q, k, v = hf
        per_group = self.heads // self.groups
        hidden = q.shape[1:]
        groups = self.groups // size
        g0 = rank * groups
        q = q.reshape(self.groups, per_group * self.head_dim, *hidden)[g0:g0 + groups]
        k = k.reshape(self.groups, self.head_dim, *hidden)[g0:g0 + groups]
        v = v.reshape(self.groups, self.head_dim, *hidden)[g0:g0 + groups]
        return torch.cat([q, k, v], dim=1).reshape(-1, *hidden)

    def merge(self, parts):
        per_group = self.heads // self.groups
        full = torch.cat(parts) if len(parts) > 1 else parts[0]
        hidden = full.shape[1:]
        grouped = full.reshape(self.groups, (per_group + 2) * self.head_dim, *hidden)
        q, k, v = grouped.split([per_group * self.head_dim, self.head_dim, self.head_dim], dim=1)
        return [q.reshape(-1, *hidden), k.reshape(-1, *hidden), v.reshape(-1, *hidden)]
