"""Explicit, reversible monkey patches addressed by dotted path.

A patch layer over a library we do not own must say exactly what it changed, undo it, and refuse two
features fighting over one function; bare ``setattr`` does none of that:

* **Stale aliases.** ``from megatron.core.utils import f`` copies ``f``; every loaded module holding
  the original under any name is rebound (and restored on removal).
* **Ordering.** One replacement per target; wrappers (wrapt's ``(wrapped, instance, args, kwargs)``
  signature) stack in registration order, the first innermost. A second replacement raises
  :class:`PatchConflictError` naming both registrants.
* **Lazy.** A target whose module is not imported yet is patched when it finishes importing (wrapt's
  post-import hook), so ``import adaptor`` costs what Megatron's import costs, and nobody can hold
  the unpatched object.
"""
from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import wrapt

__all__ = ["PatchConflictError", "PatchTargetError", "PatchManager"]


class PatchConflictError(RuntimeError):
    """Two registrants asked to replace the same target."""


class PatchTargetError(AttributeError):
    """A dotted path does not name an existing object."""


def resolve_parent(target: str) -> tuple[Any, str]:
    """Import and walk ``target`` ("pkg.mod.Class.attr"); return (parent, attr)."""
    parts = target.split(".")
    if len(parts) < 2:
        raise PatchTargetError(f"patch target {target!r} must be a dotted path 'module.attr'")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:-1], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if isinstance(obj, types.ModuleType):
            name = ".".join(parts[: i + 1])
            try:
                obj = importlib.import_module(name)
                continue
            except ModuleNotFoundError as exc:
                if exc.name != name:
                    raise
        raise PatchTargetError(f"patch target {target!r}: {'.'.join(parts[:i])!r} has no {part!r}")
    attr = parts[-1]
    if not hasattr(obj, attr) and isinstance(obj, types.ModuleType):
        try:  # the attribute may be a submodule not yet imported
            importlib.import_module(f"{obj.__name__}.{attr}")
        except ModuleNotFoundError:
            pass
    return obj, attr


@dataclass
class _Patch:
    target: str
    replacement: Any = None
    replacement_owner: Optional[str] = None
    create: bool = False
    wrappers: list[tuple[Callable, str]] = field(default_factory=list)
    # State while applied.
    applied: bool = False
    parent: Any = None
    attr: str = ""
    had_own_attr: bool = False
    original_raw: Any = None  # as stored in parent.__dict__ (keeps staticmethod/classmethod)
    original_visible: Any = None  # as seen through getattr (what `from x import f` copied)
    installed: Any = None
    installed_visible: Any = None  # getattr view of `installed`, for rebinding aliases
    aliases: list[tuple[types.ModuleType, str]] = field(default_factory=list)
    waiting_on: Optional[str] = None  # the module whose import applies it, while pending
    loaded_before: Optional[frozenset] = None  # sys.modules when first deferred: none of these can hold a copy

    @property
    def owners(self) -> list[str]:
        names = [self.replacement_owner] if self.replacement_owner else []
        return names + [owner for _, owner in self.wrappers]

    def describe(self) -> str:
        kinds = []
        if self.replacement_owner:
            kinds.append(f"replaced by {self.replacement_owner}")
        if self.wrappers:
            kinds.append("wrapped by " + ", ".join(owner for _, owner in self.wrappers))
        return f"{self.target} ({'; '.join(kinds)})"


_MISSING = object()


class PatchManager:
    """Registry of patches; nothing changes until :meth:`apply`."""

    def __init__(self) -> None:
        self._patches: dict[str, _Patch] = {}
        self._hooked: set[str] = set()  # modules with our post-import hook

    # ---------------------------------------------------------------- registration
    def register_replacement(self, target: str, replacement: Any, owner: str, create: bool = False) -> None:
        """Replace ``target`` with ``replacement`` (any object: function, class, constant).

        ``create=True`` allows adding an attribute that does not exist upstream.
        """
        patch = self._patches.setdefault(target, _Patch(target))
        if patch.replacement_owner is not None and patch.replacement_owner != owner:
            raise PatchConflictError(
                f"{target} is replaced twice: by {patch.replacement_owner} and by {owner}"
            )
        patch.replacement, patch.replacement_owner, patch.create = replacement, owner, create
        self._mark_dirty(patch)

    def register_wrapper(self, target: str, wrapper: Callable, owner: str) -> None:
        """Wrap ``target``; ``wrapper(wrapped, instance, call_args, kwargs)`` as in wrapt."""
        patch = self._patches.setdefault(target, _Patch(target))
        if any(w is wrapper for w, _ in patch.wrappers):
            return
        patch.wrappers.append((wrapper, owner))
        self._mark_dirty(patch)

    def _mark_dirty(self, patch: _Patch) -> None:
        if patch.applied:  # re-apply on the next apply() with the new stack
            self._collect_late_aliases([patch])
            self._remove_one(patch)

    # ---------------------------------------------------------------- apply/remove
    def apply(self) -> list[str]:
        """Apply every registered patch whose module is imported; the others wait for their module.

        Returns the targets applied now.
        """
        done = []
        for patch in [p for p in self._patches.values() if not p.applied]:
            missing = _first_missing_module(patch.target)
            if missing is None:
                self._apply_one(patch)
                patch.waiting_on = None
                done.append(patch)
            else:
                self._wait_for(patch, missing)
        self._rebind_aliases(done)
        return [p.target for p in done]

    def _wait_for(self, patch: _Patch, module: str) -> None:
        """Hook every module on the target's path that has not started importing; the end of each
        import re-tries the patches still waiting (a circular import finishes the deeper module last)."""
        if patch.waiting_on is None and patch.loaded_before is None:
            # the target's module is not loaded at all (not merely mid-import): nothing loaded now can copy from it
            patch.loaded_before = frozenset(sys.modules) if module not in sys.modules else frozenset()
        patch.waiting_on = module
        parts = patch.target.split(".")
        for i in range(1, len(parts)):
            name = ".".join(parts[:i])
            if name not in sys.modules and name not in self._hooked:
                self._hooked.add(name)
                wrapt.register_post_import_hook(self._on_import, name)

    def _on_import(self, module) -> None:
        # Called at the end of the module's exec_module, before importlib marks it done.
        _FINISHED.add(module.__name__)
        if any(p.waiting_on for p in self._patches.values()):
            self.apply()

    def pending(self) -> dict[str, str]:
        """Registered targets not applied yet -> the module whose import will apply them."""
        return {p.target: p.waiting_on for p in self._patches.values() if not p.applied and p.waiting_on}

    def remove(self) -> None:
        """Undo every applied patch, aliases included, in reverse order; pending ones stop waiting."""
        self._collect_late_aliases([p for p in self._patches.values() if p.applied])
        for patch in reversed(list(self._patches.values())):
            patch.waiting_on = patch.loaded_before = None
            if patch.applied:
                self._remove_one(patch)

    def clear(self) -> None:
        self.remove()
        self._patches.clear()

    def _apply_one(self, patch: _Patch) -> None:
        parent, attr = resolve_parent(patch.target)
        own = attr in vars(parent) if isinstance(parent, type) else hasattr(parent, attr)
        if isinstance(parent, type):
            # An inherited attribute is taken raw from the class that defines it, so an
            # inherited staticmethod/classmethod keeps its descriptor (getattr would give a
            # plain function, or a method bound to `parent`) when installed on the subclass.
            raw = next((vars(k)[attr] for k in parent.__mro__ if attr in vars(k)), _MISSING)
            if raw is _MISSING:
                raw = getattr(parent, attr, _MISSING)
        else:
            raw = getattr(parent, attr, _MISSING)
        if raw is _MISSING and not patch.create:
            raise PatchTargetError(f"patch target {patch.target!r} does not exist (registered by {', '.join(patch.owners)})")
        visible = getattr(parent, attr, None)
        obj = patch.replacement if patch.replacement_owner else raw
        if obj is _MISSING:
            raise PatchTargetError(f"cannot wrap missing target {patch.target!r}")
        for wrapper, _ in patch.wrappers:
            obj = wrapt.FunctionWrapper(obj, wrapper)
        setattr(parent, attr, obj)
        patch.parent, patch.attr, patch.had_own_attr = parent, attr, own and raw is not _MISSING
        patch.original_raw, patch.original_visible, patch.installed = raw, visible, obj
        patch.applied = True

    def _remove_one(self, patch: _Patch) -> None:
        for module, name in patch.aliases:
            if vars(module).get(name) is patch.installed_visible:
                setattr(module, name, patch.original_visible)
        patch.aliases.clear()
        if patch.had_own_attr:
            setattr(patch.parent, patch.attr, patch.original_raw)
        else:
            try:
                delattr(patch.parent, patch.attr)
            except AttributeError:
                pass
        patch.applied = False
        patch.installed = patch.installed_visible = None

    def _rebind_aliases(self, patches: list[_Patch]) -> None:
        """Point every loaded module's copy of an original at its patched object.

        A patch applied when its module finished importing (lazily) has an original that did not exist
        when the patch was deferred, so only modules loaded since then can hold a copy: those alone
        are walked, not the thousands torch and Megatron loaded before.
        """
        by_id = {}
        for p in patches:
            if isinstance(p.parent, types.ModuleType) and p.original_visible is not None and callable(p.original_visible):
                p.installed_visible = getattr(p.parent, p.attr)
                by_id[id(p.original_visible)] = p
        modules = None
        if patches and all(p.loaded_before is not None for p in patches):
            older = frozenset.intersection(*(p.loaded_before for p in patches))
            modules = [m for name, m in list(sys.modules.items()) if name not in older]
        for module, namespace, name, p in _copies(by_id, lambda p: p.original_visible, modules):
            namespace[name] = p.installed_visible
            p.aliases.append((module, name))

    def _collect_late_aliases(self, patches: list[_Patch]) -> None:
        """Record copies of a wrapped target made after apply() (a later ``from x import f``),
        so that removal restores them too.

        Only wrapped targets: the installed wrapper is ours, so every module holding it holds
        a copy of the target. A bare replacement is the caller's object, also held under its
        own name by the module defining it, which must keep it.
        """
        by_id = {id(p.installed_visible): p for p in patches if p.installed_visible is not None and p.wrappers}
        for module, _, name, p in _copies(by_id, lambda p: p.installed_visible):
            if not any(m is module and n == name for m, n in p.aliases):
                p.aliases.append((module, name))

    # ---------------------------------------------------------------- introspection
    def is_applied(self, target: str) -> bool:
        p = self._patches.get(target)
        return bool(p and p.applied)

    def original(self, target: str) -> Any:
        """The object the target held before patching (as seen through getattr)."""
        p = self._patches[target]
        if not p.applied:
            parent, attr = resolve_parent(target)
            return getattr(parent, attr)
        return p.original_visible

    def targets_by_owner(self, pending: bool = False) -> dict[str, list[str]]:
        """Applied targets per registrant (a target with several owners appears under each);
        with ``pending``, the targets waiting for their module too."""
        out: dict[str, list[str]] = {}
        for p in self._patches.values():
            if p.applied or (pending and p.waiting_on):
                for owner in dict.fromkeys(p.owners):
                    out.setdefault(owner, []).append(p.target)
        return out

    def registered(self) -> list[tuple[str, str, str]]:
        """(target, "replaced" or "wrapped", owner) for every registered patch, applied or not."""
        rows = []
        for p in self._patches.values():
            if p.replacement_owner:
                rows.append((p.target, "replaced", p.replacement_owner))
            rows += [(p.target, "wrapped", owner) for _, owner in p.wrappers]
        return rows

    def descriptions(self) -> list[str]:
        return [p.describe() for p in self._patches.values() if p.applied]

    def __len__(self) -> int:
        return sum(p.applied for p in self._patches.values())


def _first_missing_module(target: str) -> Optional[str]:
    """The first module on ``target``'s path that is not imported yet (None: all there), found
    without importing anything."""
    parts = target.split(".")
    if len(parts) < 2:
        raise PatchTargetError(f"patch target {target!r} must be a dotted path 'module.attr'")
    if not _imported(parts[0]):
        return parts[0] if _is_module(parts[0]) else None
    obj: Any = sys.modules[parts[0]]
    for i, part in enumerate(parts[1:-1], start=1):
        name = ".".join(parts[: i + 1])
        if isinstance(obj, types.ModuleType) and name in sys.modules:
            if not _imported(name):
                return name
            obj = sys.modules[name]
        elif part in vars(obj) if isinstance(obj, types.ModuleType) else hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            return name if _is_module(name) else None  # not importable: resolve_parent says so
        else:
            return None  # not a module path: resolve_parent names what is wrong
    if isinstance(obj, types.ModuleType) and parts[-1] not in vars(obj):
        submodule = f"{obj.__name__}.{parts[-1]}"
        if not _imported(submodule) and (submodule in sys.modules or _is_module(submodule)):
            return submodule
    if isinstance(obj, types.ModuleType) and not _imported(obj.__name__):
        return obj.__name__
    return None


_FINISHED: set[str] = set()  # modules whose post-import hook ran: executed, though still flagged as importing


def _imported(name: str) -> bool:
    """In sys.modules and done executing (a module part-way through a circular import is not)."""
    module = sys.modules.get(name)
    if module is None:
        return False
    return name in _FINISHED or not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _is_module(name: str) -> bool:
    """Whether ``name`` can be imported; its parent package is imported already, so this imports nothing."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _copies(by_id: dict, held: Callable[[_Patch], Any], modules=None):
    """Yield (module, namespace, name, patch) for every attribute of ``modules`` (default: every loaded
    module) that is ``held(patch)``, except the patch target's own attribute."""
    if not by_id:
        return
    for module in list(sys.modules.values()) if modules is None else modules:
        if not isinstance(module, types.ModuleType):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        for name, value in list(namespace.items()):
            p = by_id.get(id(value))
            if p is None or value is not held(p) or (module is p.parent and name == p.attr):
                continue
            yield module, namespace, name, p
