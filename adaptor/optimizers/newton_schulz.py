"""Newton-Schulz orthogonalisation as Megatron's Muon runs it (emerging-optimizers' ``newton_schulz``).

The input (the momentum, float32) is turned to its wide orientation, divided by its Frobenius norm
(at least 1e-7), and iterated ``X <- a X + (b A + c A A) X`` with ``A = X X^T``, one coefficient triple
per step. The triples are the published ones of each ``--muon-coefficient-type``:

- ``simple``: one triple, repeated every step;
- ``quintic`` (Megatron's default): five triples, cycled; steps must be a multiple of 5;
- ``polar_express``: eight triples (Amsel et al. 2025), at least 8 steps, the last repeated after;
- ``aol``: four triples, cycled; steps must be a multiple of 4.

``--muon-fp32-matmul-prec`` is where the iteration runs: ``medium`` (the default) casts the normalised
float32 matrix to bf16, iterates in bf16 and returns float32; ``high`` iterates in float32 under torch's
'high' matmul precision (TF32 on GPUs); ``low`` is no torch precision, so Megatron's context leaves the
process's own (float32 by default) and so does this one.
"""
from __future__ import annotations

import contextlib

import torch

COEFFICIENTS = {
    "simple": ((3.4445, -4.7750, 2.0315),),
    "quintic": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
    "polar_express": ((8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                      (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                      (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)),
    "aol": ((4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)),
}
PRECISIONS = ("low", "medium", "high")


def schedule(kind: str, steps: int) -> list[tuple[float, float, float]]:
    """The coefficient triple of each of ``steps`` iterations, or ValueError saying why none."""
    if kind not in COEFFICIENTS:
        raise ValueError(f"--muon-coefficient-type is one of {', '.join(COEFFICIENTS)}, not {kind!r}")
    triples = list(COEFFICIENTS[kind])
    if kind == "simple":
        return triples * steps
    if kind == "polar_express":
        if steps < len(triples):
            raise ValueError(f"--muon-coefficient-type polar_express needs --muon-num-ns-steps >= 8, not {steps}")
        return triples + triples[-1:] * (steps - len(triples))
    if steps % len(triples):
        raise ValueError(f"--muon-coefficient-type {kind} cycles {len(triples)} coefficient triples: "
                         f"--muon-num-ns-steps must be a multiple of {len(triples)}, not {steps}")
    return triples * (steps // len(triples))


def orthogonalise(m: torch.Tensor, steps: int, kind: str = "quintic", precision: str = "medium") -> torch.Tensor:
    """``m``'s approximate orthogonal polar factor, float32, as Megatron's Muon computes it."""
    triples = schedule(kind, steps)
    x = m.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    if precision == "medium":
        x = x.to(torch.bfloat16)
    with _matmul_precision("high" if precision == "high" else None):
        for a, b, c in triples:
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.float()
    return x.T if tall else x


@contextlib.contextmanager
def _matmul_precision(precision: str | None):
    if precision is None:
        yield
        return
    held = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(held)
