"""The codebase's shape, as CI checks it: stages layered without circles (import-linter's
contracts in pyproject.toml), every module importable on its own, and no class or function
grown past what a reader takes in at once."""

import ast
import importlib
import os
import pkgutil

import pytest
from conftest import ROOT

import scalertune

#: About a screen or two: past these a class holds several roles, a function several steps.
#: Docstrings do not count: they are the documentation, not the code a reader must hold.
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60


def _modules():
    return [m.name for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.")
            if not m.name.endswith("__main__")]


def test_the_import_contracts_hold():
    from importlinter.cli import lint_imports

    before = os.getcwd()
    os.chdir(ROOT)
    try:
        assert lint_imports(config_filename="pyproject.toml") == 0
    finally:
        os.chdir(before)


@pytest.mark.parametrize("name", _modules())
def test_every_module_imports_on_its_own(name):
    importlib.import_module(name)


def _sizes():
    for folder, _, files in os.walk(os.path.dirname(scalertune.__file__)):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                        yield os.path.relpath(path, ROOT), node, lines


def _docstring_lines(node):
    """The lines of the docstrings of ``node`` and of everything defined inside it."""
    total = 0
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            total += body[0].end_lineno - body[0].lineno + 1
    return total


def test_no_class_or_function_is_too_long():
    too_long = [f"{path}:{node.lineno} {node.name} ({lines} lines)"
                for path, node, lines in _sizes()
                if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                            else MAX_FUNCTION_LINES)]
    assert not too_long, "\n".join(too_long)
