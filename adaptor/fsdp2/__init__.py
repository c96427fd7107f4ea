"""FSDP2 (``--use-torch-fsdp2``): the YAML configuration, the sharding plan and the model wrapper.

``config`` reads and checks ``--fsdp2-config-path``; ``patterns`` matches module names;
``plan`` decides units, ignored and recomputed modules for a built model; ``recompute`` is the
activation checkpointing; ``wrapper`` is the data-parallel module Megatron's ``get_model`` builds.
``patches/fsdp2/torch_fsdp2.py`` joins them to Megatron.
"""
