"""MMLU from local CSV files (``--task mmlu --task-data-path DIR``): MindSpeed-LLM's layout, lm-eval's prompt.

The MMLU release ships one CSV per subject and split, ``<subject>_test.csv`` and ``<subject>_dev.csv``
(under ``DIR`` or in its ``test/`` and ``dev/`` folders), rows ``question,A,B,C,D,answer`` with no
header, ``answer`` one of the letters. lm-eval's own ``mmlu`` task reads the same questions from the
Hugging Face hub, which an offline machine cannot reach; so each subject becomes a local lm-eval task
with the prompt lm-eval's ``mmlu`` uses (the subject in a one-line description, the question, the four
lettered choices, ``Answer:``; the choices scored are the letters), few-shot examples taken in order
from the subject's dev split, and one group over them whose accuracy is weighted by subject size.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

LETTERS = ("A", "B", "C", "D")
GROUP = "mmlu_local"


class MmluDataError(ValueError):
    """A problem with the CSV files, said in one sentence."""


def read_rows(path: Path) -> list[dict]:
    """One subject's split: ``{"question", "choices", "answer"}`` per row, ``answer`` the choice's index."""
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        for number, fields in enumerate(csv.reader(handle), 1):
            if not fields:
                continue
            if len(fields) != 6:
                raise MmluDataError(f"{path}, row {number}: {len(fields)} columns, not 6 "
                                    f"(question,A,B,C,D,answer)")
            answer = fields[5].strip()
            if answer not in LETTERS:
                raise MmluDataError(f"{path}, row {number}: answer {answer!r} is not one of A, B, C, D")
            rows.append({"question": fields[0], "choices": fields[1:5], "answer": LETTERS.index(answer)})
    if not rows:
        raise MmluDataError(f"{path}: no rows")
    return rows


def find_subjects(directory: Path) -> dict[str, tuple[Path, Path | None]]:
    """subject -> (its test CSV, its dev CSV or None), from ``directory`` and the folders under it."""
    tests = {p.name[: -len("_test.csv")]: p for p in sorted(directory.rglob("*_test.csv"))}
    devs = {p.name[: -len("_dev.csv")]: p for p in sorted(directory.rglob("*_dev.csv"))}
    if not tests:
        raise MmluDataError(f"--task-data-path {directory}: no <subject>_test.csv files there")
    return {subject: (test, devs.get(subject)) for subject, test in tests.items()}


def _task_config(subject: str, test: Path, dev: Path | None) -> dict:
    files = {"test": str(test)}
    if dev is not None:
        files["dev"] = str(dev)
    config = {
        "task": f"{GROUP}_{subject}",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": files},
        "test_split": "test",
        "output_type": "multiple_choice",
        "description": f"The following are multiple choice questions (with answers) about "
                       f"{subject.replace('_', ' ')}.\n\n",
        "doc_to_text": "{{question.strip()}}\n" + "".join(
            f"{letter}. {{{{choices[{i}]}}}}\n" for i, letter in enumerate(LETTERS)) + "Answer:",
        "doc_to_choice": list(LETTERS),
        "doc_to_target": "answer",
        "target_delimiter": " ",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    if dev is not None:
        config["fewshot_split"] = "dev"
        config["fewshot_config"] = {"sampler": "first_n"}
    return config


def write_tasks(directory: Path, out: Path) -> str:
    """Convert ``directory``'s CSVs to JSON lines under ``out`` and write one lm-eval task per subject and
    their group there (YAML files; JSON is YAML). Returns the group's name."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for subject, (test, dev) in find_subjects(directory).items():
        converted = []
        for split, path in (("test", test), ("dev", dev)):
            if path is None:
                converted.append(None)
                continue
            target = out / f"{subject}_{split}.jsonl"
            target.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in read_rows(path)),
                              encoding="utf-8")
            converted.append(target)
        config = _task_config(subject, converted[0], converted[1])
        (out / f"{config['task']}.yaml").write_text(json.dumps(config, indent=1), encoding="utf-8")
        names.append(config["task"])
    group = {"group": GROUP, "task": names,
             "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": True}],
             "metadata": {"version": 1.0}}
    (out / f"{GROUP}.yaml").write_text(json.dumps(group, indent=1), encoding="utf-8")
    return GROUP
