"""Finding the user's factory: ``path/to/model.py:make_model`` or ``package.module:factory``."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from scalertune import _interrupt
from scalertune._errors import UsageError


def load_factory(spec: str | Callable[[], Any], *, isolated: bool = False) -> Callable[[], Any]:
    """Resolve ``FILE.py:NAME`` or ``package.module:NAME`` to the factory callable.

    A callable is taken as it is. With ``isolated`` (``--isolate``: every run in a fresh
    process) it must be a module-level function the child process can import again.
    """
    if callable(spec):
        if isolated:
            _check_importable(spec)
        return spec
    if not isinstance(spec, str):
        raise UsageError(
            f"the factory is a {type(spec).__name__}: give a function, or "
            "'path/to/model.py:make_model'"
        )
    module_part, name = check_spec(spec)
    module = _import_file(module_part) if _is_path(module_part) else _import_module(module_part)
    factory = getattr(module, name, None)
    if factory is None:
        raise UsageError(
            f"{module_part} has no attribute {name!r}: "
            f"{_closest(name, _functions(module)) or 'name the factory function'}"
        )
    if not callable(factory):
        raise UsageError(
            f"{module_part}:{name} is a {type(factory).__name__}, not callable: "
            "name a function that returns the workload"
        )
    return factory


def factory_name(spec: str | Callable[[], Any]) -> str:
    """How a factory is named in the study's settings: the spec as given, or, for a function,
    ``module:qualname`` (``script.py:qualname`` for one defined in the script being run)."""
    if isinstance(spec, str):
        return spec
    module = getattr(spec, "__module__", None) or "?"
    qualname = getattr(spec, "__qualname__", None) or type(spec).__name__
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        module = os.path.basename(script) if script else module
    return f"{module}:{qualname}"


def default_study_name(factory: str | Callable[[], Any]) -> str:
    """``examples/codepoints.py:make_model`` -> ``codepoints:make_model``; a function
    ``make_model`` of module ``pkg.models`` -> ``pkg.models:make_model``."""
    module, _, name = factory_name(factory).rpartition(":")
    stem = os.path.splitext(os.path.basename(module))[0] if module.endswith(".py") else module
    return f"{stem}:{name}"


def _check_importable(factory: Callable[[], Any]) -> None:
    """A process started afresh finds the function again by its module and name, or not."""
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    qualname = getattr(factory, "__qualname__", "")
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not factory or (
        module is not None
        and module.__name__ == "__main__"
        and not getattr(module, "__file__", None)
    ):
        raise UsageError(
            f"--isolate runs every trial in a new process, which cannot import the factory "
            f"{factory_name(factory)} (a lambda, a nested function or one defined "
            "interactively): give 'path/to/model.py:make_model', or a module-level function"
        )


def check_spec(spec: str) -> tuple[str, str]:
    """What can be told of ``FILE.py:NAME`` or ``package.module:NAME`` before anything is
    imported (torch included): its form, and that its file is there; its two parts."""
    module_part, sep, name = spec.rpartition(":")
    if not sep or not module_part or not name:
        raise UsageError(
            f"cannot read factory {spec!r}: write it as path/to/model.py:make_model "
            "or package.module:make_model"
        )
    if _is_path(module_part):
        _check_file(module_part)
    return module_part, name


def _is_path(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part or "/" in module_part


def _check_file(path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(
            f"{path} is a folder: give the path to the Python file holding the factory "
            "(model.py:make_model)"
        )
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        files = (
            sorted(f for f in os.listdir(folder) if f.endswith(".py"))
            if os.path.isdir(folder)
            else []
        )
        hint = _closest(os.path.basename(path), files)
        raise UsageError(
            f"no such file: {path} ({hint or 'give the path to the file holding the factory'})"
        )


def _import_file(path: str) -> Any:
    _check_file(path)
    path = os.path.abspath(path)
    module_name = "_scalertune_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    # The user's file may import its siblings, as it would when run as a script.
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[module_name] = module
    try:
        with _interrupt.imports():
            spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's module: any error is theirs to fix
        sys.modules.pop(module_name, None)
        raise UsageError(f"importing {path} failed: {one_line(exc)}") from None
    return module


def _import_module(name: str) -> Any:
    try:
        with _interrupt.imports():
            return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise UsageError(
                f"no module named {name!r}: install it, or give a file path like "
                "model.py:make_model"
            ) from None
        raise UsageError(f"importing {name} failed: {one_line(exc)}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise UsageError(f"importing {name} failed: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        # A script's exit, run on import or from a factory: say which call, and the cure.
        return (
            f"SystemExit: sys.exit({exc.code!r}) was called (keep script code under "
            "if __name__ == '__main__':)"
        )
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class FactoryError(Exception):
    """The user's factory raised (``__cause__`` holds its exception), or, called in a process
    of its own, never returned (``raised`` false: it hung past the time limit, or ended its
    process)."""

    def __init__(self, text: str, *, raised: bool = True) -> None:
        super().__init__(text)
        self.raised = raised


def _functions(module: Any) -> list[str]:
    """The public functions a module defines (the candidates for a factory)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
    )


def _closest(name: str, choices: list[str]) -> str:
    """``did you mean 'make_model'?`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(name, choices, n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
