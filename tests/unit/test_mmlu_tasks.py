"""--task mmlu --task-data-path: MMLU's CSV files become lm-eval tasks with lm-eval's MMLU prompt.

The CSV reader refuses malformed rows in one sentence; the written tasks are loaded by lm-eval's own
TaskManager (no model), and the prompt it builds for a row, with one dev example in front, is the text
docs/evaluation.md promises.
"""
from __future__ import annotations

import pytest

from adaptor.evaluation import mmlu

ROWS = ('"What is 2+2?",3,4,5,6,B\n'
        '"Which is a colour?",red,run,rapid,rain,A\n')
DEV = '"What is 1+1?",2,3,4,5,A\n'


def write_layout(root, nested: bool):
    test_dir, dev_dir = (root / "test", root / "dev") if nested else (root, root)
    test_dir.mkdir(parents=True, exist_ok=True)
    dev_dir.mkdir(parents=True, exist_ok=True)
    (test_dir / "basic_maths_test.csv").write_text(ROWS)
    (dev_dir / "basic_maths_dev.csv").write_text(DEV)


def test_rows_become_question_choices_and_answer_index(tmp_path):
    write_layout(tmp_path, nested=False)
    rows = mmlu.read_rows(tmp_path / "basic_maths_test.csv")
    assert rows[0] == {"question": "What is 2+2?", "choices": ["3", "4", "5", "6"], "answer": 1}
    assert rows[1]["answer"] == 0


@pytest.mark.parametrize("text,message", [
    ("q,a,b,c,D\n", "row 1: 5 columns, not 6"),
    ("q,a,b,c,d,E\n", "row 1: answer 'E' is not one of A, B, C, D"),
    ("", "no rows"),
])
def test_bad_rows_are_one_sentence(tmp_path, text, message):
    path = tmp_path / "x_test.csv"
    path.write_text(text)
    with pytest.raises(mmlu.MmluDataError, match=message):
        mmlu.read_rows(path)


def test_no_test_files_is_one_sentence(tmp_path):
    with pytest.raises(mmlu.MmluDataError, match="no <subject>_test.csv files"):
        mmlu.find_subjects(tmp_path)


@pytest.mark.parametrize("nested", [False, True])
def test_lm_eval_loads_the_tasks_with_mmlus_prompt(tmp_path, monkeypatch, nested):
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_layout(tmp_path / "data", nested)
    group = mmlu.write_tasks(tmp_path / "data", tmp_path / "tasks")
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)  # self-contained files
    assert group == "mmlu_local" and "mmlu_local_basic_maths" in manager.all_tasks
    task = manager.load_task_or_group(["mmlu_local_basic_maths"])["mmlu_local_basic_maths"]
    docs = list(task.test_docs())
    assert len(docs) == 2 and task.doc_to_target(docs[0]) == 1
    assert task.doc_to_choice(docs[0]) == ["A", "B", "C", "D"]
    task.set_config("num_fewshot", 1)
    context = task.fewshot_context(docs[0], num_fewshot=1)
    assert context == ("The following are multiple choice questions (with answers) about basic maths.\n\n"
                       "What is 1+1?\nA. 2\nB. 3\nC. 4\nD. 5\nAnswer: A\n\n"
                       "What is 2+2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:")


def test_local_tasks_are_indexed_without_lm_evals_own(tmp_path):
    """evaluation.py indexes only --include-path (and the local MMLU) when they define every task asked for;
    a group with a member defined elsewhere, or an unknown name, needs lm-eval's whole index."""
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from adaptor.evaluation.tasks import _local_manager

    write_layout(tmp_path / "data", False)
    group = mmlu.write_tasks(tmp_path / "data", tmp_path / "tasks")
    (tmp_path / "tasks" / "mixed.yaml").write_text("group: mixed\ntask:\n  - mmlu_local_basic_maths\n  - hellaswag\n")
    paths = [str(tmp_path / "tasks")]
    manager = _local_manager(TaskManager, paths, [group, "mmlu_local_basic_maths"])
    assert manager is not None and "hellaswag" not in manager.all_tasks
    assert _local_manager(TaskManager, paths, ["mixed"]) is None  # hellaswag is lm-eval's
    assert _local_manager(TaskManager, paths, ["no_such_task"]) is None
    assert _local_manager(TaskManager, [], [group]) is None
