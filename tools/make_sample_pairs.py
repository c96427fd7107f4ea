"""Write the small preference set the repository carries (``examples/data/sample_pairs.jsonl``).

    python tools/make_sample_pairs.py --output examples/data/sample_pairs.jsonl

Alpaca-style pairs for DPO (``instruction``, ``input``, ``chosen``, ``rejected``; ``system`` and
``history`` kept where the instruction has them) made from the instruction set the repository carries
(tools/make_sample_instructions.py): the chosen response is the right answer, the rejected one another
record's answer, drawn by a seeded generator so that the file is the same bytes on every run.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

INSTRUCTIONS = Path(__file__).resolve().parents[1] / "examples" / "data" / "sample_instructions.jsonl"


def pairs(records: list, seed: int = 0) -> list:
    """One pair per record: its own output chosen, a different record's output rejected."""
    rng = random.Random(seed)
    out = []
    for i, record in enumerate(records):
        j = rng.randrange(len(records) - 1)
        j += j >= i
        wrong = records[j]["output"]
        if wrong == record["output"]:
            wrong = record["output"][::-1] + "?"
        pair = {k: v for k, v in record.items() if k != "output"}
        out.append({**pair, "chosen": record["output"], "rejected": wrong})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default=str(INSTRUCTIONS), help="alpaca instructions (default: the sample set)")
    parser.add_argument("--output", required=True, help="the JSON-lines file to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open(args.input, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(args.output, "w", encoding="utf-8") as f:
        for pair in pairs(records, args.seed):
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
