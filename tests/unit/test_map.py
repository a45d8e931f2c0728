"""The map of the code is the code's: ``docs/development.md`` lists every stage and top-level
module there is and nothing else, each stage's ``__init__.py`` lists its modules, the layers
it states are pyproject's contracts, and no two stages use one module name for two things."""

import ast
import collections
import os
import re

import pytest
from conftest import ROOT

import scalertune

PACKAGE = os.path.dirname(scalertune.__file__)
#: The names stages share for one concept each: a stage's entry point (``_api``), a stage's own
#: policy numbers (``_policy``), and a training framework's name for that stage's part for it
#: (a trainer loaded as the workload, the runtime attached to the trainer).
SHARED_NAMES = {"_api", "_policy", "_accelerate", "_lightning", "_transformers"}


def _layout_block() -> list[str]:
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## The layout") :]
    return section.split("```", 2)[1].splitlines()


def _stages() -> list[str]:
    return sorted(
        name
        for name in os.listdir(PACKAGE)
        if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))
    )


def _modules(folder: str) -> set[str]:
    return {
        name[:-3] for name in os.listdir(folder) if name.endswith(".py") and name != "__init__.py"
    }


def test_the_layout_lists_every_stage_and_top_level_module_and_nothing_else():
    lines = _layout_block()
    inside = [line for line in lines if re.match(r"^  \S", line)]
    listed_stages = sorted(m.group(1) for line in inside if (m := re.match(r"^  (\w+)/\s", line)))
    listed_modules = {m.group(1) for line in inside if (m := re.match(r"^  (\w+)\.py\s", line))}
    assert lines[1] == "scalertune/"
    assert listed_stages == _stages()
    assert listed_modules == _modules(PACKAGE)
    folders = [m.group(1) for line in lines if (m := re.match(r"^([\w.]+)/(\s|$)", line))]
    assert folders[0] == "scalertune"
    assert all(os.path.isdir(os.path.join(ROOT, f)) for f in folders), folders


def test_the_stated_layers_are_the_import_contracts():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        block = re.search(r"^layers = \[(.*?)^\]", f.read(), re.S | re.M).group(1)
    layers = re.findall(r'"([^"]+)"', block)
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    stated = text[text.index("a stage imports only the stages below it (") :]
    stated = stated[: stated.index(", top to bottom)")]
    assert re.findall(r"`([^`]+)`", stated) == layers


@pytest.mark.parametrize("stage", _stages())
def test_each_stages_init_lists_its_modules(stage):
    path = os.path.join(PACKAGE, stage, "__init__.py")
    with open(path, encoding="utf-8") as f:
        docstring = ast.get_docstring(ast.parse(f.read())) or ""
    items = [line for line in docstring.splitlines() if line.startswith("- ``")]
    listed = {name for line in items for name in re.findall(r"``(_\w+)``", line.split(":")[0])}
    assert listed == _modules(os.path.dirname(path))


def test_no_two_stages_use_one_module_name_for_two_things():
    where = collections.defaultdict(list)
    for stage in _stages():
        for module in _modules(os.path.join(PACKAGE, stage)):
            where[module].append(stage)
    repeated = {
        name: stages
        for name, stages in where.items()
        if len(stages) > 1 and name not in SHARED_NAMES
    }
    assert repeated == {}
