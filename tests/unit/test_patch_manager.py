"""Unit tests of adaptor.patch_manager.PatchManager on throwaway modules.

Every test builds its own modules (``types.ModuleType`` registered in
``sys.modules`` under a unique name) so nothing real is patched; the
``make_module`` fixture removes them again.

Note: importing ``adaptor.patch_manager`` imports the ``adaptor`` package,
whose ``__init__`` runs ``adaptor.setup()`` once for this process.
"""
from __future__ import annotations

import sys
import textwrap
import types
import uuid

import pytest

from adaptor.patch_manager import PatchConflictError, PatchManager, PatchTargetError


@pytest.fixture
def make_module():
    """Factory: ``make_module(source)`` -> a fresh module executed from ``source``."""
    created: list[str] = []

    def factory(source: str = "", name: str | None = None) -> types.ModuleType:
        name = name or f"_pm_test_{uuid.uuid4().hex}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        created.append(name)
        exec(textwrap.dedent(source), module.__dict__)
        return module

    yield factory
    for name in created:
        sys.modules.pop(name, None)


@pytest.fixture
def pm():
    manager = PatchManager()
    yield manager
    manager.clear()


def appending(log: list, tag: str):
    """A wrapt-style wrapper that records ``tag`` on entry and on exit."""

    def wrapper(wrapped, instance, call_args, kwargs):
        log.append(f"{tag}>")
        result = wrapped(*call_args, **kwargs)
        log.append(f"<{tag}")
        return result

    return wrapper


SOURCE = """
def f(x):
    return x + 1
"""


# ------------------------------------------------------------------ functions

def test_replacement_of_module_function_and_removal_restores(make_module, pm):
    """A replacement is visible through the module; remove() puts the original back."""
    src = make_module(SOURCE)
    original = src.f
    pm.register_replacement(f"{src.__name__}.f", lambda x: x * 10, "owner.a")
    assert src.f is original  # registering alone changes nothing

    assert pm.apply() == [f"{src.__name__}.f"]
    assert src.f(3) == 30
    assert pm.is_applied(f"{src.__name__}.f")
    assert pm.original(f"{src.__name__}.f") is original

    pm.remove()
    assert src.f is original
    assert src.f(3) == 4
    assert not pm.is_applied(f"{src.__name__}.f")


def test_wrappers_stack_in_registration_order_first_is_innermost(make_module, pm):
    """The first registered wrapper runs closest to the original, the last outermost."""
    src = make_module(SOURCE)
    log: list[str] = []
    target = f"{src.__name__}.f"
    pm.register_wrapper(target, appending(log, "first"), "owner.a")
    pm.register_wrapper(target, appending(log, "second"), "owner.b")
    pm.apply()

    assert src.f(1) == 2
    assert log == ["second>", "first>", "<first", "<second"]


def test_transforming_wrappers_compose_in_registration_order(make_module, pm):
    """Value-transforming wrappers compose as outer(inner(original)), inner = first."""
    src = make_module(SOURCE)
    target = f"{src.__name__}.f"
    pm.register_wrapper(target, lambda w, i, a, k: w(*a, **k) * 2, "owner.double")
    pm.register_wrapper(target, lambda w, i, a, k: w(*a, **k) + 100, "owner.add")
    pm.apply()

    # (3 + 1) * 2 + 100; the opposite order would give (3 + 1 + 100) * 2 = 208.
    assert src.f(3) == 108
    pm.remove()
    assert src.f(3) == 4


def test_wrappers_wrap_the_replacement(make_module, pm):
    """With a replacement and wrappers on one target, the wrappers see the replacement."""
    src = make_module(SOURCE)
    target = f"{src.__name__}.f"
    log: list[str] = []
    pm.register_wrapper(target, appending(log, "w"), "owner.w")  # before the replacement, on purpose
    pm.register_replacement(target, lambda x: x * 10, "owner.r")
    pm.register_wrapper(target, lambda w, i, a, k: w(*a, **k) + 1, "owner.plus1")
    pm.apply()

    assert src.f(2) == 21  # (2 * 10) + 1, not (2 + 1) ...
    assert log == ["w>", "<w"]
    pm.remove()
    assert src.f(2) == 3


# ------------------------------------------------------------------ aliases

def test_from_import_alias_is_rebound_and_restored(make_module, pm):
    """A module that did ``from source import f`` sees the patch, then the original again."""
    src = make_module(SOURCE)
    original = src.f
    user = make_module()
    user.f = src.f  # what `from src import f` does
    user.g = src.f  # `from src import f as g`
    other = make_module("def f(x):\n    return 'unrelated'\n")  # same name, other object

    def replacement(x):
        return -x

    pm.register_replacement(f"{src.__name__}.f", replacement, "owner.a")
    pm.apply()
    assert src.f is replacement
    assert user.f is replacement
    assert user.g is replacement
    assert other.f(1) == "unrelated"

    pm.remove()
    assert src.f is original
    assert user.f is original
    assert user.g is original


def test_wrapped_function_alias_is_rebound(make_module, pm):
    """Aliases are rebound for wrapped (not only replaced) functions."""
    src = make_module(SOURCE)
    user = make_module()
    user.f = src.f
    pm.register_wrapper(f"{src.__name__}.f", lambda w, i, a, k: w(*a, **k) * 2, "owner.a")
    pm.apply()
    assert user.f(1) == 4
    pm.remove()
    assert user.f(1) == 2


def test_module_imported_after_apply_gets_the_patched_object(make_module, pm):
    """``from source import f`` executed after apply() binds the patched function;
    remove() leaves the replacement's own home module alone."""
    src = make_module(SOURCE)
    home = make_module("def replacement(x):\n    return 'patched'\n")
    original = src.f

    pm.register_replacement(f"{src.__name__}.f", home.replacement, "owner.a")
    pm.apply()
    late = make_module(f"from {src.__name__} import f\n")
    assert late.f is home.replacement
    assert late.f(0) == "patched"

    pm.remove()
    assert src.f is original
    assert home.replacement(0) == "patched"  # not mistaken for a copy of the target


def test_late_copy_of_wrapped_function_is_restored(make_module, pm):
    """A module that copies a wrapped function after apply() gets the original back on remove()."""
    src = make_module(SOURCE)
    original = src.f
    pm.register_wrapper(f"{src.__name__}.f", lambda w, i, a, k: w(*a, **k) * 2, "owner.a")
    pm.apply()
    late = make_module(f"from {src.__name__} import f\n")
    assert late.f(1) == 4

    pm.remove()
    assert late.f is original


# ------------------------------------------------------------------ classes

CLASSES = """
class Base:
    def meth(self, x):
        return ("meth", type(self).__name__, x)

    @staticmethod
    def smeth(x):
        return ("smeth", x)

    @classmethod
    def cmeth(cls, x):
        return ("cmeth", cls.__name__, x)


class Sub(Base):
    pass


class SubSub(Sub):
    pass
"""


def tagging(wrapped, instance, call_args, kwargs):
    return ("wrapped",) + wrapped(*call_args, **kwargs)


def test_wrap_method_staticmethod_classmethod(make_module, pm):
    """Wrapped methods keep their binding: self for methods, none for staticmethods,
    the calling class for classmethods (also when called on a subclass)."""
    mod = make_module(CLASSES)
    raw = dict(vars(mod.Base))
    for attr in ("meth", "smeth", "cmeth"):
        pm.register_wrapper(f"{mod.__name__}.Base.{attr}", tagging, "owner.a")
    pm.apply()

    assert mod.Base().meth(1) == ("wrapped", "meth", "Base", 1)
    assert mod.Sub().meth(1) == ("wrapped", "meth", "Sub", 1)
    assert mod.Base.smeth(2) == ("wrapped", "smeth", 2)
    assert mod.Base().smeth(2) == ("wrapped", "smeth", 2)
    assert mod.Base.cmeth(3) == ("wrapped", "cmeth", "Base", 3)
    assert mod.Sub().cmeth(3) == ("wrapped", "cmeth", "Sub", 3)

    pm.remove()
    for attr in ("meth", "smeth", "cmeth"):
        assert vars(mod.Base)[attr] is raw[attr]  # the staticmethod/classmethod object itself
    assert mod.Base().smeth(2) == ("smeth", 2)


def test_replace_method_staticmethod_classmethod(make_module, pm):
    """Replacements on a class are installed as given (descriptors included) and removed."""
    mod = make_module(CLASSES)
    pm.register_replacement(f"{mod.__name__}.Base.meth", lambda self, x: ("new meth", x), "owner.a")
    pm.register_replacement(f"{mod.__name__}.Base.smeth", staticmethod(lambda x: ("new smeth", x)), "owner.a")
    pm.register_replacement(f"{mod.__name__}.Base.cmeth", classmethod(lambda cls, x: ("new cmeth", cls.__name__)), "owner.a")
    pm.apply()
    assert mod.Base().meth(1) == ("new meth", 1)
    assert mod.Base().smeth(1) == ("new smeth", 1)
    assert mod.Sub.cmeth(1) == ("new cmeth", "Sub")

    pm.remove()
    assert mod.Base().meth(1) == ("meth", "Base", 1)
    assert mod.Base().smeth(1) == ("smeth", 1)
    assert mod.Sub.cmeth(1) == ("cmeth", "Sub", 1)


@pytest.mark.parametrize("attr", ["meth", "smeth", "cmeth"])
def test_inherited_method_patched_on_subclass(make_module, pm, attr):
    """Patching an inherited method on the subclass leaves the base class alone, binds
    like the inherited attribute did, and removal restores inheritance (the attribute
    leaves the subclass __dict__)."""
    mod = make_module(CLASSES)
    calls = {
        "meth": lambda cls: cls().meth(1),
        "smeth": lambda cls: cls().smeth(1),
        "cmeth": lambda cls: cls().cmeth(1),
    }[attr]
    before = {cls: calls(cls) for cls in (mod.Base, mod.Sub, mod.SubSub)}
    pm.register_wrapper(f"{mod.__name__}.Sub.{attr}", tagging, "owner.a")
    pm.apply()

    assert attr in vars(mod.Sub)
    assert calls(mod.Base) == before[mod.Base]  # base untouched
    assert calls(mod.Sub) == ("wrapped",) + before[mod.Sub]
    assert calls(mod.SubSub) == ("wrapped",) + before[mod.SubSub]  # still binds SubSub

    pm.remove()
    assert attr not in vars(mod.Sub)
    assert attr not in vars(mod.SubSub)
    assert {cls: calls(cls) for cls in (mod.Base, mod.Sub, mod.SubSub)} == before


# ------------------------------------------------------------------ attributes

def test_constant_replacement_and_removal(make_module, pm):
    """Non-callable attributes can be replaced and are restored."""
    mod = make_module("LIMIT = 8\nNAMES = ('a', 'b')\n")
    pm.register_replacement(f"{mod.__name__}.LIMIT", 64, "owner.a")
    pm.register_replacement(f"{mod.__name__}.NAMES", ("x",), "owner.a")
    pm.apply()
    assert mod.LIMIT == 64
    assert mod.NAMES == ("x",)
    pm.remove()
    assert mod.LIMIT == 8
    assert mod.NAMES == ("a", "b")


def test_create_adds_missing_attribute_and_removal_deletes_it(make_module, pm):
    """``create=True`` adds a missing module or class attribute; removal deletes it."""
    mod = make_module(CLASSES)
    pm.register_replacement(f"{mod.__name__}.NEW_FLAG", True, "owner.a", create=True)
    pm.register_replacement(f"{mod.__name__}.Base.extra", lambda self: "extra", "owner.a", create=True)
    pm.apply()
    assert mod.NEW_FLAG is True
    assert mod.Sub().extra() == "extra"

    pm.remove()
    assert not hasattr(mod, "NEW_FLAG")
    assert not hasattr(mod.Base, "extra")


@pytest.mark.parametrize("kind", ["replacement", "wrapper"])
def test_missing_target_without_create_raises(make_module, pm, kind):
    """A target that does not exist is an error unless ``create=True`` was given."""
    mod = make_module(SOURCE)
    target = f"{mod.__name__}.nonexistent"
    if kind == "replacement":
        pm.register_replacement(target, 1, "owner.a")
    else:
        pm.register_wrapper(target, tagging, "owner.a")
    with pytest.raises(PatchTargetError, match="nonexistent"):
        pm.apply()
    assert not hasattr(mod, "nonexistent")


def test_missing_parent_raises(make_module, pm):
    """A dotted path through a missing attribute is a PatchTargetError too."""
    mod = make_module(SOURCE)
    pm.register_replacement(f"{mod.__name__}.NoSuchClass.attr", 1, "owner.a")
    with pytest.raises(PatchTargetError, match="NoSuchClass"):
        pm.apply()


# ------------------------------------------------------------------ re-applying

def test_apply_twice_does_not_double_wrap(make_module, pm):
    """A second apply() is a no-op: the wrapper still runs once per call."""
    src = make_module(SOURCE)
    user = make_module()
    user.f = src.f
    calls = []

    def counting(wrapped, instance, call_args, kwargs):
        calls.append(call_args)
        return wrapped(*call_args, **kwargs)

    pm.register_wrapper(f"{src.__name__}.f", counting, "owner.a")
    pm.register_wrapper(f"{src.__name__}.f", counting, "owner.a")  # duplicate registration ignored
    assert pm.apply() == [f"{src.__name__}.f"]
    assert pm.apply() == []

    assert src.f(1) == 2
    assert user.f(2) == 3
    assert calls == [(1,), (2,)]
    assert len(pm) == 1


def test_new_wrapper_on_applied_target_restacks(make_module, pm):
    """A wrapper registered after apply() joins the stack on the next apply(), outermost,
    without wrapping the old stack a second time; aliases follow."""
    src = make_module(SOURCE)
    original = src.f
    user = make_module()
    user.f = src.f
    log: list[str] = []
    target = f"{src.__name__}.f"
    pm.register_wrapper(target, appending(log, "a"), "owner.a")
    pm.apply()
    pm.register_wrapper(target, appending(log, "b"), "owner.b")
    pm.apply()

    assert src.f(1) == 2
    assert log == ["b>", "a>", "<a", "<b"]
    log.clear()
    assert user.f(1) == 2
    assert log == ["b>", "a>", "<a", "<b"]
    assert pm.original(target) is original

    pm.remove()
    assert src.f is original
    assert user.f is original


# ------------------------------------------------------------------ bookkeeping

def test_conflicting_replacements_name_both_owners(make_module, pm):
    """Two owners replacing one target is an error that names both of them."""
    src = make_module(SOURCE)
    target = f"{src.__name__}.f"
    pm.register_replacement(target, lambda x: 1, "patches.first_feature")
    with pytest.raises(PatchConflictError) as excinfo:
        pm.register_replacement(target, lambda x: 2, "patches.second_feature")
    message = str(excinfo.value)
    assert "patches.first_feature" in message
    assert "patches.second_feature" in message
    assert target in message
    pm.apply()
    assert src.f(0) == 1  # the first registration stands


def test_descriptions_list_applied_targets_with_owners(make_module, pm):
    """descriptions() names each applied target and who replaced or wrapped it."""
    src = make_module(SOURCE + "LIMIT = 1\n")
    pm.register_replacement(f"{src.__name__}.f", lambda x: x, "owner.repl")
    pm.register_wrapper(f"{src.__name__}.f", tagging, "owner.wrap1")
    pm.register_wrapper(f"{src.__name__}.f", lambda w, i, a, k: w(*a, **k), "owner.wrap2")
    pm.register_replacement(f"{src.__name__}.LIMIT", 2, "owner.const")
    assert pm.descriptions() == []  # nothing applied yet

    pm.apply()
    assert pm.descriptions() == [
        f"{src.__name__}.f (replaced by owner.repl; wrapped by owner.wrap1, owner.wrap2)",
        f"{src.__name__}.LIMIT (replaced by owner.const)",
    ]
    pm.remove()
    assert pm.descriptions() == []


# ------------------------------------------------------------------ lazy: targets in modules not yet imported

def _package_on_disk(tmp_path, monkeypatch, source: str) -> str:
    """A package ``<name>`` with submodule ``<name>.heavy`` (``source``), on sys.path, not imported."""
    name = f"_pm_lazy_{uuid.uuid4().hex}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "heavy.py").write_text(textwrap.dedent(source))
    (tmp_path / name / "user.py").write_text(f"from {name}.heavy import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("", ".heavy", ".user"):  # forgotten after the test
        monkeypatch.delitem(sys.modules, name + module, raising=False)
    return name


def test_target_in_an_unimported_module_waits_for_its_import(tmp_path, monkeypatch, pm):
    """apply() imports nothing; the import of the target's module applies the patch at once, and a
    module that copies the function afterwards gets the patched one; remove() restores both."""
    name = _package_on_disk(tmp_path, monkeypatch, SOURCE)
    pm.register_wrapper(f"{name}.heavy.f", lambda wrapped, _i, args, kwargs: wrapped(*args, **kwargs) * 100, "o.lazy")
    assert pm.apply() == []
    assert name not in sys.modules and f"{name}.heavy" not in sys.modules
    assert pm.pending() == {f"{name}.heavy.f": name}
    assert pm.targets_by_owner(pending=True) == {"o.lazy": [f"{name}.heavy.f"]} and pm.targets_by_owner() == {}

    import importlib

    heavy = importlib.import_module(f"{name}.heavy")
    assert heavy.f(1) == 200 and pm.is_applied(f"{name}.heavy.f") and pm.pending() == {}
    user = importlib.import_module(f"{name}.user")
    assert user.f(1) == 200
    pm.remove()
    assert heavy.f(1) == 2 and user.f(1) == 2


def test_pending_target_forgotten_by_remove(tmp_path, monkeypatch, pm):
    name = _package_on_disk(tmp_path, monkeypatch, SOURCE)
    pm.register_replacement(f"{name}.heavy.f", lambda x: -1, "o.lazy")
    pm.apply()
    pm.remove()
    assert pm.pending() == {}
    import importlib

    assert importlib.import_module(f"{name}.heavy").f(1) == 2


def test_misspelt_lazy_target_fails_the_import_of_its_module(tmp_path, monkeypatch, pm):
    """A target that turns out not to exist when its module arrives is the same PatchTargetError,
    raised by that import, naming the registrant: never a patch silently waiting for ever."""
    name = _package_on_disk(tmp_path, monkeypatch, SOURCE)
    pm.register_replacement(f"{name}.heavy.no_such_function", lambda x: x, "o.typo")
    assert pm.apply() == []
    import importlib

    with pytest.raises(PatchTargetError, match="no_such_function.*o.typo"):
        importlib.import_module(f"{name}.heavy")


def test_lazy_target_copied_while_its_package_imports_is_rebound(tmp_path, monkeypatch, pm):
    """The package imports the target's module and then a sibling that copies the function, all before
    the package finishes (Megatron's ``megatron.training`` does this with ``initialize_megatron``): the
    patch applies when the package is done, and the sibling's copy is rebound too."""
    name = f"_pm_lazy_{uuid.uuid4().hex}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(f"from {name} import heavy, user\n")
    (tmp_path / name / "heavy.py").write_text(textwrap.dedent(SOURCE))
    (tmp_path / name / "user.py").write_text(f"from {name}.heavy import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("", ".heavy", ".user"):
        monkeypatch.delitem(sys.modules, name + module, raising=False)
    pm.register_replacement(f"{name}.heavy.f", lambda x: -x, "o.lazy")
    pm.apply()
    import importlib

    package = importlib.import_module(name)
    assert package.heavy.f(3) == -3 and package.user.f(3) == -3
    pm.remove()
    assert package.heavy.f(3) == 4 and package.user.f(3) == 4
