"""Every docstring example that can run does: they are the documentation's examples too.

One test per module that has an example to run; a module whose docstrings hold none (or only
examples marked ``+SKIP``, which need a search or a GPU) is no test case, so the count of
cases is the count of examples checked, not of modules."""

import doctest
import importlib
import pkgutil

import pytest

import scalertune

MODULES = [
    "scalertune",
    *(
        m.name
        for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.")
        if not m.name.endswith("__main__")
    ),
]
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _runnable(name: str) -> int:
    """How many examples the docstrings of module ``name`` hold that doctest runs."""
    tests = doctest.DocTestFinder().find(importlib.import_module(name), name)
    return sum(
        1 for test in tests for example in test.examples if not example.options.get(doctest.SKIP)
    )


WITH_EXAMPLES = {name: count for name in MODULES if (count := _runnable(name))}


@pytest.mark.parametrize("name", sorted(WITH_EXAMPLES))
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    found = doctest.testmod(
        module, optionflags=OPTIONS, extraglobs={"scalertune": scalertune}, verbose=False
    )
    assert found.failed == 0
    assert found.attempted == WITH_EXAMPLES[name]


def test_the_public_classes_examples_are_among_those_run():
    assert {
        "scalertune._amp._config",
        "scalertune._amp._runtime",
        "scalertune._search._space",
        "scalertune._judge._settings",
        "scalertune._replay._predict",
    } <= set(WITH_EXAMPLES)
