"""Write the small instruction set the repository carries (``examples/data/sample_instructions.jsonl``).

    python tools/make_sample_instructions.py --output examples/data/sample_instructions.jsonl

Alpaca-style records (``instruction``, ``input``, ``output``; some with ``system``, some with
``history`` for multi-turn conversations) from simple synthetic tasks whose answers follow a rule
a tiny model can pick up: sums and products, reversing or spelling words, capitals and opposites
looked up in the tables below, sorting, counting, the next number in a sequence. A seeded
generator makes the file deterministic: run again, it writes the same bytes. Every word and
sentence comes from this script.
"""
from __future__ import annotations

import argparse
import json
import random
import sys

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa", "Norway": "Oslo",
    "Portugal": "Lisbon", "Greece": "Athens", "Chile": "Santiago", "Poland": "Warsaw", "Austria": "Vienna",
    "Ireland": "Dublin", "Finland": "Helsinki", "Thailand": "Bangkok", "Cuba": "Havana", "Mexico": "Mexico City",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "early": "late", "light": "dark", "fast": "slow", "open": "closed",
    "full": "empty", "high": "low", "old": "new", "wet": "dry", "loud": "quiet", "hard": "soft",
    "first": "last", "up": "down", "near": "far", "thick": "thin",
}
WORDS = ("river", "lantern", "harbour", "orchard", "copper", "market", "bridge", "garden", "window",
         "pencil", "meadow", "candle", "basket", "planet", "silver", "forest", "rocket", "castle", "pepper",
         "island", "ladder", "mirror", "button", "violin")
SYSTEMS = ("You are a careful assistant. Answer in one short sentence.",
           "You are a patient tutor. Keep answers short and exact.",
           "Answer as precisely as you can.")


def arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if rng.random() < 0.5:
        return {"instruction": f"What is {a} + {b}?", "input": "", "output": f"{a} + {b} = {a + b}."}
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return {"instruction": "Multiply the two numbers.", "input": f"{a} and {b}", "output": f"{a} × {b} = {a * b}."}


def reverse_word(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    return {"instruction": "Reverse the letters of the word.", "input": word, "output": word[::-1]}


def spell_word(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    return {"instruction": f"Spell the word {word} with dashes between the letters.", "input": "",
            "output": "-".join(word)}


def capital(rng: random.Random) -> dict:
    country = rng.choice(sorted(CAPITALS))
    return {"instruction": f"What is the capital of {country}?", "input": "",
            "output": f"The capital of {country} is {CAPITALS[country]}."}


def opposite(rng: random.Random) -> dict:
    word = rng.choice(sorted(OPPOSITES))
    return {"instruction": "Give the opposite of the word.", "input": word, "output": OPPOSITES[word]}


def sort_numbers(rng: random.Random) -> dict:
    numbers = rng.sample(range(1, 100), rng.randint(3, 6))
    return {"instruction": "Sort these numbers from smallest to largest.", "input": ", ".join(map(str, numbers)),
            "output": ", ".join(map(str, sorted(numbers)))}


def count_letters(rng: random.Random) -> dict:
    word = rng.choice(WORDS)
    return {"instruction": f"How many letters are in the word {word}?", "input": "",
            "output": f"{word} has {len(word)} letters."}


def next_number(rng: random.Random) -> dict:
    start, step = rng.randint(1, 20), rng.randint(2, 9)
    seq = [start + step * i for i in range(4)]
    return {"instruction": "What number comes next in the sequence?", "input": " ".join(map(str, seq)),
            "output": str(start + step * 4)}


TASKS = (arithmetic, reverse_word, spell_word, capital, opposite, sort_numbers, count_letters, next_number)


def follow_up(rng: random.Random) -> dict:
    """A two- or three-turn conversation: the last question refers to the earlier answers (``history``)."""
    if rng.random() < 0.5:
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 5)
        history = [[f"What is {a} + {b}?", f"{a} + {b} = {a + b}."]]
        return {"instruction": f"Now multiply that by {c}.", "input": "", "output": f"{a + b} × {c} = {(a + b) * c}.",
                "history": history}
    first, second = rng.sample(sorted(CAPITALS), 2)
    history = [[f"What is the capital of {first}?", f"The capital of {first} is {CAPITALS[first]}."],
               [f"And of {second}?", f"The capital of {second} is {CAPITALS[second]}."]]
    return {"instruction": "Which of the two capitals comes first in the alphabet?", "input": "",
            "output": f"{min(CAPITALS[first], CAPITALS[second])} comes first.", "history": history}


def make_records(count: int, seed: int) -> list:
    rng = random.Random(seed)
    records = []
    for i in range(count):
        record = follow_up(rng) if i % 10 == 9 else rng.choice(TASKS)(rng)
        if i % 7 == 3:
            record = {"system": rng.choice(SYSTEMS), **record}
        records.append(record)
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=int, default=300, help="records (default 300)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    records = make_records(args.count, args.seed)
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    turns = sum(1 + len(r.get("history", [])) for r in records)
    print(f"wrote {len(records)} records ({turns} assistant turns) to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
