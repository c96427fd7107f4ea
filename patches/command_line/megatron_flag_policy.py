"""Every Megatron flag is honoured, refused in one line, or said to be not applied: none is silent.

No upstream function is changed. Megatron's parser (``megatron.training.arguments``) accepts
flags that only programs other than ``pretrain_gpt.py`` read, or that only Transformer Engine,
apex or CUDA act on; given here they parsed and did nothing (``--sft``, ``--hybrid-context-parallel``,
``--fp8-format`` on the local layers ...). Before Megatron validates the arguments, this feature
looks up each flag the user gave, with a value other than Megatron's default, in
:data:`adaptor.command_line.flag_table.MEGATRON_FLAGS` (:mod:`adaptor.command_line.flag_policy` says how):

* refused: one line naming the flag and what to do, exit 2;
* not applied (a speed or memory switch of another backend): one printed line, and the value goes
  back to Megatron's default so that no half-supported path runs.
"""
from __future__ import annotations

from adaptor.features import ArgumentError, Feature
from adaptor.log import notice_once



class MegatronFlagPolicy(Feature):
    name = "megatron_flag_policy"

    def validate(self, args, ctx) -> None:
        from adaptor.command_line.flag_policy import judge, parser_defaults
        from adaptor.command_line.flag_table import MEGATRON_FLAGS

        if ctx.parser is None:
            return
        verdict = judge(args, ctx.parser, MEGATRON_FLAGS, ctx.explicit, ctx.backend.name)
        if verdict.refused:
            raise ArgumentError(verdict.refused[0])
        defaults = parser_defaults(ctx.parser)
        for dest, line in verdict.not_applied:
            setattr(args, dest, defaults[dest])
            notice_once(line)
