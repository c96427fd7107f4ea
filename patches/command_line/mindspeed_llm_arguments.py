"""MindSpeed-LLM's command lines for Qwen3 (dense and MoE) and DeepSeek-V3 run unchanged.

No upstream function is changed. Before features are chosen and Megatron parses the command line,
``rewrite_argv`` turns MindSpeed-LLM's spellings into Megatron's with the tables of
:mod:`adaptor.command_line.mindspeed_llm` (renamed flags and values, settings computed from several flags,
Ascend-only speed switches dropped, changes we do not compute refused). The run prints every
rewrite once and refuses in one line, so nothing happens silently.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.command_line.mindspeed_llm import Rewrite, rewrite_pretrain_argv
from adaptor.log import notice_once



class MindSpeedLlmArguments(Feature):
    name = "mindspeed_llm_arguments"

    def __init__(self) -> None:
        self.rewrite: Rewrite | None = None

    def rewrite_argv(self, argv: list[str]) -> list[str]:
        self.rewrite = rewrite_pretrain_argv(argv)
        return self.rewrite.argv

    def set_defaults(self, args, ctx) -> None:
        if self.rewrite is None:
            return
        for note in self.rewrite.notes:
            notice_once(note)  # Megatron may parse the arguments twice

    def validate(self, args, ctx) -> None:
        if self.rewrite is not None and self.rewrite.refused:
            raise ArgumentError(self.rewrite.refused[0])
