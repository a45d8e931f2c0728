"""Every name of torchao that scalertune uses (``scalertune/_amp/_torchao_private.py``), one
test each, on the installed release; and the bound pyproject declares."""

import dataclasses
import importlib
import pathlib

import pytest
import tomllib
import torch

from scalertune._amp import _float8
from scalertune._amp import _torchao_private as fence

pytest.importorskip("torchao")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "module, name", [(m, n) for m, names in fence.NAMES.items() for n in names]
)
def test_each_name_scalertune_uses_is_in_torchao(module, name):
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)


def test_the_config_fields_set_are_fields_of_torchaos_config():
    from torchao.float8 import Float8LinearConfig

    fields = {f.name for f in dataclasses.fields(Float8LinearConfig)}
    assert set(fence.CONFIG_FIELDS) <= fields


def test_each_recipe_is_one_torchao_names_and_its_rounding_is_torchaos_own():
    from torchao.float8 import Float8LinearConfig

    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        theirs = Float8LinearConfig.from_recipe_name(recipe)
        ours = fence.linear_config(recipe, round_scales=None, emulate=theirs.emulate)
        assert ours == theirs
    assert fence.linear_config(
        "tensorwise", round_scales=True, emulate=True
    ).round_scales_to_power_of_2


def test_from_float_builds_the_subclass_it_is_called_on_and_keeps_the_parameters():
    linear = torch.nn.Linear(32, 16)
    layer = _float8.float8_class().from_float(
        linear, config=fence.linear_config("tensorwise", round_scales=None, emulate=True)
    )
    assert type(layer) is _float8.float8_class()
    assert layer.weight is linear.weight and layer.bias is linear.bias


def test_a_recipe_set_in_place_computes_as_a_layer_built_with_it():
    """What ``__init__`` derives from the config (``MODULE_CONFIG``) is all that a change of
    recipe must set: the layer then computes exactly as one built with the new recipe."""
    from torchao.float8.float8_linear import Float8Linear

    rowwise = fence.linear_config("rowwise", round_scales=None, emulate=True)
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16)
    moved = Float8Linear.from_float(
        linear, config=fence.linear_config("tensorwise", round_scales=None, emulate=True)
    )
    for attribute in fence.MODULE_CONFIG:
        assert hasattr(moved, attribute)
    fence.set_module_config(moved, rowwise)
    built = Float8Linear.from_float(linear, config=rowwise)
    x = torch.randn(16, 32) * torch.logspace(0, 4, 16)[:, None]
    assert torch.equal(moved(x), built(x))


def test_the_bound_is_the_one_pyproject_declares_and_the_installed_release_is_inside():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert fence.RELEASES.requirement in extras["float8"]
    assert fence.RELEASES.requirement in extras["test"]
    assert fence.RELEASES.takes(fence.RELEASES.installed())
