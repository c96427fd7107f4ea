"""One training sample from one record: images to patches, conversation to token ids, loss and positions.

What transformers' Qwen2.5-VL / Qwen3-VL processor and ``apply_chat_template`` would give, built without
transformers: the ``tokenizers`` library reads ``model_name_or_path/tokenizer.json``, and
:mod:`.image_processor` makes the patches.

* **Tokens.** The rendered conversation (:mod:`.chat_format`) is encoded in one piece, as the reference
  does; each ``<|image_pad|>`` is then widened to the image's ``t*h*w / merge²`` tokens.
* **Loss.** A token is in the loss when its characters overlap a loss piece of the rendering.
* **Shift.** Megatron's convention: ``tokens = ids[:-1]``, ``labels = ids[1:]``, ``loss_mask`` of the labels.
* **Length.** At most ``--seq-length`` tokens (``cutoff_len`` caps the ids too, as in LLaMA-Factory). Text
  after the limit is cut; an image whose placeholder run would be cut makes the record bad (named, or
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
from adaptor.mm.qwen_vl.chat_format import IMAGE_PAD, render
from adaptor.mm.qwen_vl.image_processor import image_settings, preprocess
from adaptor.mm.qwen_vl.rope_index import qwen2_5_vl_rope_index, qwen3_vl_rope_index, token_types

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


class SampleBuilder:
    """Records to samples ``{tokens, labels, loss_mask, position_ids, pixel_values, image_grid_thw}``."""

    def __init__(self, tokenizer, pad_id: int, image_pad_id: int, settings, family: str, template: str,
                 max_ids: int, limit_text: str, train_on_prompt: bool = False, mask_history: bool = False):
        self.tokenizer, self.pad_id, self.image_pad_id = tokenizer, pad_id, image_pad_id
        self.settings, self.family, self.template = settings, family, template
        self.max_ids, self.limit_text = max_ids, limit_text  # ids kept (tokens + 1), and what sets that
        self.train_on_prompt, self.mask_history = train_on_prompt, mask_history
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

    def ids_and_loss(self, record, grid: torch.Tensor) -> tuple[list[int], list[int]]:
        """Token ids of the whole conversation, image runs widened, and a loss flag per id."""
        pieces = render(self.template, record.system, list(record.turns), self.train_on_prompt, self.mask_history)
        text = "".join(piece for piece, _ in pieces)
        in_loss = bytearray(len(text))
        start = 0
        for piece, loss in pieces:
            if loss:
                in_loss[start:start + len(piece)] = b"\x01" * len(piece)
            start += len(piece)
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        runs = (grid.prod(-1) // self.settings.merge_size ** 2).tolist()
        if encoding.ids.count(self.image_pad_id) != len(runs):
            raise MMDataError(f"{record.where}: the text holds {encoding.ids.count(self.image_pad_id)} image "
                              f"placeholders ({IMAGE_PAD} written literally?) for {len(runs)} images")
        ids, loss, image = [], [], 0
        for token, (begin, end) in zip(encoding.ids, encoding.offsets):
            if token == self.image_pad_id:
                ids += [token] * runs[image]
                loss += [0] * runs[image]
                image += 1
            else:
                ids.append(token)
                loss.append(1 if any(in_loss[begin:max(end, begin + 1)]) else 0)
        return ids, loss

    def positions(self, tokens: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        types = token_types(tokens[None], self.image_pad_id)
        rope_index = qwen3_vl_rope_index if self.family == "qwen3_vl" else qwen2_5_vl_rope_index
        positions, _ = rope_index(types, grid if len(grid) else None, spatial_merge_size=self.settings.merge_size)
        return positions[:, 0]

    def build(self, record) -> dict:
        pixel_values, grid = self.images(record)
        ids, loss = self.ids_and_loss(record, grid)
        if len(ids) > self.max_ids:
            tokens_kept = self.max_ids - 1
            pad_at = [i for i, token in enumerate(ids) if token == self.image_pad_id]
            if pad_at and pad_at[-1] >= tokens_kept:
                ends = (grid.prod(-1) // self.settings.merge_size ** 2).cumsum(0).tolist()
                image = next(i for i, end in enumerate(ends) if pad_at[end - 1] >= tokens_kept)
                raise MMDataError(f"{record.where}: image {image} ({int(grid[image].prod())} patches) ends at token "
                                  f"{pad_at[ends[image] - 1] + 1}, past the {tokens_kept} tokens a sample holds "
                                  f"({self.limit_text}); shrink image_max_pixels or raise the length")
            ids, loss = ids[:self.max_ids], loss[:self.max_ids]
        ids_t = torch.tensor(ids, dtype=torch.long)
        tokens = ids_t[:-1].clone()
        return {
            "tokens": tokens,
            "labels": ids_t[1:].clone(),
            "loss_mask": torch.tensor(loss[1:], dtype=torch.float32),
            "position_ids": self.positions(tokens, grid),
            "pixel_values": pixel_values,
            "image_grid_thw": grid,
        }
