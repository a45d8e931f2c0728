"""Every cross-reference a docstring makes (``:func:``, ``:class:``, ``:meth:``, ``:attr:``,
``:mod:``...) names something that exists: the API page renders the public ones, but the
private ones are never resolved by the docs build, so a reference left behind by a rename
or a move (``scalertune._timing.time_dtypes`` after ``_timing`` moved into ``_run``) would
pass it. Here each is resolved as a reader would: a dotted path (``~`` dropped, a leading
``.`` relative to the module's package), else a name of the module, of a class of it (its
methods, fields and the attributes its methods set), or of a submodule of a package."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import scalertune

ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`([^`]+)`")


def _modules() -> list[ModuleType]:
    names = [
        m.name
        for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.")
        if not m.name.endswith("__main__")  # running it is the command line
    ]
    return [scalertune, *(importlib.import_module(n) for n in names)]


_MISSING = object()


def _member(obj: object, name: str) -> object:
    """``obj.name``; for a class, also a field it declares or an attribute its methods set
    (the class itself stands for those); ``_MISSING`` where there is none."""
    if hasattr(obj, name):
        return getattr(obj, name)
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            if name in getattr(klass, "__annotations__", {}):
                return klass
            try:
                if re.search(rf"self\.{re.escape(name)}\b", inspect.getsource(klass)):
                    return klass
            except (OSError, TypeError):
                continue
    return _MISSING


def _dotted(path: str) -> bool:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = _member(obj, part)
            if obj is _MISSING:
                return False
        return True
    return False


def _resolves(target: str, module: ModuleType) -> bool:
    titled = re.search(r"<([^>]+)>", target)  # :meth:`Title <path>`: the path
    path = re.sub(r"\s+", "", titled.group(1) if titled else target).lstrip("~")
    if path.startswith("."):
        package = module.__name__ if hasattr(module, "__path__") else module.__package__ or ""
        ups = len(path) - len(path.lstrip(".")) - 1
        base = package.rsplit(".", ups)[0] if ups else package
        return _dotted(f"{base}.{path.lstrip('.')}")
    if _dotted(path) or _dotted(f"{module.__name__}.{path}") or _dotted(f"scalertune.{path}"):
        return True
    if "." in path:
        return False
    classes = [
        c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__
    ]
    if any(_member(c, path) is not _MISSING for c in classes):
        return True
    if hasattr(module, "__path__"):  # a package's docstring names its modules' members
        subs = pkgutil.iter_modules(module.__path__, module.__name__ + ".")
        return any(hasattr(importlib.import_module(s.name), path) for s in subs)
    return False


def test_every_cross_reference_in_a_docstring_names_something_that_exists():
    stale = [
        f"{module.__name__}: {found.group(0)}"
        for module in _modules()
        for found in ROLE.finditer(inspect.getsource(module))
        if not _resolves(found.group(1), module)
    ]
    assert stale == []


def test_the_check_finds_a_reference_left_behind_by_a_move():
    from scalertune._search import _launch

    assert not _resolves("scalertune._timing.time_dtypes", _launch)
    assert _resolves("scalertune._run._timing.time_dtypes", _launch)
    assert not _resolves("_Skips", importlib.import_module("scalertune._amp._runtime"))
