"""The codebase's shape, as CI checks it: stages layered without circles (import-linter's
contracts in pyproject.toml), no circle among the modules either, counting every import (the
ones inside functions and under ``TYPE_CHECKING`` too), every module importable on its own,
and no class or function grown past what a reader takes in at once."""

import ast
import importlib
import importlib.util
import os
import pkgutil
import re

import pytest
from conftest import ROOT

import scalertune

#: About a screen or two: past these a class holds several roles, a function several steps.
#: Docstrings do not count: they are the documentation, not the code a reader must hold; nor
#: do blank lines and lines that only close brackets (the formatter's layout).
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60


def _modules():
    return [
        m.name
        for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.")
        if not m.name.endswith("__main__")
    ]


def test_the_import_contracts_hold():
    from importlinter.cli import lint_imports

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        assert lint_imports(config_filename="pyproject.toml") == 0
    finally:
        os.chdir(before)


def _imports(name: str, path: str, modules: set[str]) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its file: at its top,
    inside a function, under ``TYPE_CHECKING``. ``from package import name`` is the module
    ``package.name`` where there is one, else the package."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.update(
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            )
    return {m for m in found if m in modules and m != name}


def _import_graph() -> dict[str, set[str]]:
    paths = {"scalertune": scalertune.__file__}
    for info in pkgutil.walk_packages(scalertune.__path__, "scalertune."):
        spec = importlib.util.find_spec(info.name)
        paths[info.name] = spec.origin
    return {name: _imports(name, path, set(paths)) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others_counting_every_import():
    """A circle of imports, even one only annotations close, means two modules that need
    each other: one concept split in two, or a concept in the wrong module."""
    graph = _import_graph()
    assert graph["scalertune._review._summary"], "the graph lost its edges"
    assert _cycles(graph) == []


def test_an_import_under_type_checking_or_in_a_function_is_an_edge(tmp_path):
    path = tmp_path / "_x.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from scalertune import _policy\n"
        "if TYPE_CHECKING:\n    from scalertune._pkg._a import A\n"
        "def f():\n    from . import _b\n    import scalertune._c\n"
    )
    modules = {
        "scalertune._policy",
        "scalertune._pkg._a",
        "scalertune._pkg._b",
        "scalertune._c",
        "scalertune._pkg",
    }
    assert _imports("scalertune._pkg._x", str(path), modules) == modules - {"scalertune._pkg"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", _modules())
def test_every_module_imports_on_its_own(name):
    importlib.import_module(name)


def _sizes():
    for folder, _, files in os.walk(os.path.dirname(scalertune.__file__)):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                tree = ast.parse(source)
                for node in ast.walk(tree):
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        lines = _code_lines(source, node)
                        yield os.path.relpath(path, ROOT), node, lines


#: A line that only closes brackets (and perhaps ends a clause): the formatter's layout.
_CLOSING = re.compile(r"^\s*[)\]}]+[,:]?\s*(#.*)?$")


def _code_lines(source, node):
    """The lines of ``node`` a reader holds: not its docstrings (nor those of what it defines),
    not blank lines, not lines that only close brackets (ruff format's layout)."""
    lines = source.splitlines()
    skip = _docstring_lines(node)
    return sum(
        1
        for number in range(node.lineno, node.end_lineno + 1)
        if number not in skip
        and lines[number - 1].strip()
        and not _CLOSING.match(lines[number - 1])
    )


def _docstring_lines(node):
    """The line numbers of the docstrings of ``node`` and of everything defined inside it."""
    found = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (
            isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            found.update(range(body[0].lineno, body[0].end_lineno + 1))
    return found


def test_no_class_or_function_is_too_long():
    too_long = [
        f"{path}:{node.lineno} {node.name} ({lines} lines)"
        for path, node, lines in _sizes()
        if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES)
    ]
    assert not too_long, "\n".join(too_long)


def test_every_package_of_the_source_tree_is_in_the_built_distribution():
    """A package missing from pyproject's list is missing from the wheel, and a wheel's
    ``scalertune search`` fails on import while an editable install hides it."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    packages = {"scalertune"} | {
        m.name for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.") if m.ispkg
    }
    assert packages - listed == set()
