"""Image-text records for pretrain_mm.py: JSONL in, LLaVAModel's batch out.

One record per line, an image (relative to ``data_folder``) and either a caption or a
LLaVA-style conversation::

    {"image": "shapes/0001.png", "caption": "a red circle above a small blue square"}
    {"image": "shapes/0002.png", "conversations": [{"from": "human", "value": "<image>\\nWhat is shown?"},
                                                  {"from": "gpt", "value": "a green triangle"}]}

``<image>`` (one per record; added at the start if missing) becomes megatron-core's image token index
(-200), which LLaVAModel replaces with the image's embeddings. Only the caption or answers and their
end-of-document token carry loss. A sample has ``seq_length - image_seq_len + 1`` text positions (cut
or padded), so the language model sees exactly ``--seq-length``. Images: Pillow, RGB, resized to
``image_size`` square (no crop), normalized with data.json's mean and std.

Records are checked when the dataset is built (JSON, keys, non-empty text, image readable by Pillow's
``verify``); a bad one is an :class:`MMDataError` with file and line, or with
``--mm-skip-bad-records`` skipped and counted (an image failing later is replaced by the next record).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

import torch

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_INDEX = -200  # megatron.core.models.multimodal.llava_model.DEFAULT_IMAGE_TOKEN_INDEX
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


class MMDataError(ValueError):
    """A bad record, as one line ``file:line: what``."""

    @property
    def line(self) -> str:
        """The message; from a DataLoader worker (re-raised as 'Caught MMDataError ... Traceback ...'),
        the original message is the traceback's last line."""
        text = str(self)
        if text.startswith("Caught "):
            last = text.strip().splitlines()[-1]
            return last.split(": ", 1)[1] if ": " in last else last
        return text


@dataclass
class Record:
    line: int
    image: str                        # absolute path
    turns: list[tuple[str, str]]      # (role "user" | "assistant", text)


def _check_image(path: str) -> tuple[str, str] | None:
    """None if Pillow can read the image's header (and PNG checksums), else (reason, detail)."""
    from PIL import Image

    if not os.path.isfile(path):
        return "missing image", "no such file"
    try:
        with Image.open(path) as img:
            img.verify()
    except Exception as exc:  # noqa: BLE001  (Pillow raises many types for bad files)
        return "corrupt image", f"cannot decode ({type(exc).__name__}: {' '.join(str(exc).split())})"
    return None


def _turns(obj: dict) -> tuple[list[tuple[str, str]] | None, tuple[str, str] | None]:
    """(turns, None) or (None, (reason, detail))."""
    if "caption" in obj:
        caption = obj["caption"]
        if not isinstance(caption, str):
            return None, ("bad caption", f'"caption" is not a string: {json.dumps(caption)[:40]}')
        if not caption.strip():
            return None, ("empty caption", "empty caption")
        if IMAGE_TOKEN in caption:
            return None, ("bad caption", f"the caption contains {IMAGE_TOKEN}")
        return [("user", IMAGE_TOKEN), ("assistant", caption)], None
    if "conversations" in obj:
        conv = obj["conversations"]
        if not isinstance(conv, list) or not conv:
            return None, ("bad conversations", '"conversations" is not a non-empty list')
        turns = []
        for i, turn in enumerate(conv):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                return None, ("missing key", f'conversations[{i}]: missing key "from" or "value"')
            role = ROLES.get(turn["from"])
            if role is None or not isinstance(turn["value"], str):
                return None, ("bad conversations", f'conversations[{i}]: "from" must be human or gpt and '
                                                    f'"value" a string')
            turns.append((role, turn["value"]))
        if not any(role == "assistant" and text.strip() for role, text in turns):
            return None, ("empty caption", "no non-empty gpt answer in the conversation")
        markers = sum(text.count(IMAGE_TOKEN) for _, text in turns)
        if markers > 1:
            return None, ("bad conversations", f"{markers} {IMAGE_TOKEN} markers (one image per record)")
        if any(role == "assistant" and IMAGE_TOKEN in text for role, text in turns):
            return None, ("bad conversations", f"{IMAGE_TOKEN} in a gpt turn")
        if markers == 0:
            first = next(i for i, (role, _) in enumerate(turns) if role == "user") if any(
                role == "user" for role, _ in turns) else None
            if first is None:
                turns.insert(0, ("user", IMAGE_TOKEN))
            else:
                turns[first] = ("user", IMAGE_TOKEN + "\n" + turns[first][1])
        return turns, None
    return None, ("missing key", 'missing key "caption" or "conversations"')


def read_records(data_path: str, data_folder: str, skip_bad: bool) -> tuple[list[Record], Counter]:
    """Every usable record of the JSONL file, and the count of skipped ones per reason."""
    records, skipped = [], Counter()
    first_bad = None

    def bad(line_no: int, reason: str, detail: str):
        nonlocal first_bad
        message = f"{data_path}:{line_no}: {detail}"
        if not skip_bad:
            raise MMDataError(message)
        skipped[reason] += 1
        first_bad = first_bad or message

    with open(data_path, "rb") as handle:
        for line_no, raw in enumerate(handle, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                bad(line_no, "invalid line", "not UTF-8")
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                bad(line_no, "invalid line", f"not valid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                bad(line_no, "invalid line", "not a JSON object")
                continue
            if not isinstance(obj.get("image"), str) or not obj["image"]:
                bad(line_no, "missing key", 'missing key "image"' if "image" not in obj else '"image" is not a path')
                continue
            turns, problem = _turns(obj)
            if problem:
                bad(line_no, *problem)
                continue
            image = os.path.join(data_folder, obj["image"])
            problem = _check_image(image)
            if problem:
                bad(line_no, problem[0], f"image {obj['image']}: {problem[1]}")
                continue
            records.append(Record(line_no, image, turns))
    if not records:
        raise MMDataError(f"{data_path}: no usable records" + (f" (first bad: {first_bad})" if first_bad else ""))
    return records, skipped


def load_image(path: str, size: int, mean, std, interpolation: str) -> torch.Tensor:
    """[3, size, size] float32: RGB, resized, scaled to [0, 1], normalized per channel."""
    from PIL import Image

    resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
                "nearest": Image.Resampling.NEAREST}[interpolation]
    with Image.open(path) as img:
        rgb = img.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), resample=resample)
    pixels = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8).view(size, size, 3)
    x = pixels.permute(2, 0, 1).float().div_(255.0)
    return (x - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def encode_turns(turns, tokenize, eod: int) -> tuple[list[int], list[int]]:
    """Token ids (IMAGE_TOKEN_INDEX at the marker) and per-token loss flags."""
    ids, loss = [], []
    for role, text in turns:
        if role == "user":
            pieces = text.split(IMAGE_TOKEN)
            for i, piece in enumerate(pieces):
                if i:
                    ids.append(IMAGE_TOKEN_INDEX)
                    loss.append(0)
                if piece:
                    toks = tokenize(piece)
                    ids += toks
                    loss += [0] * len(toks)
            toks = tokenize("\n")  # also after a bare image: LLaVAModel never puts loss on an image
            ids += toks              # position, so this newline is what predicts the first answer token
            loss += [0] * len(toks)
        else:
            toks = tokenize(text) + [eod]
            ids += toks
            loss += [1] * len(toks)
    return ids, loss


class RecordSamples(torch.utils.data.Dataset):
    """``num_samples`` samples drawn epoch by epoch from ``records`` (a seeded new order each epoch when
    shuffling), each made by :meth:`make`; a record that fails is named, or under ``skip_bad`` replaced by
    the next one (said once per record)."""

    def __init__(self, records: list, num_samples: int, shuffle: bool, seed: int, skip_bad: bool, source: str):
        self.records, self.num_samples, self.source = records, num_samples, source
        self.shuffle, self.seed, self.skip_bad = shuffle, seed, skip_bad
        self._order: tuple[int, torch.Tensor] | None = None
        self._warned: set = set()

    def __len__(self) -> int:
        return self.num_samples

    def make(self, record) -> dict:
        raise NotImplementedError

    def record_index(self, index: int) -> int:
        epoch, within = divmod(index, len(self.records))
        if not self.shuffle:
            return within
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = (epoch, torch.randperm(len(self.records), generator=generator))
        return int(self._order[1][within])

    def __getitem__(self, index: int) -> dict:
        first = self.record_index(index)
        for attempt in range(len(self.records)):
            record = self.records[(first + attempt) % len(self.records)]
            try:
                return self.make(record)
            except MMDataError as exc:
                if not self.skip_bad:
                    raise
                if id(record) not in self._warned:
                    self._warned.add(id(record))
                    print(f"[pretrain_mm] skipping {exc} (--mm-skip-bad-records)", flush=True)
        raise MMDataError(f"{self.source}: no record could be made into a sample")


class ImageTextDataset(RecordSamples):
    """LLaVA samples, each ``{"images", "tokens", "labels", "loss_mask"}``."""

    def __init__(self, records: list[Record], num_samples: int, text_len: int, tokenizer, data_cfg,
                 seed: int, skip_bad: bool, data_path: str):
        super().__init__(records, num_samples, data_cfg.shuffle, seed, skip_bad, data_path)
        self.text_len, self.tokenizer, self.cfg, self.data_path = text_len, tokenizer, data_cfg, data_path
        self.eod = tokenizer.eod
        pad = getattr(tokenizer, "pad", None)
        self.pad = pad if isinstance(pad, int) and pad >= 0 else self.eod

    def make(self, record: Record) -> dict:
        return self.sample(record)

    def sample(self, record: Record) -> dict:
        where = f"{self.data_path}:{record.line}"
        try:
            image = load_image(record.image, self.cfg.image_size, self.cfg.mean, self.cfg.std, self.cfg.interpolation)
        except Exception as exc:  # noqa: BLE001
            raise MMDataError(f"{where}: image {os.path.relpath(record.image, self.cfg.data_folder)}: cannot "
                              f"decode ({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        ids, loss = encode_turns(record.turns, self.tokenizer.tokenize, self.eod)
        keep = self.text_len + 1
        if ids.index(IMAGE_TOKEN_INDEX) >= self.text_len:
            raise MMDataError(f"{where}: the text before {IMAGE_TOKEN} is longer than the {self.text_len} text "
                              f"positions --seq-length leaves")
        ids, loss = ids[:keep], loss[:keep]
        pad = keep - len(ids)
        ids += [self.pad] * pad
        loss += [0] * pad
        ids_t = torch.tensor(ids, dtype=torch.long)
        return {
            "images": image,
            "tokens": ids_t[:-1].clone(),
            "labels": ids_t[1:].clone(),
            "loss_mask": torch.tensor(loss[1:], dtype=torch.float32),
        }


def describe_skipped(data_path: str, total: int, skipped: Counter) -> str:
    if not skipped:
        return f"> {data_path}: {total} records"
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
    return (f"> {data_path}: {total} records used, {sum(skipped.values())} skipped ({reasons}) "
            f"under --mm-skip-bad-records")
