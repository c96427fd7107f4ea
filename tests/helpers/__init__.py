"""Code the tests share: launching runs and tools, one-line error checks, tiny Hugging Face checkpoints,
the torch_npu contract, and fixtures computed ahead of their tests.

Import as ``from helpers.megatron_runs import ...``: tests/conftest.py puts ``tests/`` on sys.path.
helpers.paths, helpers.processes and helpers.megatron_runs import neither torch nor megatron, so a child
script started with ``tests`` on its path may import them too.
"""
