"""The code's layout holds: one feature per module, named like it; layers that import one way;
library mode patches nothing; features own their layer-spec swaps; one home for ADAPTOR_* variables.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

import adaptor
from adaptor import env, layer_specs
from helpers.megatron_runs import side_by_side

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


def _module_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules imported by statements that run when the module is imported (not inside a def).

    ``from pkg import mod`` counts as an import of ``pkg.mod`` only when that is a module.
    """
    is_package = path.name == "__init__.py"
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                subs = {f"{base}.{alias.name}" for alias in node.names}
                found.update(subs & known)
                if subs - known:
                    found.add(base)
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text()).body)
    return found


def test_every_feature_is_named_like_its_module_and_every_module_holds_one():
    registry = list(adaptor.feature_registry())
    for feature in registry:
        module = type(feature).__module__
        assert module.startswith("patches."), module
        assert feature.name == module.rsplit(".", 1)[1], f"{type(feature).__name__} in {module} is named {feature.name!r}"
    owners = {type(f).__module__ for f in registry}
    modules = {m for m, p in _modules("patches").items() if p.name != "__init__.py"}
    assert modules == owners, f"modules without a registered feature: {sorted(modules - owners)}"


def test_every_feature_module_says_what_upstream_code_it_changes():
    for feature in adaptor.feature_registry():
        doc = sys.modules[type(feature).__module__].__doc__ or ""
        assert len(doc.split()) >= 20, f"{type(feature).__module__}: docstring too short to say why"
        assert re.search(r"upstream|megatron\.|torch\.", doc, re.I), f"{type(feature).__module__} names no upstream code"


def test_the_machinery_never_imports_a_feature_and_module_imports_have_no_circle():
    modules = {**_modules("adaptor"), **_modules("patches")}
    graph = {}
    for name, path in modules.items():
        imported = _module_level_imports(path, name, set(modules))
        if name.startswith("adaptor") and name != "adaptor":
            assert not any(i == "patches" or i.startswith("patches.") for i in imported), \
                f"{name} imports a feature module"
        graph[name] = {i for i in imported if i in modules and i != name}
    # Depth-first search for a cycle among module-level imports.
    state: dict[str, int] = {}

    def walk(node, trail):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                walk(nxt, trail + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            walk(node, [node])


def _python(code: str, **extra_env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, ADAPTOR_QUIET="1", ADAPTOR_BACKEND="cpu", **extra_env)
    environ.pop("ADAPTOR_PATCH", None) if "ADAPTOR_PATCH" not in extra_env else None
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=300)


_LIBRARY_CHECK = ("import adaptor, torch, megatron.training.arguments as a\n"
                  "assert adaptor.context is None and len(adaptor.patch_manager) == 0\n"
                  "assert not hasattr(a.validate_args, '__wrapped__')\n"
                  "assert adaptor.backend.name == 'cpu'\n"
                  "print('unpatched')")
# The tool sets library mode itself: run it as a script on a missing directory (one-line error).
_CONVERSION_TOOL = ("import runpy, sys\n"
                    "sys.argv = ['convert_ckpt.py', '--load-model-type', 'hf', '--save-model-type', 'mg',\n"
                    "            '--load-dir', '/nonexistent/hf', '--save-dir', '/nonexistent/out', "
                    "'--model-type-hf', 'qwen3']\n"
                    "try:\n    runpy.run_path('tools/convert_ckpt.py', run_name='__main__')\n"
                    "except SystemExit as exit:\n    assert exit.code not in (0, None)\n")


@pytest.fixture(scope="module")
def fresh_interpreters():
    """Each import order in a fresh interpreter (that is the point), two at a time."""
    jobs = {
        "feature module first": lambda: _python("import patches.fusions.rmsnorm as m, adaptor\n"
                                                "assert m.RmsNormFusion.name == 'rmsnorm'\n"
                                                "print(len(adaptor.patch_manager))"),
        "library mode": lambda: _python("from adaptor.convert import Layout\n" + _LIBRARY_CHECK, ADAPTOR_PATCH="0"),
        "conversion tool": lambda: _python(_CONVERSION_TOOL + _LIBRARY_CHECK),
        "training process": lambda: _python("import adaptor\nassert len(adaptor.patch_manager) > 10"),
    }
    return dict(zip(jobs, side_by_side(*jobs.values())))


def test_a_feature_module_imported_first_sets_the_run_up_completely(fresh_interpreters):
    proc = fresh_interpreters["feature module first"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > 10


def test_library_mode_and_the_conversion_tool_patch_nothing(fresh_interpreters):
    for name in ("library mode", "conversion tool"):
        proc = fresh_interpreters[name]
        assert proc.returncode == 0 and "unpatched" in proc.stdout, (name, proc.stderr[-2000:])
    # Control: a training process is patched.
    assert fresh_interpreters["training process"].returncode == 0, fresh_interpreters["training process"].stderr[-2000:]


def test_layer_spec_swaps_are_declared_by_the_features_that_cause_them():
    features = list(adaptor.feature_registry())
    owners = {row[0]: f.name for f in features for row in f.module_swaps}
    assert owners == {"multi_latent_attention": "mla", "use_fused_rmsnorm": "rmsnorm",
                      "use_flash_attn": "flash_attention", "moe_grouped_gemm": "grouped_matmul",
                      "context_parallel_size>1": "context_parallel",
                      "dataloader_inter_document_masking": "packed_sequences", "lora_r": "lora"}
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
    assert env.is_on("ADAPTOR_PATCH", {}) and not env.is_on("ADAPTOR_QUIET", {})
    assert env.is_on("ADAPTOR_QUIET", {"ADAPTOR_QUIET": "1"}) and not env.is_on("ADAPTOR_PATCH", {"ADAPTOR_PATCH": "0"})


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
