"""Generate the tiny image-caption dataset the repository carries (examples/vlm/data/).

    python tools/make_sample_images.py --output-dir examples/vlm/data

Each image is a small picture drawn with Pillow: one shape (circle, square or triangle) of one
of five colours, small or large, on the left, in the middle or on the right, on a light
background, with a little seeded jitter in place and size. Its caption says exactly that
("a large red circle on the left"), so the caption depends on the image and a vision-language
model can learn more than the captions' word statistics. Three records in four are captions,
one in four a short conversation asking about the picture (both formats pretrain_mm.py reads).

A seeded generator makes the same images and captions on every machine (the PNG bytes are the
same for the same Pillow and zlib). Writes ``images/NNNN.png``, ``captions.jsonl`` (one record
per line, image paths relative to the directory) under ``--output-dir``.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 90, 200), "yellow": (230, 190, 20),
           "purple": (148, 70, 180)}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.30, "large": 0.55}          # of the image side
PLACES = {"on the left": 0.27, "in the middle": 0.5, "on the right": 0.73}  # centre, of the image side
QUESTIONS = ("What is in the picture?", "Describe the image.", "What shape do you see?",
             "What does the picture show?")


def draw(size: int, colour: str, shape: str, extent: str, place: str, rng: random.Random):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), (238, 238, 232))
    pen = ImageDraw.Draw(image)
    side = SIZES[extent] * size * rng.uniform(0.9, 1.1)
    cx = PLACES[place] * size + rng.uniform(-1.0, 1.0)
    cy = size / 2 + rng.uniform(-2.0, 2.0)
    box = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(cx, box[1]), (box[0], box[3]), (box[2], box[3])], fill=fill)
    return image


def records(count: int, size: int, seed: int):
    rng = random.Random(seed)
    for index in range(count):
        colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
        extent, place = rng.choice(sorted(SIZES)), rng.choice(sorted(PLACES))
        image = draw(size, colour, shape, extent, place, rng)
        caption = f"a {extent} {colour} {shape} {place}"
        name = f"images/{index:04d}.png"
        if index % 4 == 3:
            record = {"image": name, "conversations": [
                {"from": "human", "value": "<image>\n" + rng.choice(QUESTIONS)},
                {"from": "gpt", "value": caption[0].upper() + caption[1:] + "."}]}
        else:
            record = {"image": name, "caption": caption}
        yield name, image, record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--count", type=int, default=192, help="number of images")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args(argv)
    if args.count <= 0 or args.size < 8:
        print("make_sample_images.py: error: --count must be positive and --size at least 8", file=sys.stderr)
        return 2
    out = Path(args.output_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for name, image, record in records(args.count, args.size, args.seed):
        image.save(out / name, format="PNG", optimize=True)
        lines.append(json.dumps(record))
    (out / "captions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    total = sum(p.stat().st_size for p in (out / "images").glob("*.png"))
    print(f"wrote {args.count} images ({total} bytes) and {out / 'captions.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
