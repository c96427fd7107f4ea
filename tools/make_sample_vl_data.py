"""Generate a tiny Qwen-VL conversation dataset (examples/qwen25vl/data/) in MindSpeed-MM's sharegpt format.

    python tools/make_sample_vl_data.py --output-dir examples/qwen25vl/data

Each image is drawn with Pillow: one shape (circle, square or triangle) of one colour, small or large,
on the left, in the middle or on the right of a light background, at one of several sizes (square,
wide and tall, 28 to 84 pixels a side), so that the processor makes grids of different shapes. The
answer says what is drawn, so it depends on the image. One record in four shows two images and asks
about both (two ``<image>`` markers, two paths). Writes, under ``--output-dir``:

* ``images/NNNN.png``;
* ``train.json``: a JSON list of ``{"messages": [{"role": "user", "content": "<image>..."},
  {"role": "assistant", "content": "..."}], "images": [...]}`` (paths relative to the directory);
* ``tokenizer/``: the repository's example tokenizer (examples/data/tokenizer) with Qwen-VL's vision
  tokens (``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``) added, so that
  data.json's ``model_name_or_path`` has a tokenizer that works offline.

A seeded generator makes the same files on every machine (same Pillow and zlib).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_TOKENIZER = ROOT / "examples" / "data" / "tokenizer"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 90, 200), "yellow": (230, 190, 20)}
SHAPES = ("circle", "square", "triangle")
EXTENTS = {"small": 0.35, "large": 0.7}                                    # of the shorter side
PLACES = {"on the left": 0.25, "in the middle": 0.5, "on the right": 0.75}  # centre, of the width
SIZES = ((28, 28), (56, 56), (84, 56), (56, 84), (70, 42))                  # (width, height)
QUESTIONS = ("What is in the picture?", "Describe the image.", "What shape do you see?")


def add_vision_tokens(source: Path, target: Path) -> Path:
    """A copy of the tokenizer directory ``source`` at ``target`` with the vision tokens as special tokens."""
    from tokenizers import AddedToken, Tokenizer

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tokenizer.save(str(target / "tokenizer.json"))
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)  # the text model's template; the data's template is data.json's
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


def draw(width: int, height: int, colour: str, shape: str, extent: str, place: str, rng: random.Random):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (238, 238, 232))
    pen = ImageDraw.Draw(image)
    side = EXTENTS[extent] * min(width, height) * rng.uniform(0.9, 1.1)
    side = min(side, 0.45 * width)  # keeps left and right apart on narrow images
    cx, cy = PLACES[place] * width + rng.uniform(-1.0, 1.0), height / 2 + rng.uniform(-1.0, 1.0)
    box = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
    if shape == "circle":
        pen.ellipse(box, fill=COLOURS[colour])
    elif shape == "square":
        pen.rectangle(box, fill=COLOURS[colour])
    else:
        pen.polygon([(cx, box[1]), (box[0], box[3]), (box[2], box[3])], fill=COLOURS[colour])
    return image


def picture(rng: random.Random):
    """(image, what it shows: "a large red circle on the left")."""
    colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    extent, place = rng.choice(sorted(EXTENTS)), rng.choice(sorted(PLACES))
    width, height = rng.choice(SIZES)
    return draw(width, height, colour, shape, extent, place, rng), f"a {extent} {colour} {shape} {place}"


def records(count: int, seed: int):
    """(images [(name, PIL image)], record) per sample."""
    rng = random.Random(seed)
    number = 0
    for index in range(count):
        pair = index % 4 == 3
        drawn = [picture(rng) for _ in range(2 if pair else 1)]
        names = [f"images/{number + i:04d}.png" for i in range(len(drawn))]
        number += len(drawn)
        if pair:
            question = "<image><image>What do the two pictures show?"
            answer = f"The first shows {drawn[0][1]}; the second shows {drawn[1][1]}."
        else:
            question = "<image>" + rng.choice(QUESTIONS)
            answer = drawn[0][1][0].upper() + drawn[0][1][1:] + "."
        record = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
                  "images": names}
        yield [(name, image) for name, (image, _) in zip(names, drawn)], record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--count", type=int, default=64, help="number of records")
    parser.add_argument("--seed", type=int, default=20261127)
    args = parser.parse_args(argv)
    if args.count <= 0:
        print("make_sample_vl_data.py: error: --count must be positive", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    data = []
    for images, record in records(args.count, args.seed):
        for name, image in images:
            image.save(out / name, format="PNG", optimize=True)
        data.append(record)
    (out / "train.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    add_vision_tokens(BASE_TOKENIZER, out / "tokenizer")
    print(f"wrote {args.count} records, {sum(len(r['images']) for r in data)} images, {out / 'train.json'} "
          f"and {out / 'tokenizer'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
