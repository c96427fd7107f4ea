"""What ``evaluation.py`` runs: lm-eval's harness over the Megatron model.

lm-eval is an optional dependency (``pip install -e ".[eval]"``); nothing on a training path imports
it. :mod:`adaptor.evaluation.scoring` scores token sequences through Megatron's forward-only schedule
(TP, PP), :mod:`adaptor.evaluation.lm` is the ``lm_eval.api.model.LM`` that lm-eval drives, and
:mod:`adaptor.evaluation.tasks` resolves task names (lm-eval's, ``--include-path``'s, and the local
MMLU layout of :mod:`adaptor.evaluation.mmlu`).
"""
from __future__ import annotations


def running_evaluation() -> None:
    """Mark this process as evaluation.py before Megatron parses: its flags are read by that entry only."""
    from adaptor.inference import ENTRY

    ENTRY["evaluation"] = True


def import_lm_eval():
    """lm-eval's package, or one line that says how to install it."""
    try:
        import lm_eval  # noqa: F401
        import lm_eval.evaluator  # noqa: F401
    except ImportError:
        from adaptor.errors import fail

        fail('evaluation.py needs lm-eval, which is not installed: pip install -e ".[eval]"')
    return lm_eval
