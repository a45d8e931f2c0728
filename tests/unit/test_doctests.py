"""Every docstring example that can run does: they are the documentation's examples too."""

import doctest
import importlib
import pkgutil

import pytest

import scalertune

MODULES = [m.name for m in pkgutil.walk_packages(scalertune.__path__, "scalertune.")
           if not m.name.endswith("__main__")]


@pytest.mark.parametrize("name", ["scalertune", *MODULES])
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    found = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                            extraglobs={"scalertune": scalertune}, verbose=False)
    assert found.failed == 0
