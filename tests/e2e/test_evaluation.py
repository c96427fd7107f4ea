"""evaluation.py: lm-eval's scores from the Megatron model equal lm-eval's own ``hf`` backend on the same weights.

A tiny random Qwen3 (tests/helpers/hf_fixtures.py, fp32, the sample tokenizer's vocabulary) is read
through --hf-load-dir. Local tasks, written by the test (no download), cover lm-eval's three request
types: a multiple-choice set (tools/make_mc_task.py; ``loglikelihood``), a short greedy completion
(``generate_until``) and a perplexity task (``loglikelihood_rolling``); and ``--task mmlu`` reads two
subjects from MMLU's CSV layout (--task-data-path), which the reference reads through the task files
adaptor.evaluation.mmlu writes. evaluation.py runs
them at TP1, TP2 and PP2 with --micro-batch-size 3 (requests of different lengths padded together),
and lm-eval's ``hf`` model (``pretrained=<hf dir>``, cpu, float32) runs them in this process.

Equal means: every choice's log-likelihood within ``TOL`` and the same accuracy; the same generated
text; the same perplexities within ``REL``. Both sides compute in fp32 with different kernels and
summation orders (Megatron's attention and fused QKV against transformers' eager attention): one
token's log-probability differs by a few ULPs of values near 10 (about 1e-6), and a choice sums a few
tokens, so 1e-4 is two orders above what is seen (4e-6) and still far below the gap between choices a
wrong implementation makes (a position off by one, a missing token, the padded vocabulary in the
softmax: all change a log-likelihood by more than 1e-2).
"""
from __future__ import annotations

import json
import math
import os

import pytest

from helpers.hf_fixtures import make_tiny_qwen3
from helpers.megatron_runs import SAMPLE_TOKENIZER, launch, side_by_side, tail
from helpers.one_line_errors import assert_one_line_error, run_python
from helpers.processes import import_tool

write_task = import_tool("make_mc_task").write_task

TOL = 1e-4
REL = 1e-5
TASKS = ["sample_mc", "sample_gen", "sample_ppl"]
MMLU_SUBJECTS = ["mmlu_local_basic_maths", "mmlu_local_geography"]
TEXTS = ["The river ran past the old mill and into the harbour.", "Seven plus five is twelve.",
         "A lantern hung by the window of the market all night long, and nobody came."]


def _write_tasks(directory):
    write_task(directory, "sample_mc", count=12)
    data = directory / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t, "prompt": t[:20]}) + "\n" for t in TEXTS))
    common = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test",
              "metadata": {"version": 1.0}}
    gen = {"task": "sample_gen", **common, "output_type": "generate_until", "doc_to_text": "{{prompt}}",
           "doc_to_target": "{{text}}", "generation_kwargs": {"until": ["."], "max_gen_toks": 8, "do_sample": False},
           "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}
    ppl = {"task": "sample_ppl", **common, "output_type": "loglikelihood_rolling", "doc_to_text": "",
           "doc_to_target": "{{text}}",
           "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}]}
    for config in (gen, ppl):
        (directory / f"{config['task']}.yaml").write_text(json.dumps(config))


def _write_mmlu(directory):
    """Two subjects in the release's layout (test/ and dev/ folders, no header)."""
    (directory / "test").mkdir(parents=True)
    (directory / "dev").mkdir()
    (directory / "test" / "basic_maths_test.csv").write_text(
        '"What is 2+2?",3,4,5,6,B\n"Which is a colour?",red,run,rapid,rain,A\n"Pick the largest",1,9,3,2,B\n')
    (directory / "dev" / "basic_maths_dev.csv").write_text('"What is 1+1?",2,3,4,5,A\n')
    (directory / "test" / "geography_test.csv").write_text(
        '"Capital of France?",Rome,Paris,Oslo,Lima,B\n"Opposite of hot?",cold,warm,big,far,A\n')


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The HF directory, the task directory, the model flags, and the environment of every run."""
    from transformers import AutoTokenizer

    import adaptor  # noqa: F401  (before patches: it registers them)
    from adaptor.convert.config_check import model_flags

    root = tmp_path_factory.mktemp("evaluation")
    tokenizer = AutoTokenizer.from_pretrained(str(SAMPLE_TOKENIZER))
    hf_dir = make_tiny_qwen3(root / "qwen3", vocab_size=len(tokenizer), seed=3)
    tasks = root / "tasks"
    tasks.mkdir()
    _write_tasks(tasks)
    _write_mmlu(root / "mmlu")
    flags = model_flags("qwen3", json.loads((hf_dir / "config.json").read_text()))
    flags += ["--seq-length", "64", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
              str(SAMPLE_TOKENIZER), "--disable-jit-fuser"]
    env = {"HF_DATASETS_CACHE": str(root / "datasets"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return hf_dir, tasks, flags, env


def evaluate(setup, out, nproc=1, layout=()):
    hf_dir, tasks, flags, env = setup
    run = launch("evaluation.py", [*flags, "--hf-load-dir", str(hf_dir), "--include-path", str(tasks),
                                   "--task", *TASKS, "mmlu", "--task-data-path", str(tasks.parent / "mmlu"),
                                   "--micro-batch-size", "3", "--eval-output-file", str(out),
                                   *layout], nproc=nproc, env=env)
    assert run.returncode == 0, tail(run.output)
    return json.loads(out.read_text())


def hf_reference(setup):
    """lm-eval's own hf backend on the same directory, in this process."""
    import os

    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    from adaptor.evaluation.mmlu import write_tasks as write_mmlu_tasks

    hf_dir, tasks, _, env = setup
    os.environ.update(env)
    mmlu_tasks = tasks.parent / "mmlu_tasks"
    group = write_mmlu_tasks(tasks.parent / "mmlu", mmlu_tasks)
    results = evaluator.simple_evaluate(
        model="hf", model_args={"pretrained": str(hf_dir), "tokenizer": str(SAMPLE_TOKENIZER), "dtype": "float32",
                                "device": "cpu"},
        tasks=[*TASKS, group], batch_size=3,
        # the same task files evaluation.py indexes (lm-eval's own ~15,000 are not needed: 7 s per index)
        task_manager=TaskManager(include_path=[str(tasks), str(mmlu_tasks)], include_defaults=False),
        log_samples=True)
    return {"results": results["results"],
            "samples": {task: [{"doc_id": d["doc_id"], "responses": d["filtered_resps"]} for d in docs]
                        for task, docs in results["samples"].items()}}


def by_doc(record, task):
    return [d["responses"] for d in sorted(record["samples"][task], key=lambda d: d["doc_id"])]


def assert_same(ours, reference):
    for task, count in (("sample_mc", 12), (MMLU_SUBJECTS[0], 3), (MMLU_SUBJECTS[1], 2)):
        mc, ref_mc = by_doc(ours, task), by_doc(reference, task)
        assert len(mc) == len(ref_mc) == count
        for doc, ref_doc in zip(mc, ref_mc):
            assert len(doc) == len(ref_doc) == 4
            for (ll, greedy), (ref_ll, ref_greedy) in zip(doc, ref_doc):
                assert abs(ll - ref_ll) < TOL, (task, doc, ref_doc)
                assert bool(greedy) == bool(ref_greedy)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["sample_mc"][metric] == reference["results"]["sample_mc"][metric]
    for task in ("mmlu_local", *MMLU_SUBJECTS):
        assert ours["results"][task]["acc,none"] == reference["results"][task]["acc,none"], task
    assert by_doc(ours, "sample_gen") == by_doc(reference, "sample_gen")
    assert all(text[0] for text in by_doc(ours, "sample_gen"))  # something was generated
    for metric in ("word_perplexity,none", "byte_perplexity,none"):
        ppl, ref = ours["results"]["sample_ppl"][metric], reference["results"]["sample_ppl"][metric]
        assert math.isfinite(ppl) and abs(ppl - ref) <= REL * ref, (metric, ppl, ref)


def test_scores_equal_lm_evals_hf_backend_at_tp1_tp2_pp2(setup, tmp_path):
    tp1, reference = side_by_side(lambda: evaluate(setup, tmp_path / "tp1.json"), lambda: hf_reference(setup))
    assert_same(tp1, reference)
    tp2, pp2 = side_by_side(lambda: evaluate(setup, tmp_path / "tp2.json", 2, ["--tensor-model-parallel-size", "2"]),
                            lambda: evaluate(setup, tmp_path / "pp2.json", 2, ["--pipeline-model-parallel-size", "2"]))
    assert_same(tp2, reference)
    assert_same(pp2, reference)


def test_chat_template_requests_equal_lm_evals_hf_backend(setup, tmp_path):
    """--hf-chat-template (MindSpeed-LLM's switch for instruction-tuned models): lm-eval renders every
    request through the tokenizer's chat template, on both sides; the same log-likelihoods (TOL) and the same
    generations as the hf backend with apply_chat_template=True."""
    hf_dir, tasks, flags, env = setup

    def ours():
        out = tmp_path / "chat.json"
        run = launch("evaluation.py", [*flags, "--hf-load-dir", str(hf_dir), "--include-path", str(tasks), "--task",
                                       "sample_mc", "sample_gen", "--micro-batch-size", "3", "--hf-chat-template",
                                       "--eval-output-file", str(out)], env=env)
        assert run.returncode == 0, tail(run.output)
        return json.loads(out.read_text())

    def reference():
        from lm_eval import evaluator
        from lm_eval.tasks import TaskManager

        os.environ.update(env)
        results = evaluator.simple_evaluate(
            model="hf", model_args={"pretrained": str(hf_dir), "tokenizer": str(SAMPLE_TOKENIZER), "dtype": "float32",
                                    "device": "cpu"},
            tasks=["sample_mc", "sample_gen"], batch_size=3,
            task_manager=TaskManager(include_path=[str(tasks)], include_defaults=False),
            log_samples=True, apply_chat_template=True)
        return {"samples": {task: [{"doc_id": d["doc_id"], "responses": d["filtered_resps"],
                                    "arguments": d["arguments"]} for d in docs]
                            for task, docs in results["samples"].items()}}

    mine, theirs = side_by_side(ours, reference)
    assert "<|im_start|>" in str(theirs["samples"]["sample_mc"][0]["arguments"])  # rendered as a conversation
    for doc, ref_doc in zip(by_doc(mine, "sample_mc"), by_doc(theirs, "sample_mc"), strict=True):
        for (ll, greedy), (ref_ll, ref_greedy) in zip(doc, ref_doc, strict=True):
            assert abs(ll - ref_ll) < TOL and bool(greedy) == bool(ref_greedy), (doc, ref_doc)
    assert by_doc(mine, "sample_gen") == by_doc(theirs, "sample_gen")


def _bad(setup, tmp_path, extra):
    hf_dir, tasks, flags, env = setup
    return run_python([*flags, *extra], tmp_path, script="evaluation.py", **env)


def test_unknown_task_is_one_line(setup, tmp_path):
    hf_dir, tasks, _, _ = setup
    run = _bad(setup, tmp_path, ["--hf-load-dir", str(hf_dir), "--include-path", str(tasks), "--task", "no_such_task"])
    assert_one_line_error(run, ["--task no_such_task", "not an lm-eval task"], torchrun=False)


def test_missing_checkpoint_is_one_line(setup, tmp_path):
    _, tasks, _, _ = setup
    run = _bad(setup, tmp_path, ["--load", str(tmp_path / "no_such_ckpt"), "--include-path", str(tasks),
                                 "--task", "sample_mc"])
    assert_one_line_error(run, ["--load", "no_such_ckpt"], torchrun=False)


def test_mmlu_without_data_path_is_one_line(setup, tmp_path):
    hf_dir, _, _, _ = setup
    run = _bad(setup, tmp_path, ["--hf-load-dir", str(hf_dir), "--task", "mmlu"])
    assert_one_line_error(run, ["--task mmlu", "--task-data-path"], torchrun=False)


def test_without_lm_eval_is_one_line_saying_how_to_install(setup, tmp_path):
    """An lm_eval package that cannot be imported (first on the path, as a broken or absent install
    looks to Python) stops evaluation.py with the install command, not a traceback."""
    hf_dir, tasks, flags, env = setup
    broken = tmp_path / "site" / "lm_eval"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('No module named lm_eval')\n")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    run = run_python([*flags, "--hf-load-dir", str(hf_dir), "--include-path", str(tasks), "--task", "sample_mc"],
                     tmp_path, script="evaluation.py", warm=False, PYTHONPATH=path, **env)
    assert_one_line_error(run, ['pip install -e ".[eval]"'], torchrun=False)
