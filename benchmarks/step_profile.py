"""Where one training step's time goes: pretrain_gpt.py under torch.profiler, grouped by what the ops do.

    python benchmarks/step_profile.py [--model 58m|tiny] [--bf16] [--unfused] [--steps 2] [--top 15]

Runs ``pretrain_gpt.py`` in one process (torchrun, gloo, mock data) and profiles ``train_step``
calls 4 and 5 (after warm-up) with ``torch.profiler``. Each op's own (self) CPU time is charged to
the first matching group, looking first at the op's ancestors (the optimizer step, the cross
entropy, gradient clipping) and then at the op itself (matmuls, attention kernels, dtype copies,
other elementwise work). Prints the groups' shares and the ops that take the most time.

Models: ``58m`` is the Qwen3 shape of ``benchmarks/step_vs_transformers.py`` (hidden 512, 8 layers,
8/4 heads of 64, ffn 1536, vocabulary 32000 untied, sequence 512, micro-batch 4); ``tiny`` is the
example's (hidden 128, 4 layers, sequence 128, micro-batch 4, vocabulary 4096).
"""
from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = "STEP_PROFILE_CHILD"
FUSED = ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--use-flash-attn",
         "--cross-entropy-loss-fusion"]
MODELS = {  # layers hidden ffn heads kv head-dim vocabulary sequence micro-batch
    "58m": (8, 512, 1536, 8, 4, 64, 32000, 512, 4),
    "tiny": (4, 128, 384, 4, 2, 32, 4096, 128, 4),
}
# (group, test on an ancestor's name) — the first ancestor that matches wins
ANCESTOR_GROUPS = [
    ("optimizer step", lambda n: n.startswith("Optimizer.step")),
    ("cross entropy", lambda n: "CrossEntropy" in n),
    ("gradient clipping and norms", lambda n: "clip_grad" in n or "l2norm" in n),
]
OP_GROUPS = [
    ("matmul", lambda n: n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm")),
    ("attention kernels", lambda n: "scaled_dot_product" in n or "softmax" in n),
    ("dtype copies", lambda n: n in ("aten::copy_", "aten::_to_copy", "aten::to")),
    ("zeroing and fills", lambda n: n in ("aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like")),
    ("elementwise and reductions", lambda n: n.startswith("aten::")),
]


def _args(model: str, bf16: bool, fused: bool) -> list[str]:
    layers, hidden, ffn, heads, kv, head_dim, vocab, seq, mbs = MODELS[model]
    return [
        "--num-layers", str(layers), "--hidden-size", str(hidden), "--ffn-hidden-size", str(ffn),
        "--num-attention-heads", str(heads), "--group-query-attention", "--num-query-groups", str(kv),
        "--kv-channels", str(head_dim), "--qk-layernorm", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope", "--rotary-base", "1000000",
        "--untie-embeddings-and-output-weights", "--seq-length", str(seq), "--max-position-embeddings", str(seq),
        "--attention-dropout", "0", "--hidden-dropout", "0", "--micro-batch-size", str(mbs),
        "--global-batch-size", str(mbs), "--train-iters", "5", "--lr", "1e-4", "--clip-grad", "1.0",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab - 1),
        "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000000",
        *(["--bf16"] if bf16 else []), *(FUSED if fused else []),
    ]


def _group(event) -> str:
    parent = event.cpu_parent
    while parent is not None:
        for group, test in ANCESTOR_GROUPS:
            if test(parent.name):
                return group
        parent = parent.cpu_parent
    for group, test in OP_GROUPS:
        if test(event.name):
            return group
    return "python-level and autograd bookkeeping"


def _report(prof, top: int) -> None:
    totals, per_op = defaultdict(float), defaultdict(float)
    for event in prof.events():
        totals[_group(event)] += event.self_cpu_time_total
        per_op[event.name] += event.self_cpu_time_total
    whole = sum(totals.values()) or 1.0
    steps = 2
    print(f"\nself CPU time per step: {whole / steps / 1e3:.0f} ms")
    print("| group | ms / step | share |\n|---|---|---|")
    for group, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {group} | {us / steps / 1e3:.1f} | {us / whole:.1%} |")
    print("\n| op | ms / step | share |\n|---|---|---|")
    for name, us in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| `{name[:70]}` | {us / steps / 1e3:.1f} | {us / whole:.1%} |")


def child(top: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    import adaptor  # noqa: F401  (patches Megatron before its training module is used)
    import megatron.training.training as training

    step_fn, state = training.train_step, {"calls": 0, "prof": None}

    def profiled_train_step(*args, **kwargs):
        state["calls"] += 1
        if state["calls"] == 4:
            state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            state["prof"].__enter__()
        out = step_fn(*args, **kwargs)
        if state["calls"] == 5:
            state["prof"].__exit__(None, None, None)
            _report(state["prof"], top)
        return out

    training.train_step = profiled_train_step
    os.chdir(ROOT)
    runpy.run_path(str(ROOT / "pretrain_gpt.py"), run_name="__main__")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="58m", choices=sorted(MODELS))
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--unfused", action="store_true", help="without the fused-operator flags")
    ap.add_argument("--top", type=int, default=15)
    if os.environ.get(CHILD):  # every argument is pretrain_gpt.py's
        sys.argv = [str(ROOT / "pretrain_gpt.py"), *sys.argv[1:]]
        return child(int(os.environ[CHILD]))
    a, rest = ap.parse_known_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.megatron_runs import free_port

    env = dict(os.environ, **{CHILD: str(a.top)}, ADAPTOR_BACKEND=os.environ.get("ADAPTOR_BACKEND", "cpu"),
               ADAPTOR_QUIET="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(free_port()),
           __file__, *_args(a.model, a.bf16, not a.unfused), *rest]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    start = text.find("\nself CPU time per step")
    if out.returncode != 0 or start < 0:
        raise SystemExit(f"profiled run failed:\n{text[-3000:]}")
    print(f"# model {a.model}, {'bf16' if a.bf16 else 'fp32'}, {'unfused' if a.unfused else 'fused flags'}")
    report = [line for line in text[start:].splitlines() if line.startswith(("|", "self CPU")) or not line.strip()]
    print("\n".join(report).strip())


if __name__ == "__main__":
    main()
