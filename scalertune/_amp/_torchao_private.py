"""torchao's float8 training, in one place: every name of torchao that scalertune uses, the
releases it was checked on, and the one line that says what to install.

torchao is not a dependency (``pip install 'scalertune[float8]'`` brings it): only a float8
config imports it, through :func:`torchao_float8`. No other module of the package names a part
of torchao; each entry below is checked against the installed release by
``tests/unit/test_torchao_private.py``, and ``pyproject.toml`` bounds torchao to the releases
those tests passed on (:data:`RELEASES`). What is relied on:

- ``torchao.float8.convert_to_float8_training`` (what an export's code calls);
- ``torchao.float8.Float8LinearConfig`` and its ``from_recipe_name`` (the three recipes), a
  dataclass whose fields :data:`CONFIG_FIELDS` are set (``emulate`` on a device without float8
  matmuls, ``round_scales_to_power_of_2``);
- ``torchao.float8.float8_linear.Float8Linear``, subclassed by :mod:`._float8`: its
  ``from_float`` classmethod (which builds ``cls``), its ``forward``, and the attributes
  :data:`MODULE_CONFIG` that a change of recipe sets in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import io
import logging
from types import ModuleType
from typing import Any

from scalertune._errors import UsageError
from scalertune._releases import Releases, has_path

RELEASES = Releases("torchao", (0, 13), (0, 19), checked="0.18")

#: The names scalertune uses, by module.
NAMES = {
    # the export's code and ``Export.prepare`` convert with torchao's own function
    "torchao.float8": (
        "Float8LinearConfig",
        "Float8LinearConfig.from_recipe_name",
        "convert_to_float8_training",
    ),
    "torchao.float8.float8_linear": ("Float8Linear", "Float8Linear.from_float"),
}
#: The fields of ``Float8LinearConfig`` scalertune sets.
CONFIG_FIELDS = ("emulate", "round_scales_to_power_of_2")
#: The attributes of a ``Float8Linear`` that its ``__init__`` derives from its config, and that
#: a change of recipe sets again (the gemm settings are the same for the three recipes).
MODULE_CONFIG = {
    "config": None,
    "scaling_type_input": "cast_config_input",
    "scaling_type_weight": "cast_config_weight",
    "scaling_type_grad_output": "cast_config_grad_output",
}


@functools.cache
def torchao_float8() -> tuple[ModuleType, ModuleType]:
    """``torchao.float8`` and ``torchao.float8.float8_linear``, imported once.

    torchao prints a line for each CUDA kernel library it cannot load (all of them on a CPU),
    and torch logs a deprecation of how torchao registers an enum: both kept off the user's
    terminal.

    Raises:
        UsageError: torchao is missing, outside :data:`RELEASES`, or lacks a name of
            :data:`NAMES` (one line saying what to install).
    """
    if RELEASES.installed() is None:
        raise UsageError(
            "float8 trains through torchao, which is not installed: pip install "
            f"'scalertune[float8]' (or '{RELEASES.requirement}')"
        )
    RELEASES.check()
    pytree = logging.getLogger("torch.utils._pytree")
    disabled, pytree.disabled = pytree.disabled, True
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            modules = tuple(importlib.import_module(name) for name in NAMES)
    finally:
        pytree.disabled = disabled
    missing = [
        f"{module.__name__}.{name}"
        for module, names in zip(modules, NAMES.values())
        for name in names
        if not has_path(module, name)
    ]
    config_fields = {f.name for f in dataclasses.fields(modules[0].Float8LinearConfig)}
    missing += [f"Float8LinearConfig.{f}" for f in CONFIG_FIELDS if f not in config_fields]
    if missing:
        raise RELEASES.missing(missing)
    return modules[0], modules[1]


def float8_linear_class() -> type[Any]:
    """torchao's ``Float8Linear``."""
    return torchao_float8()[1].Float8Linear  # type: ignore[no-any-return]


def linear_config(recipe: str, *, round_scales: bool | None, emulate: bool) -> Any:
    """torchao's ``Float8LinearConfig`` for ``recipe``, with ``emulate`` and, unless ``None``,
    ``round_scales_to_power_of_2``."""
    config = torchao_float8()[0].Float8LinearConfig.from_recipe_name(recipe)
    changes: dict[str, Any] = {"emulate": emulate}
    if round_scales is not None:
        changes["round_scales_to_power_of_2"] = round_scales
    return dataclasses.replace(config, **changes)


def set_module_config(module: Any, config: Any) -> None:
    """Give a ``Float8Linear`` another config (another recipe) in place, as its ``__init__``
    would have set it."""
    for attribute, source in MODULE_CONFIG.items():
        value = config if source is None else getattr(config, source).scaling_type
        setattr(module, attribute, value)
