"""A record's video as frames: a list of frame images, a directory of them, or a video file.

* A list of image paths is the video's frames in that order; a directory holds them, in file-name order
  (``frame_0002.png`` before ``frame_0010.png`` needs zero padding, as frame dumps write). Every frame is
  used; their rate is data.json's ``video_fps`` (LLaMA-Factory's meaning for frame lists).
* A video file (``.mp4``, ``.webm``, ...) is decoded with PyAV when it is installed: ``video_fps`` frames
  per second of its duration, at most ``video_maxlen``, spread evenly from its first frame to its last;
  their rate is the frames kept over the duration. Without PyAV it is one line naming the package to
  install. Nothing else here needs a video library.

The rate sets how far apart a Qwen2.5-VL video's frame groups lie in the 3-D positions:
``second_per_grid_ts = temporal_patch_size / fps``.
"""
from __future__ import annotations

import math
import os

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".flv", ".m4v", ".mpeg", ".mpg", ".wmv")
DEFAULT_FPS = 2.0
DEFAULT_MAXLEN = 128


def frame_paths(video) -> list[str] | None:
    """The frame files of a list or directory video (absolute paths), or None for a video file."""
    if isinstance(video, (list, tuple)):
        return list(video)
    if os.path.isdir(video):
        names = sorted(n for n in os.listdir(video) if n.lower().endswith(IMAGE_SUFFIXES))
        if not names:
            raise ValueError(f"video {os.path.basename(video.rstrip(os.sep))}/: no frame images "
                             f"({', '.join(IMAGE_SUFFIXES)})")
        return [os.path.join(video, n) for n in names]
    if not video.lower().endswith(VIDEO_SUFFIXES):
        raise ValueError(f"video {os.path.basename(video)}: neither a directory of frames nor a video file "
                         f"({', '.join(VIDEO_SUFFIXES)})")
    return None


def _load_image(path):
    from PIL import Image

    with Image.open(path) as image:
        image.load()
        return image.copy()


def _sample_indices(total: int, seconds: float, fps: float, maxlen: int) -> list[int]:
    """Which of ``total`` frames to keep: ``fps`` per second of the video, at most ``maxlen``, spread evenly from
    the first frame to the last (LLaMA-Factory's rule, which MindSpeed-MM trains with)."""
    wanted = min(total, maxlen, max(1, math.floor(seconds * fps)))
    if wanted == 1:
        return [0]
    return [int(i * (total - 1) / (wanted - 1)) for i in range(wanted)]


def _decode_file(path: str, fps: float, maxlen: int):
    """(frames, their rate) of a video file, sampled at ``fps`` (at most ``maxlen`` frames); only the kept frames
    are held in memory."""
    try:
        import av
    except ImportError:
        raise ValueError(f"video {os.path.basename(path)}: decoding a video file needs PyAV "
                         f"(pip install av), or give the video as a directory or list of frame images") from None
    with av.open(path) as container:
        stream = container.streams.video[0]
        total = stream.frames
        seconds = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
        if not total:  # no frame count in the header: count by decoding
            total = sum(1 for _ in container.decode(stream))
            container.seek(0)
        if not seconds:
            seconds = total / float(stream.average_rate) if stream.average_rate else total / fps
        keep = _sample_indices(total, seconds, fps, maxlen) if total else []
        wanted, frames = set(keep), []
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                frames.append(frame.to_image())
            if index >= keep[-1]:
                break
    if not frames:
        raise ValueError(f"video {os.path.basename(path)}: no frames decoded")
    return frames, len(frames) / seconds if seconds > 0 else fps


def read_video(video, fps: float | None, maxlen: int | None):
    """(PIL frames, frames per second) of a list, directory or file video (see the module docstring)."""
    fps = DEFAULT_FPS if fps is None else fps
    paths = frame_paths(video)
    if paths is None:
        return _decode_file(video, fps, DEFAULT_MAXLEN if maxlen is None else maxlen)
    return [_load_image(p) for p in paths], fps
