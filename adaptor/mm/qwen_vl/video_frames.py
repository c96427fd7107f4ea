"""A record's video as frames: a list of frame images, a directory of them, or a video file.

* A list of image paths is the video's frames in that order; a directory holds them, in file-name order
  (``frame_0002.png`` before ``frame_0010.png`` needs zero padding, as frame dumps write). Every frame is
  used; their rate is data.json's ``video_fps`` (LLaMA-Factory's meaning for frame lists).
* A video file (``.mp4``, ``.webm``, ...) is decoded with PyAV when it is installed, ``video_fps`` frames
  per second of its own rate at most ``video_maxlen`` frames, spread evenly over the video; without PyAV
  it is one line naming the package to install. Nothing else here needs a video library.

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


def _decode_file(path: str, fps: float, maxlen: int):
    """(frames, their rate) of a video file, sampled at ``fps`` (at most ``maxlen`` frames)."""
    try:
        import av
    except ImportError:
        raise ValueError(f"video {os.path.basename(path)}: decoding a video file needs PyAV "
                         f"(pip install av), or give the video as a directory or list of frame images") from None
    with av.open(path) as container:
        stream = container.streams.video[0]
        frames = [frame.to_image() for frame in container.decode(stream)]
        rate = float(stream.average_rate or 0) or None
    if not frames:
        raise ValueError(f"video {os.path.basename(path)}: no frames decoded")
    duration = len(frames) / rate if rate else len(frames) / fps
    wanted = max(1, min(maxlen, len(frames), math.floor(duration * fps)))
    picked = [frames[int(i * len(frames) / wanted)] for i in range(wanted)]
    return picked, (wanted / duration if duration > 0 else fps)


def read_video(video, fps: float | None, maxlen: int | None):
    """(PIL frames, frames per second) of a list, directory or file video (see the module docstring)."""
    fps = DEFAULT_FPS if fps is None else fps
    paths = frame_paths(video)
    if paths is None:
        return _decode_file(video, fps, DEFAULT_MAXLEN if maxlen is None else maxlen)
    return [_load_image(p) for p in paths], fps
