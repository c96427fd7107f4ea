"""The layers hold: entry files and tools -> ``patches/`` (the features) -> ``adaptor/`` (the library).

Read from the source, not from a running process, so an import inside a function counts as much as
one at the top of a module: a circle that only closes at run time is still a knot the next feature
trips over. Rules:

* nothing in ``adaptor/`` imports ``patches/``, except ``adaptor.bootstrap``, which takes the
  feature list when ``import adaptor`` sets a training run up (the one bootstrap edge);
* a feature module imports no other feature module (the registry ``patches/__init__`` lists them);
* an entry file or a tool imports no feature module;
* no import circle among our modules, at module level or inside functions.

Importing ``adaptor.x`` also runs the package ``__init__``; that edge is Python's, not ours, and
``adaptor/__init__`` imports nothing unless it is the bootstrap statement, so parent packages are
not counted as imports.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP_EDGE = ("adaptor.bootstrap", "patches")


def our_modules() -> dict[str, Path]:
    """Dotted name -> file for adaptor/, patches/, the entry files and tools/ (as ``tools.<name>``)."""
    paths = [*ROOT.glob("adaptor/**/*.py"), *ROOT.glob("patches/**/*.py"), *ROOT.glob("*.py"), *ROOT.glob("tools/*.py")]
    out = {}
    for path in sorted(paths):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, str]:
    """Our modules that ``name`` imports -> ``"module"`` or ``"function"`` (inside a def only)."""
    is_package = path.name == "__init__.py"
    found: dict[str, str] = {}

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def add(target: str | None, where: str) -> None:
        if target and target != name and found.get(target) != "module":
            found[target] = where

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = "function" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else where
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(resolve(alias.name), inner)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = name.split(".")[: len(name.split(".")) - child.level + (1 if is_package else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:  # ``from pkg import mod`` imports pkg.mod when it is a module
                    full = f"{base}.{alias.name}"
                    add(full if full in known else resolve(base), inner)
            visit(child, inner)

    visit(ast.parse(path.read_text()), "module")
    return found


def import_graph() -> dict[str, dict[str, str]]:
    modules = our_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def layer(module: str) -> int:
    return 0 if module.split(".")[0] == "adaptor" else 1 if module.split(".")[0] == "patches" else 2


def is_feature(module: str) -> bool:
    return module.startswith("patches.") and module.count(".") >= 2


def wrong_way_arrows(graph) -> list[str]:
    out = []
    for src, targets in graph.items():
        for dst, where in targets.items():
            if (src, dst) == BOOTSTRAP_EDGE:
                continue
            if layer(src) < layer(dst):
                out.append(f"{src} -> {dst} ({where})")
            elif is_feature(src) and is_feature(dst):
                out.append(f"feature {src} -> feature {dst} ({where})")
            elif layer(src) == 2 and is_feature(dst):
                out.append(f"entry/tool {src} -> feature {dst} ({where})")
    return sorted(out)


def circles(graph, kinds=("module", "function")) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over the edges of ``kinds``."""
    edges = {src: [dst for dst, where in targets.items() if where in kinds and dst in graph]
             for src, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            connect(node)
    return found


def test_imports_run_one_way_from_entry_files_to_features_to_the_library():
    arrows = wrong_way_arrows(import_graph())
    assert not arrows, f"{len(arrows)} imports against the layers:\n" + "\n".join(arrows)


def test_no_import_circle_at_module_level_or_inside_functions():
    graph = import_graph()
    found = circles(graph)
    assert not found, f"{len(found)} import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_bootstrap_edge_exists_and_is_the_only_way_into_the_features():
    """The exemption is not dead: adaptor.bootstrap really takes the features, inside a function."""
    graph = import_graph()
    assert graph[BOOTSTRAP_EDGE[0]].get(BOOTSTRAP_EDGE[1]) == "function"
    into_features = sorted(src for src, targets in graph.items() if layer(src) == 0
                           and any(layer(dst) == 1 for dst in targets))
    assert into_features == [BOOTSTRAP_EDGE[0]], into_features
