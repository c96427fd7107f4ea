"""LLaMA-Factory's sharegpt records with images, read and checked before training starts.

A record (keys named by data.json's ``attr``; these are MindSpeed-MM's)::

    {"messages": [{"role": "user", "content": "<image>What is drawn?"},
                  {"role": "assistant", "content": "A red circle."}],
     "images": ["shapes/0001.png"]}
    {"messages": [{"role": "user", "content": "<video>What moves?"}, ...],
     "videos": [["clip/000.png", "clip/001.png", "clip/002.png"]]}

The file is a JSON list of records or JSON Lines. A first message with the ``system_tag`` role (or the
record key ``attr.system``) is the system prompt; then user and assistant turns alternate, starting with
the user and ending with the assistant. Each ``<image>`` in a user turn takes the next image of
``images``, so the counts must agree; each ``<video>`` the next of ``videos``: a list of frame images, a
directory of them, or a video file (:mod:`.video_frames`). Paths are relative to ``dataset_dir``.

A bad record is an :class:`~adaptor.mm.data.MMDataError` line naming file and record (``file:line``
for JSON Lines, ``file: record i`` for a list), or with ``--mm-skip-bad-records`` skipped and counted.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass

from adaptor.mm.data import MMDataError
from adaptor.mm.qwen_vl.chat_format import IMAGE_MARKER, VIDEO_MARKER


@dataclass(frozen=True)
class VLRecord:
    where: str                     # "file:line" or "file: record i", for messages
    system: str | None
    turns: tuple                   # ((role "user" | "assistant", text), ...)
    images: tuple                  # absolute paths, in <image> order
    videos: tuple = ()             # in <video> order: a tuple of frame paths, or a directory's or file's path


def _raw_records(path: str):
    """(where, parsed object or the JSON error) for each record of a JSON list or JSON Lines file."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MMDataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        for index, item in enumerate(items):
            yield f"{path}: record {index}", item
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{line_no}", json.loads(line)
        except json.JSONDecodeError as exc:
            yield f"{path}:{line_no}", exc


def _conversation(obj, attr: dict) -> tuple[str | None, list[tuple[str, str]]]:
    """(system prompt, turns) of one record; ValueError with the problem otherwise."""
    messages = obj.get(attr["messages"])
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'"{attr["messages"]}" is missing or not a non-empty list')
    roles = {attr["user_tag"]: "user", attr["assistant_tag"]: "assistant", attr["system_tag"]: "system"}
    turns = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get(attr["content_tag"]), str):
            raise ValueError(f'{attr["messages"]}[{index}]: not an object with a string "{attr["content_tag"]}"')
        role = roles.get(message.get(attr["role_tag"]))
        if role is None:
            raise ValueError(f'{attr["messages"]}[{index}]: "{attr["role_tag"]}" is '
                             f'{json.dumps(message.get(attr["role_tag"]))}, not one of {", ".join(map(json.dumps, roles))}')
        turns.append((role, message[attr["content_tag"]]))
    system = obj.get(attr["system"]) if attr["system"] else None
    if turns[0][0] == "system":
        system = turns.pop(0)[1]
    if system is not None and not isinstance(system, str):
        raise ValueError(f'"{attr["system"]}" is not a string')
    for index, (role, _) in enumerate(turns):
        expected = "user" if index % 2 == 0 else "assistant"
        if role != expected:
            raise ValueError(f"turn {index} is a {role} turn where a {expected} turn is expected (user and assistant "
                             f"alternate, starting with the user)")
    if not turns or turns[-1][0] != "assistant":
        raise ValueError("the conversation does not end with an assistant turn")
    for marker in (IMAGE_MARKER, VIDEO_MARKER):
        if any(role == "assistant" and marker in text for role, text in turns):
            raise ValueError(f"{marker} in an assistant turn")
    return system, turns


def _images(obj, attr: dict, dataset_dir: str, turns) -> list[str]:
    images = obj.get(attr["images"]) or []
    if isinstance(images, str):
        images = [images]
    if not isinstance(images, list) or not all(isinstance(i, str) and i for i in images):
        raise ValueError(f'"{attr["images"]}" is not a list of paths')
    markers = sum(text.count(IMAGE_MARKER) for _, text in turns)
    if markers != len(images):
        raise ValueError(f"{markers} {IMAGE_MARKER} markers but {len(images)} images")
    paths = [os.path.join(dataset_dir, image) for image in images]
    for image, path in zip(images, paths):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"image {image}: no such file")
    return paths


def _videos(obj, attr: dict, dataset_dir: str, turns) -> list:
    """Each video of the record: a tuple of absolute frame paths, or the absolute path of a directory or file."""
    videos = obj.get(attr["videos"]) or []
    if isinstance(videos, str):
        videos = [videos]
    if not isinstance(videos, list) or not all(
            isinstance(v, str) and v or isinstance(v, list) and v and all(isinstance(f, str) and f for f in v)
            for v in videos):
        raise ValueError(f'"{attr["videos"]}" is not a list of videos (each a path, or a list of frame paths)')
    markers = sum(text.count(VIDEO_MARKER) for _, text in turns)
    if markers != len(videos):
        raise ValueError(f"{markers} {VIDEO_MARKER} markers but {len(videos)} videos")
    out = []
    for video in videos:
        for item in video if isinstance(video, list) else [video]:
            if not os.path.exists(os.path.join(dataset_dir, item)):
                raise FileNotFoundError(f"video {item}: no such file or directory")
        out.append(tuple(os.path.join(dataset_dir, f) for f in video) if isinstance(video, list)
                   else os.path.join(dataset_dir, video))
    return out


def read_vl_records(cfg, skip_bad: bool) -> tuple[list[VLRecord], Counter]:
    """Every usable record of data.json's dataset (its first ``max_samples``), and skipped ones per reason."""
    records, skipped = [], Counter()
    first_bad = None
    try:
        raw = _raw_records(cfg.dataset)
        for count, (where, obj) in enumerate(raw):
            if cfg.max_samples is not None and count >= cfg.max_samples:
                break
            try:
                if isinstance(obj, json.JSONDecodeError):
                    raise ValueError(f"not valid JSON ({obj.msg})")
                if not isinstance(obj, dict):
                    raise ValueError("not a JSON object")
                system, turns = _conversation(obj, cfg.attr)
                images = _images(obj, cfg.attr, cfg.dataset_dir, turns)
                videos = _videos(obj, cfg.attr, cfg.dataset_dir, turns)
            except (ValueError, FileNotFoundError) as exc:
                if not skip_bad:
                    raise MMDataError(f"{where}: {exc}") from None
                skipped["missing image" if isinstance(exc, FileNotFoundError) else "bad record"] += 1
                first_bad = first_bad or f"{where}: {exc}"
                continue
            records.append(VLRecord(where, system, tuple(turns), tuple(images), tuple(videos)))
    except OSError as exc:
        raise MMDataError(f"{cfg.dataset}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise MMDataError(f"{cfg.dataset}: not UTF-8") from None
    if not records:
        raise MMDataError(f"{cfg.dataset}: no usable records" + (f" (first bad: {first_bad})" if first_bad else ""))
    return records, skipped
