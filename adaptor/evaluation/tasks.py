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
    manager = _local_manager(TaskManager, paths, wanted) or TaskManager(include_path=paths or None)
    unknown = [n for n in wanted if n not in manager.all_tasks]
    if unknown:
        where = f" or in --include-path {include_path}" if include_path else ""
        raise TaskError(f"--task {unknown[0]} is not an lm-eval task{where}")
    return manager, wanted


def _local_manager(task_manager, paths: list[str], wanted: list[str]):
    """A TaskManager over ``paths`` alone when they define every wanted task, else None.

    Indexing lm-eval's own ~15,000 task files takes about 7 s on every rank; tasks from --include-path or
    the local MMLU do not need them. Names found there win over lm-eval's anyway (include paths override
    the defaults), so the tasks are the same. A tag, or a group with a member defined elsewhere, needs the
    whole index.
    """
    if not paths:
        return None
    manager = task_manager(include_path=paths, include_defaults=False)
    index = getattr(manager, "task_index", {})
    subtasks, groups = set(manager.all_subtasks), set(manager.all_groups)

    def local(name: str, seen: frozenset = frozenset()) -> bool:
        if name in subtasks:
            return True
        if name not in groups or name in seen:
            return False
        cfg = getattr(index.get(name), "cfg", None)  # lm-eval >= 0.4.10 keeps each group's YAML
        if not isinstance(cfg, dict):
            return False
        members = cfg.get("task", [])
        members = members if isinstance(members, list) else [members]
        return all(isinstance(m, dict) or (isinstance(m, str) and local(m, seen | {name})) for m in members)

    return manager if all(local(n) for n in wanted) else None
