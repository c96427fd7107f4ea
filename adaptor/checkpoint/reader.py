"""Reading a safetensors checkpoint: any requested slice of any tensor, and its non-tensor state.

What each rank saved is the torch-free :class:`adaptor.checkpoint.shard_table.ShardTable`. A request
is the same description for the run that loads: Megatron's ShardedTensor at the new layout. The
reader copies each overlap of the two from the memory-mapped files, so a checkpoint saved at one
TP/PP/DP/EP layout loads at another, and each rank reads only the bytes it needs.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from adaptor.checkpoint import files
from adaptor.checkpoint.errors import CheckpointError
from adaptor.checkpoint.object_codec import decode, dtype_from_name
from adaptor.checkpoint.shard_table import SavedShard, ShardTable
from adaptor.safetensors_file import SafetensorsFile


MAIN_PARAM_PREFIX = "optimizer.state.fp32_param."


def _box_of(sh_ten) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(sh_ten.global_offset), (1,) * sh_ten.prepend_axis_num + tuple(sh_ten.local_shape)


def _intersect(a, b):
    """Overlap of boxes a and b as (start, shape), or None."""
    (a_off, a_shape), (b_off, b_shape) = a, b
    start = tuple(max(x, y) for x, y in zip(a_off, b_off))
    stop = tuple(min(x + m, y + n) for x, m, y, n in zip(a_off, a_shape, b_off, b_shape))
    if any(e <= s for s, e in zip(start, stop)):
        return None
    return start, tuple(e - s for s, e in zip(start, stop))


def _slices(start, shape, origin):
    return tuple(slice(s - o, s - o + n) for s, n, o in zip(start, shape, origin))


class CheckpointIndex(ShardTable):
    """One finished checkpoint directory: its shard table, and the tensors and objects read from it."""

    def __init__(self, checkpoint_dir):
        super().__init__(checkpoint_dir)
        self._files: dict[str, SafetensorsFile] = {}

    def _file(self, name: str) -> SafetensorsFile:
        """The checkpoint's file ``name`` with its data mapped (its header was read with the table)."""
        if name not in self._files:
            self._files[name] = SafetensorsFile(self.headers[name])
        return self._files[name]

    # ------------------------------------------------------------------ common state and objects
    def common_state(self) -> dict:
        tensors = None
        if (self.dir / files.COMMON_TENSORS).exists():
            self._read_header(files.COMMON_TENSORS, files.member(self.dir, files.COMMON_TENSORS))
            tensors = self._file(files.COMMON_TENSORS)

        def get(name):
            if tensors is None or name not in tensors.tensors:
                raise CheckpointError(f"{self.dir / files.COMMON_JSON}: refers to tensor {name} that "
                                      f"{files.COMMON_TENSORS} does not hold")
            return tensors.get(name)

        try:
            state = decode(self.doc["state"], get)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{self.dir / files.COMMON_JSON}: corrupt common state ({exc})") from None
        content = state.get("content_metadata")
        if isinstance(content, dict):
            # Saved without the distributed optimizer: its optimizer state is whole tensors in model
            # space, which a distributed optimizer reads in its model-space layout.
            content.setdefault("distrib_optim_sharding_type", "fully_sharded_model_space")
        return state

    def load_object(self, sh_obj):
        found = self.objects.get(sh_obj.unique_key)
        if found is None and self.doc.get("weights_only") and sh_obj.key.endswith("._extra_state"):
            return None  # Transformer Engine's run-time state (fp8 scales), not part of a weights-only checkpoint
        if found is None:
            raise CheckpointError(f"{self.dir}: object {sh_obj.unique_key} is not in the checkpoint "
                                  f"(saved with a different parallel layout or without it)")
        file_name, value = found
        file = self._file(file_name)

        def get(name):
            if name not in file.tensors:
                raise CheckpointError(f"{file.path}: object {sh_obj.unique_key} refers to missing tensor {name}")
            return file.get(name)

        return decode(value, get)

    # ------------------------------------------------------------------ tensors
    def load_tensor(self, sh_ten, into: torch.Tensor | None = None) -> torch.Tensor:
        """The data for one requested ShardedTensor, assembled from every saved shard it overlaps.

        ``into``: a contiguous CPU tensor of the requested shape and dtype to fill in place (the
        model parameter or optimizer state itself), saving a copy of every byte.
        """
        saved = self.shards.get(sh_ten.key)
        if not saved and sh_ten.key.startswith(MAIN_PARAM_PREFIX):
            # A run without fp32 main params (fp32 training without the distributed optimizer) saved
            # none: there the model weight *is* the main parameter, so it is the exact value.
            weights = self.shards.get(sh_ten.key[len(MAIN_PARAM_PREFIX):], [])
            saved = [s for s in weights if s.dtype == "float32"]
        if not saved:
            raise CheckpointError(f"{self.dir}: tensor {sh_ten.key} is not in the checkpoint")
        first = saved[0]
        saved_dtype = dtype_from_name(first.dtype)
        if saved_dtype != sh_ten.dtype:
            raise CheckpointError(f"{self.dir / first.file}: tensor {sh_ten.key} is {saved_dtype} in the checkpoint "
                                  f"but the model expects {sh_ten.dtype}")
        want_shape = tuple(sh_ten.global_shape)
        if first.global_shape != want_shape and not sh_ten.allow_shape_mismatch:
            raise CheckpointError(f"{self.dir / first.file}: tensor {sh_ten.key} has global shape {list(first.global_shape)} "
                                  f"in the checkpoint but the model expects {list(want_shape)}")
        box = _box_of(sh_ten)
        groups: dict[tuple, list[SavedShard]] = defaultdict(list)
        for shard in saved:
            if _intersect(shard.box, box) is not None:
                groups[shard.box].append(shard)
        flat = sh_ten.flattened_range
        # Expected coverage: the requested box inside the saved tensor's extent (smaller when padded).
        inside = _intersect(box, ((0,) * len(box[0]), first.global_shape))
        if flat is not None and all(k == box and all(s.flattened_range for s in g) for k, g in groups.items()):
            out, covered = self._fill_flat(groups.get(box, []), flat.start, flat.stop, sh_ten.dtype, into)
            expected = flat.stop - flat.start
        else:
            whole = into.view(box[1]) if into is not None and flat is None else None
            out, covered = self._fill_box(groups, box, sh_ten.dtype, zero=inside is None or inside[1] != box[1],
                                          out=whole)
            expected = 0 if inside is None else math.prod(inside[1])
            out = out.reshape(-1)[flat.start:flat.stop] if flat is not None else out.reshape(sh_ten.local_shape)
            if into is not None and whole is None:
                into.copy_(out)
                out = into
        if covered != expected:
            raise CheckpointError(self._coverage_error(sh_ten, covered, expected))
        return out

    def _fill_flat(self, pieces, start, stop, dtype, out=None):
        out = torch.empty(stop - start, dtype=dtype) if out is None else out
        covered = 0
        for piece in pieces:
            lo, hi = max(start, piece.flattened_range[0]), min(stop, piece.flattened_range[1])
            if hi > lo:
                src = self._file(piece.file).get(piece.name)
                out[lo - start:hi - start].copy_(src[lo - piece.flattened_range[0]:hi - piece.flattened_range[0]])
                covered += hi - lo
        return out, covered

    def _fill_box(self, groups, box, dtype, zero, out=None):
        origin, shape = box
        if out is None:
            out = (torch.zeros if zero else torch.empty)(shape, dtype=dtype)
        elif zero:
            out.zero_()
        covered = 0
        for saved_box, pieces in groups.items():
            overlap = _intersect(saved_box, box)
            if all(p.flattened_range is None for p in pieces):
                for piece in pieces:
                    src = self._file(piece.file).get(piece.name).reshape(piece.box_shape)
                    out[_slices(*overlap, origin)].copy_(src[_slices(*overlap, saved_box[0])])
                    covered += math.prod(overlap[1])
                continue
            if saved_box == box:  # same chunk, saved as flat pieces: fill it directly
                covered += self._fill_flat(pieces, 0, out.numel(), dtype, out=out.view(-1))[1]
                continue
            # Another chunk (the layout changed): rebuild it from its flat pieces, then copy the overlap.
            chunk = torch.empty(saved_box[1], dtype=dtype)
            filled = self._fill_flat(pieces, 0, chunk.numel(), dtype, out=chunk.view(-1))[1]
            if filled != chunk.numel():
                raise CheckpointError(f"{self.dir}: tensor {pieces[0].key}: the saved chunk at {list(saved_box[0])} "
                                      f"has {filled} of {chunk.numel()} elements (a rank file is missing data)")
            out[_slices(*overlap, origin)].copy_(chunk[_slices(*overlap, saved_box[0])])
            covered += math.prod(overlap[1])
        return out, covered

    def _coverage_error(self, sh_ten, covered, expected) -> str:
        where = ", ".join(f"{s.start}:{s.stop}" for s in _slices(*_box_of(sh_ten), (0,) * len(sh_ten.global_shape)))
        return (f"{self.dir}: tensor {sh_ten.key}: the checkpoint holds {covered} of the {expected} elements of "
                f"[{where}]" + ("" if sh_ten.flattened_range is None else
                                f" (flat {sh_ten.flattened_range.start}:{sh_ten.flattened_range.stop})"))

    # ------------------------------------------------------------------ metadata for Megatron's checks
    def sharded_metadata(self) -> dict:
        """Key -> data-less ShardedTensor / ShardedObject describing what is stored (for strictness checks)."""
        from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

        out = {}
        for key, saved in self.shards.items():
            first = saved[0]
            out[key] = ShardedTensor(key, None, dtype_from_name(first.dtype), first.global_shape, first.global_shape,
                                     (0,) * len(first.global_shape), None)
        for unique_key in self.objects:
            obj = ShardedObject.empty_from_unique_key(unique_key)
            out.setdefault(obj.key, obj)
        return out

    def close(self) -> None:
        for file in self._files.values():
            file.close()

