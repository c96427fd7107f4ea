"""Checkpoint formats and the checks a ``--load`` checkpoint passes before it is read."""
