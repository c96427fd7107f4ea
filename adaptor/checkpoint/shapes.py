"""The global shape of every tensor a checkpoint directory records, in either format we load.

Loading checks (``--load`` against the model, a LoRA base against its adapters) compare these
with the shapes the run expects before any byte is read.
"""
from __future__ import annotations


def checkpoint_global_shapes(checkpoint_dir) -> dict:
    """Key -> global shape of every tensor in a torch_dist or safetensors checkpoint directory."""
    from adaptor.checkpoint import files

    if files.is_safetensors_checkpoint(checkpoint_dir):
        from adaptor.checkpoint.serialization import load_tensors_metadata

        return {key: tuple(t.global_shape) for key, t in load_tensors_metadata(checkpoint_dir).items()}
    from torch.distributed.checkpoint import FileSystemReader  # torch_dist: read as megatron-core validates it

    metadata = FileSystemReader(str(checkpoint_dir)).read_metadata().state_dict_metadata
    return {key: tuple(m.size) for key, m in metadata.items() if hasattr(m, "size")}
