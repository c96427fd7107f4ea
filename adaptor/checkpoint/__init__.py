"""Sharded training checkpoints in safetensors (``--ckpt-format safetensors``).

``serialization`` has ``save``/``load`` with megatron.core.dist_checkpointing's signatures;
``files`` the directory layout and atomic commit; ``shard_table`` what each rank file holds (read
without torch); ``writer``/``reader`` the per-rank files and resharding reads; ``object_codec``
non-tensor state without pickle; ``validation`` the sharding checks for flattened optimizer
shards; ``retention`` ``--keep-checkpoint-max``; ``global_names``, ``consolidated`` and ``consolidated_dirs``
the whole tensors ``tools/safetensors_ckpt.py`` merges and splits. Below
:mod:`adaptor.convert`, which imports this package and is never imported by it.
"""
