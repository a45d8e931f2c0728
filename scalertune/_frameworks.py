"""Searching from inside a framework: a LightningModule's own ``training_step``, unchanged.

``lightning_workload(module, batches)`` turns a LightningModule into a scalertune Workload
whose step runs ``module.training_step`` under the trial's autocast and scaler, with the
optimizer from ``module.configure_optimizers()``. No Trainer runs: each trial is the same
training_step, the same optimizer, the same data, under a different AMP config.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Iterable, Mapping

import torch

from scalertune._errors import UsageError
from scalertune._workload import Workload


def lightning_workload(module: torch.nn.Module, batches: Iterable[Any]) -> Workload:
    """A Workload that trains ``module`` (a LightningModule) through its ``training_step``.

    Example (the factory of ``scalertune search model.py:make_model``)::

        def make_model():
            module = MyLightningModule()
            return scalertune.lightning_workload(module, my_datamodule.train_dataloader())
    """
    if not callable(getattr(module, "training_step", None)) or not callable(
            getattr(module, "configure_optimizers", None)):
        raise UsageError("lightning_workload needs a LightningModule with training_step and "
                         "configure_optimizers")
    optimizer = _first_optimizer(module.configure_optimizers())
    batch_index = itertools.count()

    def step(model: torch.nn.Module, batch: Any, amp: Any) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast(), warnings.catch_warnings():
            # self.log() outside a Trainer only warns that nothing is logged
            warnings.filterwarnings("ignore", message=".*self.trainer.*")
            warnings.filterwarnings("ignore", message=".*self.log.*")
            out = model.training_step(batch, next(batch_index))
        loss = out["loss"] if isinstance(out, Mapping) else out
        amp.backward(loss)
        amp.step(optimizer)
        return loss

    return Workload(model=module, optimizer=optimizer, batches=batches, step=step)


def _first_optimizer(configured: Any) -> torch.optim.Optimizer:
    """The optimizer out of any of configure_optimizers()'s return shapes."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, Mapping) and "optimizer" in configured:
        return _first_optimizer(configured["optimizer"])
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    raise UsageError("configure_optimizers() returned no optimizer scalertune understands: "
                     "return an optimizer, a list of them, or {'optimizer': ...}")
