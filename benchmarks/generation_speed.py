"""Greedy decoding speed of inference.py against transformers' generate, same weights, same machine, same run.

    python benchmarks/generation_speed.py [--only tiny|0.6b ...] [--new-tokens 32] [--out results.json]

For each model a random Qwen3 is written as a Hugging Face directory (the sample tokenizer's vocabulary,
fp32); inference.py reads it with --hf-load-dir and generates greedily for one prompt, with and without
--use-kv-cache, as one process (``python inference.py``); transformers generates from the same directory
with ``use_cache`` on and off. Each side reports generated tokens over the generation time only (model
loading excluded; inference.py prints it). Both run with the same thread count (OMP_NUM_THREADS, default 2).

Models: "tiny" is the test suite's tiny Qwen3 (4 layers, hidden 64); "0.6b" has Qwen3-0.6B's layer shapes
(28 layers, hidden 1024, 16 heads, 8 KV heads, head dim 128, FFN 3072, tied embeddings) with the sample
tokenizer's vocabulary instead of 151936.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.megatron_runs import SAMPLE_TOKENIZER, free_port  # noqa: E402

PROMPT = "The capital of the old kingdom was a small town near the"
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32),
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128),
}
TIMING = re.compile(r"inference.py: generated (\d+) tokens for \d+ prompts in ([0-9.]+) s")


def write_model(path: Path, shape: dict, vocab: int) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, max_position_embeddings=256, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         tie_word_embeddings=True, attention_bias=False, hidden_act="silu",
                         bos_token_id=0, eos_token_id=1, **shape)
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(path)
    return path


def ours(hf_dir: Path, new_tokens: int, kv_cache: bool, threads: str) -> tuple[int, float]:
    sys.path.insert(0, str(ROOT))
    import adaptor  # noqa: F401
    from adaptor.convert.config_check import model_flags

    flags = model_flags("qwen3", json.loads((hf_dir / "config.json").read_text()))
    cmd = [sys.executable, str(ROOT / "inference.py"), *flags, "--seq-length", "256", "--tokenizer-type",
           "HuggingFaceTokenizer", "--tokenizer-model", str(SAMPLE_TOKENIZER), "--hf-load-dir", str(hf_dir),
           "--prompt", PROMPT, "--max-new-tokens", str(new_tokens), "--disable-jit-fuser",
           *(["--use-kv-cache"] if kv_cache else [])]
    env = dict(os.environ, OMP_NUM_THREADS=threads, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    found = TIMING.search(proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"inference.py failed: {(proc.stderr or proc.stdout)[-2000:]}")
    return int(found.group(1)), float(found.group(2))


def theirs(hf_dir: Path, new_tokens: int, kv_cache: bool) -> tuple[int, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, do_sample=False, max_new_tokens=new_tokens, use_cache=kv_cache,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        elapsed = time.perf_counter() - start
    return out.shape[1] - ids.shape[1], elapsed


def cpu_description() -> str:
    model, flags = platform.processor() or "unknown", []
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = [f for f in ("avx512_bf16", "amx_bf16") if f" {f}" in info]
    except (OSError, StopIteration):
        pass
    return f"{model} ({os.cpu_count()} cores; bf16 flags: {', '.join(flags) or 'none'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES, reverse=True))
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS", "2")
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(int(threads))
    vocab = len(AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="generation-speed-") as tmp:
        for name in args.only:
            hf_dir = write_model(Path(tmp) / name, SHAPES[name], vocab)
            for kv in (True, False):
                for who, run in (("inference.py", lambda: ours(hf_dir, args.new_tokens, kv, threads)),
                                 ("transformers", lambda: theirs(hf_dir, args.new_tokens, kv))):
                    tokens, seconds = run()
                    rows.append(dict(model=name, engine=who, kv_cache=kv, tokens=tokens, seconds=round(seconds, 3),
                                     tokens_per_s=round(tokens / seconds, 1)))
                    print(json.dumps(rows[-1]), flush=True)
    result = dict(date=str(date.today()), cpu=cpu_description(), torch=torch.__version__, threads=threads,
                  prompt_tokens=len(AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))(PROMPT).input_ids),
                  new_tokens=args.new_tokens, rows=rows)
    print("| model | engine | KV cache | tokens | s | tokens/s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['engine']} | {'yes' if r['kv_cache'] else 'no'} | {r['tokens']} | {r['seconds']} "
              f"| {r['tokens_per_s']} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
