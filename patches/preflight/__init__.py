"""Checks of every file and directory a run reads or writes, made on every rank before the first step."""
