"""Every public function and method says what it takes, returns and raises, as Optuna and
torch document theirs: a one-line summary, then ``Args:``, ``Returns:``, ``Raises:`` and
``Example:`` sections (Google style, which the API page renders).

The sections are asked for where they say something: ``Args:`` where there are arguments
(each one named), ``Returns:`` where something is returned, ``Raises:`` where the code itself
raises (each exception it raises by name), ``Example:`` for every public function and class
and every method of the classes training code calls (a hook that torch calls, whose summary
says "Hook", shows none). Exceptions and warnings are documented
by the functions that raise them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator

import pytest

import scalertune

#: The classes a user builds: their constructor's arguments are ``Args:``. The others (a
#: search's findings, a diagnosis, an export) come from scalertune's functions, and their
#: fields are documented one by one where they are declared.
BUILT_BY_USERS = {"AmpConfig", "AmpRuntime", "CheckPolicy", "Guard", "Isolation", "Workload"}

#: The classes whose every public method shows itself in an example.
EXAMPLE_PER_METHOD = {"AmpRuntime", "AmpConfig", "CheckPolicy", "Export", "Guard"}

SECTIONS = ("Args", "Returns", "Yields", "Raises", "Example", "Attributes", "Note")


def _public() -> Iterator[tuple[str, object, str | None]]:
    """(qualified name, callable, owning class name or None) for every public callable."""
    for name in scalertune.__all__:
        obj = getattr(scalertune, name)
        if inspect.isfunction(obj):
            yield name, obj, None
        elif inspect.isclass(obj) and not issubclass(obj, BaseException):
            yield name, obj, None
            for method_name, method in _methods(obj):
                yield f"{name}.{method_name}", method, name


def _methods(cls: type) -> Iterator[tuple[str, Callable[..., object]]]:
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("scalertune"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(value, (classmethod, staticmethod)):
                yield name, value.__func__
            elif inspect.isfunction(value):
                yield name, value


PUBLIC = list(_public())


def _sections(doc: str) -> dict[str, str]:
    """Section title -> its indented body."""
    found: dict[str, str] = {}
    title = None
    for line in doc.splitlines():
        match = re.fullmatch(r"(\w+):", line)
        if match and match.group(1) in SECTIONS:
            title = match.group(1)
            found[title] = ""
        elif title is not None and (line.startswith(" ") or not line):
            found[title] += line + "\n"
        else:
            title = None
    return found


def _parameters(obj: object) -> list[str]:
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            fields = dataclasses.fields(obj)
            return [f.name for f in fields if f.init and not f.name.startswith("_")]
        target: Callable[..., object] = obj.__init__  # type: ignore[misc]
    else:
        target = obj  # type: ignore[assignment]
    names = []
    for p in inspect.signature(target).parameters.values():
        if p.name in ("self", "cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


def _returns(obj: object) -> bool:
    if inspect.isclass(obj):
        return False
    annotation = inspect.signature(obj).return_annotation  # type: ignore[arg-type]
    return annotation not in (None, "None", inspect.Signature.empty)


def _raised(obj: object) -> set[str]:
    """The exception classes the code raises by name (a class: its ``__post_init__``'s)."""
    if inspect.isclass(obj):
        obj = vars(obj).get("__post_init__")
        if obj is None:
            return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))  # type: ignore[arg-type]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                names.add(exc.id)
    return names


def _problems(name: str, obj: object, owner: str | None) -> list[str]:
    """What ``obj``'s docstring lacks, one line each."""
    doc = inspect.getdoc(obj) or ""
    summary = doc.split("\n\n", 1)[0]
    if not summary or "\n" in summary:
        return [f"{name}: the summary is not one line"]
    problems = []
    sections = _sections(doc)
    wants = [] if inspect.isclass(obj) and name not in BUILT_BY_USERS else _parameters(obj)
    args = sections.get("Args", "")
    missing = [p for p in wants if not re.search(rf"^\s+{re.escape(p)}( \(.*\))?:", args, re.M)]
    if missing:
        problems.append(f"{name}: Args: does not name {missing}")
    if _returns(obj) and "Returns" not in sections and "Yields" not in sections:
        problems.append(f"{name}: no Returns:")
    unsaid = sorted(
        e for e in _raised(obj) if not re.search(rf"\b{e}\b", sections.get("Raises", ""))
    )
    if unsaid:
        problems.append(f"{name}: Raises: does not name {unsaid}")
    hook = summary.startswith("Hook ")  # called by torch's GradScaler, not by users
    if (owner is None or (owner in EXAMPLE_PER_METHOD and not hook)) and ">>>" not in sections.get(
        "Example", ""
    ):
        problems.append(f"{name}: no Example: with doctest lines")
    return problems


@pytest.mark.parametrize("name,obj,owner", PUBLIC, ids=[p[0] for p in PUBLIC])
def test_every_public_callable_documents_its_args_returns_raises_and_example(name, obj, owner):
    assert _problems(name, obj, owner) == []


def _half_documented(steps: int, *, seed: int = 0) -> int:
    """Train ``steps`` steps.

    Args:
        steps: How many.
    """
    if steps < 1:
        raise ValueError(steps)
    return steps + seed


def test_the_check_finds_an_argument_a_return_an_exception_and_an_example_unsaid():
    assert _problems("f", _half_documented, None) == [
        "f: Args: does not name ['seed']",
        "f: no Returns:",
        "f: Raises: does not name ['ValueError']",
        "f: no Example: with doctest lines",
    ]


def test_the_check_covers_the_api_page():
    names = {name for name, _, owner in PUBLIC}
    assert {"search", "load", "attach", "AmpRuntime.step", "SearchResult.to_yaml"} <= names
    assert len(PUBLIC) > 60
