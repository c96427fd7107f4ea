"""One training sample from one record: images to patches, conversation to token ids, loss and positions.

What transformers' Qwen2.5-VL / Qwen3-VL processor and ``apply_chat_template`` would give, built without
transformers: the ``tokenizers`` library reads ``model_name_or_path/tokenizer.json``, and
:mod:`.image_processor` makes the patches.

* **Tokens.** The rendered conversation (:mod:`.chat_format`) is encoded in one piece, as the reference
  does; each ``<|image_pad|>`` (``<|video_pad|>``) is then widened to the image's (video's)
  ``t*h*w / merge²`` tokens.
* **Videos** (Qwen2.5-VL): frames of :mod:`.video_frames`, patches of :mod:`.video_processor`; a video's
  frame groups lie ``tokens_per_second * temporal_patch_size / fps`` positions apart. Qwen3-VL writes a
  timestamp before each frame, which is not built here: its videos are one line.
* **Loss.** A token is in the loss when its characters overlap a loss piece of the rendering.
* **Shift.** Megatron's convention: ``tokens = ids[:-1]``, ``labels = ids[1:]``, ``loss_mask`` of the labels.
* **Length.** At most ``--seq-length`` tokens (``cutoff_len`` caps the ids too, as in LLaMA-Factory). Text
  after the limit is cut; an image (video) whose placeholder run would be cut makes the record bad (named, or
  skipped under ``--mm-skip-bad-records``, LLaMA-Factory drops it too): half an image's tokens cannot match
  its patches, and dropping the image would leave the text pointing at nothing.
* **Positions.** :mod:`.rope_index` of the family on the tokens, shape ``[3, s]``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from adaptor.mm.schema import MMConfigError
from adaptor.mm.data import MMDataError
from adaptor.mm.qwen_vl.chat_format import IMAGE_PAD, VIDEO_PAD, render
from adaptor.mm.qwen_vl.image_processor import image_settings, preprocess
from adaptor.mm.qwen_vl.rope_index import qwen2_5_vl_rope_index, qwen3_vl_rope_index, token_types
from adaptor.mm.qwen_vl.video_frames import read_video
from adaptor.mm.qwen_vl.video_processor import preprocess_video

PROCESSOR_FILE = "preprocessor_config.json"


def processor_settings(family: str, directory: str, min_pixels: int | None, max_pixels: int | None):
    """The family's :class:`ImageSettings`, overridden by ``preprocessor_config.json`` in ``directory`` when
    there is one, then by data.json's pixel bounds."""
    settings = image_settings(family)
    path = Path(directory) / PROCESSOR_FILE
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        size = config.get("size") or {}
        settings = image_settings(family, config.get("min_pixels", size.get("shortest_edge")),
                                  config.get("max_pixels", size.get("longest_edge")))
        fields = {"patch_size": "patch_size", "merge_size": "merge_size", "temporal_patch_size": "temporal_patch_size",
                  "image_mean": "mean", "image_std": "std"}
        changes = {ours: tuple(config[theirs]) if isinstance(config[theirs], list) else config[theirs]
                   for theirs, ours in fields.items() if config.get(theirs) is not None}
        settings = dataclasses.replace(settings, **changes)
    low = settings.min_pixels if min_pixels is None else min_pixels
    high = settings.max_pixels if max_pixels is None else max_pixels
    if not 0 <= low <= high or high <= 0:
        raise ValueError(f"image_min_pixels {low} and image_max_pixels {high} must satisfy 0 <= min <= max, max > 0")
    return dataclasses.replace(settings, min_pixels=low, max_pixels=high)


def load_tokenizer(directory: str, where: str):
    """(tokenizers.Tokenizer, pad id, image pad id) from ``directory``'s tokenizer.json."""
    from tokenizers import Tokenizer

    from adaptor.tokenizer_json import find_tokenizer_json, read_special_tokens

    path = find_tokenizer_json(directory)
    if path is None:
        raise MMConfigError(f"{where}: {directory} holds no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path))
    roles = read_special_tokens(path, tokenizer)
    pad_text = roles.get("pad") or roles.get("eos")
    pad = tokenizer.token_to_id(pad_text) if pad_text else None
    image_pad = tokenizer.token_to_id(IMAGE_PAD)
    if image_pad is None:
        raise MMConfigError(f"{where}: the tokenizer in {directory} has no {IMAGE_PAD} token (not a Qwen-VL tokenizer)")
    return tokenizer, (image_pad if pad is None else pad), image_pad


@dataclasses.dataclass(frozen=True)
class VideoOptions:
    """How videos are read: per-frame pixel bounds (an :class:`ImageSettings`), frame rate, frames at most, and
    the model's positions per second."""

    settings: object
    fps: float | None = None
    maxlen: int | None = None
    tokens_per_second: float = 2


class SampleBuilder:
    """Records to samples ``{tokens, labels, loss_mask, position_ids, pixel_values, image_grid_thw,
    pixel_values_videos, video_grid_thw}``."""

    def __init__(self, tokenizer, pad_id: int, image_pad_id: int, settings, family: str, template: str,
                 max_ids: int, limit_text: str, train_on_prompt: bool = False, mask_history: bool = False,
                 video: VideoOptions | None = None):
        self.tokenizer, self.pad_id, self.image_pad_id = tokenizer, pad_id, image_pad_id
        self.video_pad_id = tokenizer.token_to_id(VIDEO_PAD)
        self.settings, self.family, self.template = settings, family, template
        self.max_ids, self.limit_text = max_ids, limit_text  # ids kept (tokens + 1), and what sets that
        self.train_on_prompt, self.mask_history = train_on_prompt, mask_history
        self.video = video or VideoOptions(settings)
        self.patch_width = 3 * settings.temporal_patch_size * settings.patch_size ** 2

    def images(self, record) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        if not record.images:
            return torch.zeros(0, self.patch_width), torch.zeros(0, 3, dtype=torch.long)
        loaded = []
        for path in record.images:
            try:
                with Image.open(path) as image:
                    image.load()
                    loaded.append(image.copy())
            except Exception as exc:  # noqa: BLE001  (Pillow raises many types for bad files)
                raise MMDataError(f"{record.where}: image {Path(path).name}: cannot decode "
                                  f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
        try:
            return preprocess(loaded, self.settings)
        except ValueError as exc:
            raise MMDataError(f"{record.where}: {exc}") from None

    def videos(self, record) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pixel_values_videos, video_grid_thw, second_per_grid_ts) of the record's videos, in order."""
        if not record.videos:
            return torch.zeros(0, self.patch_width), torch.zeros(0, 3, dtype=torch.long), torch.zeros(0)
        if self.family != "qwen2_5_vl" or self.video_pad_id is None:
            why = "a timestamp before each frame is not built here" if self.family != "qwen2_5_vl" \
                else f"the tokenizer has no {VIDEO_PAD}"
            raise MMDataError(f"{record.where}: videos are read for Qwen2.5-VL ({why})")
        pixels, grids, seconds = [], [], []
        for index, video in enumerate(record.videos):
            try:
                frames, fps = read_video(video, self.video.fps, self.video.maxlen)
                rows, grid = preprocess_video(frames, self.video.settings)
            except (ValueError, OSError) as exc:
                raise MMDataError(f"{record.where}: video {index}: {' '.join(str(exc).split())}") from None
            except Exception as exc:  # noqa: BLE001  (Pillow raises many types for bad files)
                raise MMDataError(f"{record.where}: video {index}: cannot decode "
                                  f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
            pixels.append(rows)
            grids.append(grid)
            seconds.append(self.settings.temporal_patch_size / fps)
        return torch.cat(pixels), torch.tensor(grids, dtype=torch.long), torch.tensor(seconds, dtype=torch.float64)

    def ids_and_loss(self, record, grid: torch.Tensor, video_grid: torch.Tensor | None = None
                     ) -> tuple[list[int], list[int]]:
        """Token ids of the whole conversation, image and video runs widened, and a loss flag per id."""
        pieces = render(self.template, record.system, list(record.turns), self.train_on_prompt, self.mask_history)
        text = "".join(piece for piece, _ in pieces)
        in_loss = bytearray(len(text))
        start = 0
        for piece, loss in pieces:
            if loss:
                in_loss[start:start + len(piece)] = b"\x01" * len(piece)
            start += len(piece)
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        video_grid = torch.zeros(0, 3, dtype=torch.long) if video_grid is None else video_grid
        runs = {}
        for pad_id, pad, what, grids in ((self.image_pad_id, IMAGE_PAD, "image", grid),
                                         (self.video_pad_id, VIDEO_PAD, "video", video_grid)):
            runs[pad_id] = (grids.prod(-1) // self.settings.merge_size ** 2).tolist()
            found = encoding.ids.count(pad_id) if pad_id is not None else 0
            if found != len(runs[pad_id]):
                raise MMDataError(f"{record.where}: the text holds {found} {what} placeholders ({pad} written "
                                  f"literally?) for {len(runs[pad_id])} {what}s")
        ids, loss, seen = [], [], {pad_id: 0 for pad_id in runs}
        for token, (begin, end) in zip(encoding.ids, encoding.offsets):
            if token in runs:
                width = runs[token][seen[token]]
                ids += [token] * width
                loss += [0] * width
                seen[token] += 1
            else:
                ids.append(token)
                loss.append(1 if any(in_loss[begin:max(end, begin + 1)]) else 0)
        return ids, loss

    def positions(self, tokens: torch.Tensor, grid: torch.Tensor, video_grid: torch.Tensor | None = None,
                  seconds: torch.Tensor | None = None) -> torch.Tensor:
        types = token_types(tokens[None], self.image_pad_id, self.video_pad_id)
        merge = self.settings.merge_size
        if self.family == "qwen3_vl":
            positions, _ = qwen3_vl_rope_index(types, grid if len(grid) else None, spatial_merge_size=merge)
        else:
            videos = video_grid is not None and len(video_grid) > 0
            positions, _ = qwen2_5_vl_rope_index(
                types, grid if len(grid) else None, video_grid if videos else None, seconds if videos else None,
                spatial_merge_size=merge, tokens_per_second=self.video.tokens_per_second)
        return positions[:, 0]

    def _check_cut(self, record, ids: list[int], pad_id: int, grid: torch.Tensor, what: str, bound: str) -> None:
        """A record whose ``what`` placeholder run would be cut by the length limit is bad (one line)."""
        tokens_kept = self.max_ids - 1
        pad_at = [i for i, token in enumerate(ids) if token == pad_id]
        if pad_at and pad_at[-1] >= tokens_kept:
            ends = (grid.prod(-1) // self.settings.merge_size ** 2).cumsum(0).tolist()
            item = next(i for i, end in enumerate(ends) if pad_at[end - 1] >= tokens_kept)
            raise MMDataError(f"{record.where}: {what} {item} ({int(grid[item].prod())} patches) ends at token "
                              f"{pad_at[ends[item] - 1] + 1}, past the {tokens_kept} tokens a sample holds "
                              f"({self.limit_text}); shrink {bound} or raise the length")

    def build(self, record) -> dict:
        pixel_values, grid = self.images(record)
        video_pixels, video_grid, seconds = self.videos(record)
        ids, loss = self.ids_and_loss(record, grid, video_grid)
        if len(ids) > self.max_ids:
            self._check_cut(record, ids, self.image_pad_id, grid, "image", "image_max_pixels")
            if len(video_grid):
                self._check_cut(record, ids, self.video_pad_id, video_grid, "video", "video_max_pixels")
            ids, loss = ids[:self.max_ids], loss[:self.max_ids]
        ids_t = torch.tensor(ids, dtype=torch.long)
        tokens = ids_t[:-1].clone()
        return {
            "tokens": tokens,
            "labels": ids_t[1:].clone(),
            "loss_mask": torch.tensor(loss[1:], dtype=torch.float32),
            "position_ids": self.positions(tokens, grid, video_grid, seconds),
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
            "pixel_values_videos": video_pixels,
            "video_grid_thw": video_grid,
        }
