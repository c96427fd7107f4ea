"""Task names to lm-eval tasks: lm-eval's own, ``--include-path``'s YAML files, and local MMLU.

Names are checked before the model is built, so a misspelt task costs a second, not a checkpoint load.
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from adaptor.evaluation import mmlu


class TaskError(ValueError):
    """A task that cannot be run, said in one sentence."""


def resolve(names: list[str], include_path: str | None, task_data_path: str | None):
    """(lm-eval's TaskManager, the task names to run). ``mmlu`` with ``--task-data-path`` becomes the
    local MMLU group (:mod:`adaptor.evaluation.mmlu`); MMLU from the hub is not reachable offline, so
    ``mmlu`` without it is refused."""
    from lm_eval.tasks import TaskManager

    paths = [include_path] if include_path else []
    wanted = list(names)
    if "mmlu" in wanted:
        if task_data_path is None:
            raise TaskError("--task mmlu reads local CSV files: give --task-data-path DIR "
                            "(<subject>_test.csv and <subject>_dev.csv, rows question,A,B,C,D,answer)")
        out = Path(tempfile.mkdtemp(prefix="adaptor-mmlu-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)  # lm-eval reads it until the end
        try:
            group = mmlu.write_tasks(Path(task_data_path), out)
        except (mmlu.MmluDataError, OSError) as exc:
            raise TaskError(str(exc)) from None
        paths.append(str(out))
        wanted = [group if n == "mmlu" else n for n in wanted]
    elif task_data_path is not None:
        raise TaskError("--task-data-path is read for --task mmlu only; for other local tasks give "
                        "--include-path DIR (lm-eval task YAML files)")
    manager = TaskManager(include_path=paths or None)
    unknown = [n for n in wanted if n not in manager.all_tasks]
    if unknown:
        where = f" or in --include-path {include_path}" if include_path else ""
        raise TaskError(f"--task {unknown[0]} is not an lm-eval task{where}")
    return manager, wanted
