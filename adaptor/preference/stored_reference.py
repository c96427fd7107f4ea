"""DPO's reference as stored numbers: the reference's sequence log-probabilities of every pair, kept in a
file beside the pairwise dataset, so that later runs need no reference model in memory.

The reference is frozen, so its log-probabilities of a pair never change: one run computes them
(``--precompute-ref-logps FILE``: a DPO run that evaluates its reference over every pair before its first
step, :mod:`adaptor.preference.precompute`, writes the file and trains against it), and any number of
later runs read them (``--ref-logps FILE``) instead of evaluating a second model.

File layout: one line of JSON (the header), then ``pairs x 4`` little-endian float64 values, row ``i``
being pair ``i`` of the dataset as stored (not as shuffled; with packed samples, counted through the
samples in order): chosen sum, rejected sum, chosen per-token
mean, rejected per-token mean. Sums serve the sigmoid and hinge losses, means IPO's, so one file serves
every ``--dpo-loss-type``. The header names the dataset (its prefix, number of pairs and a digest of
its lengths, tokens and labels) and the sequence length, which decides where long responses are cut; a run whose
data disagree is refused rather than trained against another dataset's numbers.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

FORMAT = "dpo-reference-logps/2"  # /1 digested the lengths only
COLUMNS = ("chosen_sum", "rejected_sum", "chosen_mean", "rejected_mean")


class StoredReferenceError(ValueError):
    """A reference file that cannot serve this run (one line)."""


# Datasets up to this size are hashed whole; larger ones by evenly spread blocks of it, so a
# check at start reads at most this much per field whatever the dataset's size.
_WHOLE_BYTES = 64 << 20
_BLOCKS, _BLOCK_BYTES = 4096, 16 << 10


def _content_digest(h, path: str) -> None:
    size = os.path.getsize(path)
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= _WHOLE_BYTES:
            h.update(f.read())
            return
        for k in range(_BLOCKS):
            f.seek((size - _BLOCK_BYTES) * k // (_BLOCKS - 1))
            h.update(f.read(_BLOCK_BYTES))


def dataset_digest(low) -> str:
    """A digest of a :class:`~adaptor.preference.pairwise_dataset.PairwiseLowLevel`'s fields: every
    sample's length and the tokens and labels themselves (whole up to 64 MiB a field, else 64 MiB
    of blocks spread evenly over it). Another dataset, or the same pairs tokenized, templated or cut
    differently, gives another digest even where the lengths agree."""
    h = hashlib.sha256()
    for name in sorted(low.fields):
        h.update(name.encode())
        h.update(np.asarray(low.fields[name].sequence_lengths, dtype=np.int64).tobytes())
        _content_digest(h, low.fields[name].path_prefix + ".bin")
    return h.hexdigest()[:16]


def header_for(low, seq_length: int) -> dict:
    return {"format": FORMAT, "prefix": os.path.abspath(low.prefix), "pairs": low.num_pairs,
            "digest": dataset_digest(low), "seq_length": int(seq_length), "columns": list(COLUMNS)}


def write(path: str, header: dict, values: np.ndarray) -> None:
    """Write atomically: a temporary name in the same directory, then a rename, so a reader never sees
    half a file."""
    values = np.ascontiguousarray(values, dtype="<f8")
    if values.shape != (header["pairs"], len(COLUMNS)) or np.isnan(values).any():
        raise StoredReferenceError(f"{path}: {values.shape} values, {header['pairs']} complete pairs expected")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
        f.write(values.tobytes())
    os.replace(tmp, path)


def read(path: str) -> tuple[dict, np.ndarray]:
    """(header, values [pairs, 4] float64)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
            body = f.read()
        header = json.loads(first)
    except (OSError, ValueError) as exc:
        raise StoredReferenceError(f"--ref-logps {path}: not a reference file ({exc})") from None
    if isinstance(header, dict) and header.get("format") == "dpo-reference-logps/1":
        raise StoredReferenceError(f"--ref-logps {path}: written by an older version whose dataset check read "
                                   f"only lengths; compute it again with --precompute-ref-logps")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoredReferenceError(f"--ref-logps {path}: not a reference file written by --precompute-ref-logps")
    values = np.frombuffer(body, dtype="<f8")
    if values.size != header["pairs"] * len(COLUMNS):
        raise StoredReferenceError(f"--ref-logps {path}: truncated ({values.size} values for {header['pairs']} pairs)")
    return header, values.reshape(header["pairs"], len(COLUMNS))


def check_matches(header: dict, expected: dict, path: str) -> None:
    """Refuse a file made for another dataset or sequence length (one line)."""
    for key, what in (("pairs", "pairs"), ("digest", "dataset digest"), ("seq_length", "--seq-length")):
        if header.get(key) != expected[key]:
            raise StoredReferenceError(
                f"--ref-logps {path} was computed for {header.get('prefix')} ({what} {header.get(key)}), "
                f"not for --data-path {expected['prefix']} ({what} {expected[key]}): compute it again with "
                f"--precompute-ref-logps")


class Recorder:
    """Collects the reference's values pair by pair (NaN until a pair is seen)."""

    def __init__(self, path: str, header: dict) -> None:
        self.path, self.header = path, header
        self.values = np.full((header["pairs"], len(COLUMNS)), np.nan)

    def record(self, pairs: np.ndarray, rows: np.ndarray) -> None:
        """Store ``rows`` [b, 4] for pair indices ``pairs`` [b]."""
        self.values[pairs] = rows
