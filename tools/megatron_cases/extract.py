"""Extract Megatron-LM's functional-test command lines into our own table, cases.json.

    python tools/megatron_cases/extract.py --repo /path/to/Megatron-LM --ref core_r0.19.0

Reads ``tests/functional_tests/test_cases/{gpt,moe}/*/model_config.yaml`` at ``--ref`` (with git, so
the checkout's work tree is not needed) and writes, per case: its MODE (pretraining, inference, rl),
TEST_TYPE, launcher, the environment variables it sets, and MODEL_ARGS (and MODEL_ARGS_2, the second
leg's flags, where a case has it) as the argv Megatron's ``_run_training.sh`` builds from them:
``true`` -> the flag alone, ``false``/empty -> omitted, ``[a, b]`` -> the flag then its values; and
the log checks of its AFTER_SCRIPT, by which Megatron's CI judges the cases that carry one. A case
with no MODEL_ARGS runs a script of its own instead (MODE ``own script``, its files listed).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

import yaml

OUT = Path(__file__).with_name("cases.json")
SUITES = ("gpt", "moe")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def argv_of(model_args: dict) -> list[str]:
    """MODEL_ARGS as the command line Megatron's functional tests launch."""
    argv: list[str] = []
    for flag, value in model_args.items():
        if value is True or value == "true":
            argv.append(flag)
        elif value is False or value is None or value == "" or value == "false":
            continue  # yq's `select(.value != "")` drops empty values; false flags are never passed
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        else:
            text = str(value).strip()
            if text.startswith("[") and text.endswith("]") and flag != "--moe-layer-freq":
                argv += [flag, *text[1:-1].split()]
            else:
                argv += [flag, text]
    return argv


def case_of(config: dict) -> dict:
    case = {
        "mode": config.get("MODE", "pretraining"),
        "test_type": str(config.get("TEST_TYPE", "regular")),
        "launcher": config.get("LAUNCHER", "torchrun"),
        "env": {k: str(v) for k, v in (config.get("ENV_VARS") or {}).items()},
        "argv": argv_of(config.get("MODEL_ARGS") or {}),
    }
    if "MODEL_ARGS_2" in config:
        case["argv_2"] = argv_of(config["MODEL_ARGS_2"] or {})
    if config.get("AFTER_SCRIPT"):
        case.update(after_script(config["AFTER_SCRIPT"]))
    return case


CHECK = re.compile(r"""^\s*(check_log|check_log_not)\s+(-[EF])\s+"(.*)"\s*$""")


def after_script(script: str) -> dict:
    """The log checks of a case's AFTER_SCRIPT (``check_log[_not] -F|-E "pattern"``), and whether it then
    sets ``EXIT_CODE=0``: such a case is judged by its log, whatever the training's exit code."""
    checks = []
    for line in script.splitlines():
        if match := CHECK.match(line):
            kind, mode, pattern = match.groups()
            checks.append({"present": kind == "check_log", "regex": mode == "-E",
                           "pattern": pattern.replace('\\"', '"')})
        elif line.strip() and not line.strip().startswith(("check_log()", "check_log_not()", "EXIT_CODE=")):
            raise ValueError(f"AFTER_SCRIPT line not understood: {line.strip()}")
    return {"log_checks": checks, "exit_code_ignored": any(l.strip() == "EXIT_CODE=0" for l in script.splitlines())}


def extract(repo: str, ref: str) -> dict:
    commit = git(repo, "rev-parse", f"{ref}^{{commit}}").strip()
    cases = {}
    for suite in SUITES:
        root = f"tests/functional_tests/test_cases/{suite}/"
        for path in git(repo, "ls-tree", "-r", "--name-only", commit, root).splitlines():
            if not path.endswith("/model_config.yaml"):
                continue
            name = path[len(root):-len("/model_config.yaml")]
            case = case_of(yaml.safe_load(git(repo, "show", f"{commit}:{path}")))
            if not case["argv"]:  # no command line: the case runs a script of its own from its folder
                folder = path[:-len("model_config.yaml")]
                case["mode"] = "own script"
                case["scripts"] = sorted(p[len(folder):] for p in git(repo, "ls-tree", "--name-only", commit, folder)
                                         .splitlines() if not p.endswith("model_config.yaml"))
            cases[f"{suite}/{name}"] = case
    return {"source": "NVIDIA/Megatron-LM tests/functional_tests/test_cases/{gpt,moe}/*/model_config.yaml",
            "branch": ref, "commit": commit, "cases": dict(sorted(cases.items()))}


def dumps(table: dict) -> str:
    """JSON with one case a line: small, and a diff shows which cases changed."""
    head = {k: v for k, v in table.items() if k != "cases"}
    rows = [f" {json.dumps(name)}: {json.dumps(case)}" for name, case in table["cases"].items()]
    return json.dumps(head, indent=1)[:-2] + ',\n "cases": {\n' + ",\n".join(rows) + "\n }\n}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="a Megatron-LM git checkout")
    parser.add_argument("--ref", default="core_r0.19.0")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    table = extract(args.repo, args.ref)
    Path(args.out).write_text(dumps(table))
    print(f"{len(table['cases'])} cases from {args.ref} ({table['commit'][:12]}) -> {args.out}")


if __name__ == "__main__":
    main()
