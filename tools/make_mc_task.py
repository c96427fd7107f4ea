"""Write a small local multiple-choice task for evaluation.py: an lm-eval task YAML and its JSONL data.

    python tools/make_mc_task.py --output-dir DIR [--name sample_mc] [--count 16]
    evaluation.py ... --include-path DIR --task sample_mc

Each question asks for a country's capital, a word's opposite, or a small sum, with four choices (the
answer and three others from the same table, in a seeded order). The YAML names its data file by
absolute path, so the task runs from any directory and needs no download; lm-eval scores each choice's
log-likelihood after the question (``acc``, ``acc_norm``). Run again, it writes the same bytes.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Egypt": "Cairo",
            "Peru": "Lima", "Canada": "Ottawa", "Norway": "Oslo", "Greece": "Athens", "Cuba": "Havana"}
OPPOSITES = {"hot": "cold", "big": "small", "early": "late", "light": "dark", "fast": "slow", "full": "empty",
             "high": "low", "wet": "dry", "loud": "quiet", "near": "far"}


def questions(count: int, seed: int = 0) -> list[dict]:
    """``count`` records ``{"question", "choices", "answer"}`` (``answer`` the right choice's index)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = i % 3
        if kind == 0:
            country = rng.choice(sorted(CAPITALS))
            question, right, pool = f"The capital of {country} is", CAPITALS[country], sorted(CAPITALS.values())
        elif kind == 1:
            word = rng.choice(sorted(OPPOSITES))
            question, right, pool = f"The opposite of {word} is", OPPOSITES[word], sorted(OPPOSITES.values())
        else:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            question, right = f"{a} plus {b} is", str(a + b)
            pool = [str(a + b + d) for d in (-3, -2, -1, 1, 2, 3)]
        choices = [right] + rng.sample([c for c in pool if c != right], 3)
        rng.shuffle(choices)
        out.append({"question": question, "choices": choices, "answer": choices.index(right)})
    return out


def write_task(directory: Path, name: str = "sample_mc", count: int = 16) -> Path:
    """``directory/<name>.jsonl`` and ``directory/<name>.yaml`` (JSON, which is YAML); returns the YAML."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions(count)), encoding="utf-8")
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    yaml = directory / f"{name}.yaml"
    yaml.write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return yaml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="where the YAML and JSONL files go")
    parser.add_argument("--name", default="sample_mc", help="the task's name (default sample_mc)")
    parser.add_argument("--count", type=int, default=16, help="questions (default 16)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, not {args.count}")
    print(write_task(Path(args.output_dir), args.name, args.count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
