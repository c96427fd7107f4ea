"""The code's layout holds: one feature per module, named like it (the import layers: test_import_layers.py);
importing our modules sets nothing up; features own their layer-spec swaps; one home for ADAPTOR_* variables.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest


from adaptor import bootstrap
from adaptor import env, layer_specs
from helpers.megatron_runs import side_by_side
from helpers.prefetch import prefetched

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``package``."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def test_every_feature_is_named_like_its_module_and_every_module_holds_one():
    registry = list(bootstrap.all_features())
    for feature in registry:
        module = type(feature).__module__
        assert module.startswith("patches."), module
        assert feature.name == module.rsplit(".", 1)[1], f"{type(feature).__name__} in {module} is named {feature.name!r}"
    owners = {type(f).__module__ for f in registry}
    modules = {m for m, p in _modules("patches").items() if p.name != "__init__.py"}
    assert modules == owners, f"modules without a registered feature: {sorted(modules - owners)}"


def test_every_feature_module_says_what_upstream_code_it_changes():
    for feature in bootstrap.all_features():
        doc = sys.modules[type(feature).__module__].__doc__ or ""
        assert len(doc.split()) >= 20, f"{type(feature).__module__}: docstring too short to say why"
        assert re.search(r"upstream|megatron\.|torch\.", doc, re.I), f"{type(feature).__module__} names no upstream code"


def _python(code: str, **extra_env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, ADAPTOR_QUIET="1", ADAPTOR_BACKEND="cpu", **extra_env)
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=300)


_LIBRARY_CHECK = ("import adaptor, torch, megatron.training.arguments as a\n"
                  "from adaptor import bootstrap, run_state\n"
                  "assert run_state.context() is None and len(bootstrap.patch_manager) == 0\n"
                  "assert not hasattr(a.validate_args, '__wrapped__')\n"
                  "assert run_state.backend().name == 'cpu'\n"
                  "print('unpatched')")
# The tool imports the libraries it uses: run it as a script on a missing directory (one-line error).
_CONVERSION_TOOL = ("import runpy, sys\n"
                    "sys.argv = ['convert_ckpt.py', '--load-model-type', 'hf', '--save-model-type', 'mg',\n"
                    "            '--load-dir', '/nonexistent/hf', '--save-dir', '/nonexistent/out', "
                    "'--model-type-hf', 'qwen3']\n"
                    "try:\n    runpy.run_path('tools/convert_ckpt.py', run_name='__main__')\n"
                    "except SystemExit as exit:\n    assert exit.code not in (0, None)\n")


@prefetched
def fresh_interpreters():
    """Each import order in a fresh interpreter (that is the point), two at a time."""
    jobs = {
        # One interpreter imports a feature module, then a library, then runs the conversion tool:
        # none of them may set the run up, so each later step also checks the earlier ones.
        "feature and library modules": lambda: _python(
            "import sys\nimport patches.fusions.rmsnorm as m\nfrom adaptor import bootstrap, run_state\n"
            "assert m.RmsNormFusion.name == 'rmsnorm'\n"
            "print('feature module:', run_state.is_set_up(), len(bootstrap.patch_manager))\n"
            "from adaptor.convert import Layout\n" + _CONVERSION_TOOL + _LIBRARY_CHECK),
        "library without torch": lambda: _python("import sys\nimport adaptor.checkpoint.files, adaptor.run_state\n"
                                                 "import adaptor.command_line.early_check\n"
                                                 "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))"),
        "training process": lambda: _python("import adaptor\nfrom adaptor import bootstrap\nassert len(bootstrap.patch_manager) > 10"),
    }
    return dict(zip(jobs, side_by_side(*jobs.values())))


def test_importing_a_module_of_ours_sets_nothing_up_and_library_modules_need_no_torch(fresh_interpreters):
    """Only the statement ``import adaptor`` sets a run up: a feature module or a library module
    imported on its own changes nothing, and the torch-free libraries stay torch-free."""
    proc = fresh_interpreters["feature and library modules"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "feature module: False 0" in proc.stdout.splitlines(), proc.stdout
    proc = fresh_interpreters["library without torch"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_library_mode_and_the_conversion_tool_patch_nothing(fresh_interpreters):
    proc = fresh_interpreters["feature and library modules"]
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "unpatched", (proc.stdout, proc.stderr[-2000:])
    # Control: a training process is patched.
    assert fresh_interpreters["training process"].returncode == 0, fresh_interpreters["training process"].stderr[-2000:]


def test_layer_spec_swaps_are_declared_by_the_features_that_cause_them():
    features = list(bootstrap.all_features())
    owners = {row[0]: f.name for f in features for row in f.module_swaps}
    assert owners == {"multi_latent_attention": "mla", "use_fused_rmsnorm": "rmsnorm",
                      "use_flash_attn": "flash_attention", "moe_grouped_gemm": "grouped_matmul",
                      "context_parallel_size>1": "context_parallel",
                      "batch_format.thd": "packed_sequences", "lora_r": "lora"}
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from adaptor.ops.flash_attention import FlashAttention
    from adaptor.ops.mla_attention import MLADotProductAttention

    mla = Namespace(multi_latent_attention=True, use_flash_attn=False)
    assert layer_specs.module_swaps(mla, features)[DotProductAttention] is MLADotProductAttention
    both = Namespace(multi_latent_attention=True, use_flash_attn=True)
    assert layer_specs.module_swaps(both, features)[DotProductAttention] is FlashAttention  # later feature wins
    assert layer_specs.module_swaps(Namespace(), features) == {}
    # LoRA swaps the parallel linears for ones that carry adapters where a target names them.
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    from adaptor.lora.layers import LoraColumnParallelLinear, LoraRowParallelLinear

    lora = layer_specs.module_swaps(Namespace(lora_r=8), features)
    assert lora[ColumnParallelLinear] is LoraColumnParallelLinear and lora[RowParallelLinear] is LoraRowParallelLinear
    # A size gate: on above the size only.
    assert layer_specs.module_swaps(Namespace(context_parallel_size=1), features) == {}
    assert layer_specs.module_swaps(Namespace(context_parallel_size=2), features)[DotProductAttention] is FlashAttention
    # Only enabled features' swaps count: a disabled feature's row is absent.
    assert layer_specs.module_swaps(both, [f for f in features if f.name != "flash_attention"])[
        DotProductAttention] is MLADotProductAttention


def test_every_adaptor_variable_is_declared_once_and_read_only_through_adaptor_env():
    used = set()
    for folder in ("adaptor", "patches", "tools", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh"):
                text = path.read_text()
                used.update(re.findall(r"\bADAPTOR_[A-Z0-9_]+", text))
                if folder in ("adaptor", "patches") and path.name != "env.py":
                    assert not re.search(r"environ(\.get)?[\[(]\s*[\"']ADAPTOR_", text), \
                        f"{path.relative_to(ROOT)} reads an ADAPTOR_ variable itself; use adaptor.env"
    assert used <= set(env.VARIABLES), f"undeclared: {sorted(used - set(env.VARIABLES))}"
    assert env.is_on("ADAPTOR_EARLY_CHECK", {}) and not env.is_on("ADAPTOR_QUIET", {})
    assert env.is_on("ADAPTOR_QUIET", {"ADAPTOR_QUIET": "1"}) and not env.is_on("ADAPTOR_EARLY_CHECK", {"ADAPTOR_EARLY_CHECK": "0"})


def test_code_and_docs_speak_of_the_product_only():
    pattern = re.compile(r"\bissue\s+#?\d+|\blent to this\b", re.I)
    offenders = []
    for folder in ("adaptor", "patches", "tools", "benchmarks", "examples", "docs", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".md", ".yaml") and "npu_standin" not in path.parts:
                offenders += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                              if pattern.search(line) and path.name != "test_layout.py"]
    for name in ("README.md", "pretrain_gpt.py", "pretrain_mm.py", "setup.py"):
        offenders += [f"{name}:{i}" for i, line in enumerate((ROOT / name).read_text().splitlines(), 1)
                      if pattern.search(line)]
    assert not offenders, offenders
