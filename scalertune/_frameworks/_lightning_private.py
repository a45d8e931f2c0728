"""Lightning's internals, in one place: what scalertune relies on that Lightning does not make
public, and the methods it overrides or sets.

No other module of the package names a private part of Lightning; each entry below is
checked against the installed Lightning by ``tests/unit/test_frameworks_private.py``, and
``pyproject.toml`` bounds lightning to the releases those tests passed on (:data:`RELEASES`,
the same for the ``pytorch_lightning`` package; checked again by :func:`check` when a Trainer
or a LightningModule is handed over). Both packages are taken: ``lightning.pytorch`` and
``pytorch_lightning``. What is relied on:

- how ``configure_optimizers()``'s return value is read, every shape Lightning accepts, with
  its defaults and its errors: ``core.optimizer._configure_optimizers`` and
  ``_configure_schedulers_automatic_opt`` (:func:`configured_optimizers`);
- what ``LightningModule.optimizers()`` reads of ``self.trainer.strategy``
  (:data:`STRATEGY_OPTIMIZERS`), for a module the search trains without a Trainer;
- the precision plugin's methods that ``_lightning.route_lightning``'s plugin overrides
  (:data:`OVERRIDDEN`), and what it sets on a Trainer (:data:`SET`);
- what the search's step loop sets on a LightningModule and calls of it
  (:data:`MODULE_SET`, :data:`MODULE_CALLED`).
"""

from __future__ import annotations

import importlib
from typing import Any

from scalertune._frameworks._releases import Releases, defining_package

RELEASES = {
    "lightning": Releases("lightning", (2, 2), (2, 7), checked="2.6"),
    "pytorch_lightning": Releases("pytorch-lightning", (2, 2), (2, 7), checked="2.6"),
}

#: The attribute of a Trainer's strategy that ``LightningModule.optimizers()`` returns.
STRATEGY_OPTIMIZERS = "_lightning_optimizers"
#: Precision plugin class -> its methods the runtime's plugin overrides.
OVERRIDDEN = {
    "Precision": ("optimizer_step", "convert_module", "forward_context"),
    "MixedPrecision": ("optimizer_step", "convert_module", "forward_context"),
}
#: What ``attach`` sets on a Trainer: the runtime's plugin, and the config's clipping.
SET = ("strategy.precision_plugin", "gradient_clip_val", "gradient_clip_algorithm")
#: What the search's step loop sets on a LightningModule (its stand-in Trainer and logging).
MODULE_SET = ("trainer", "log", "log_dict")
#: What it calls or reads of a LightningModule.
MODULE_CALLED = (
    "training_step",
    "configure_optimizers",
    "lr_scheduler_step",
    "automatic_optimization",
)

#: The private functions of ``core.optimizer`` used.
_CORE = ("_configure_optimizers", "_configure_schedulers_automatic_opt")


def package(obj: Any, base: str) -> str | None:
    """``lightning.pytorch`` or ``pytorch_lightning``: where ``obj``'s class ``base``
    (``Trainer``, ``LightningModule``) comes from; ``None`` when ``obj`` is not one."""
    found = defining_package(obj, base)
    if found == "lightning":
        return "lightning.pytorch"
    return found if found == "pytorch_lightning" else None


def check(obj: Any, base: str) -> None:
    """Refuse, in one line, a Lightning release outside the bound, or one without a name
    listed here (``obj``: a Lightning ``Trainer`` or ``LightningModule``, as ``base`` says)."""
    root = package(obj, base)
    if root is None:
        return
    releases = RELEASES[root.split(".")[0]]
    releases.check()
    core = importlib.import_module(f"{root}.core.optimizer")
    plugins = importlib.import_module(f"{root}.plugins.precision")
    missing = [f"core.optimizer.{n}" for n in _CORE if not hasattr(core, n)]
    missing += [
        f"{cls}.{name}"
        for cls, names in OVERRIDDEN.items()
        for name in names
        if not hasattr(getattr(plugins, cls, None), name)
    ]
    if missing:
        raise releases.missing(missing)


def configured_optimizers(module: Any) -> tuple[list[Any], list[Any]]:
    """The optimizers of ``module.configure_optimizers()`` and its LR schedulers' configs
    (``interval``, ``frequency``, ``monitor``, ... with Lightning's defaults), read as
    Lightning's automatic optimization reads them; Lightning's exception for a bad shape."""
    root = package(module, "LightningModule")
    core = importlib.import_module(f"{root}.core.optimizer")
    optimizers, schedulers, monitor = core._configure_optimizers(  # noqa: SLF001
        module.configure_optimizers()
    )
    configs = core._configure_schedulers_automatic_opt(schedulers, monitor)  # noqa: SLF001
    return optimizers, configs
