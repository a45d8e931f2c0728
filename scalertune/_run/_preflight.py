"""One float32 step before any study row exists: a bad workload is refused in one line."""

from __future__ import annotations

from typing import Any, Callable

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._run._loop import step_function
from scalertune._workload._contract import build_workload, to_device
from scalertune._workload._loader import one_line


def check_loss(loss: Any) -> None:
    """A step's result must be a scalar tensor; say so in one line otherwise."""
    if not isinstance(loss, torch.Tensor):
        raise UsageError(
            f"the loss is a {type(loss).__name__}, not a tensor: loss_fn (or step) must "
            "return the scalar loss tensor"
        )
    if loss.dim() != 0:
        raise UsageError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar: reduce it "
            "(e.g. reduction='mean') before returning it"
        )


def preflight(factory: Callable[[], Any], *, device: torch.device, seed: int,
              islands: set[str] = frozenset()) -> AmpConfig:
    """One float32 step on a fresh workload: catches a bad loss before any study row exists.

    Also checks that every module named in ``islands`` exists. Returns the config of the
    float32 reference (float32, clipped as the workload asks).
    """
    workload = build_workload(factory, seed=seed, device=device)
    AmpRuntime(AmpConfig(fp32_modules=tuple(sorted(islands))), device=device).prepare(
        workload.model)
    amp = AmpRuntime(AmpConfig(dtype="float32"), device=device)
    batch = to_device(next(iter(workload.batches)), device)
    try:
        if workload.step is None:
            inputs, targets = batch
            check_loss(workload.loss_fn(workload.model(inputs), targets))
        loss = step_function(workload)(workload, batch, amp)
    except UsageError:
        raise
    except Exception as exc:  # the user's model, loss or step: theirs to fix
        raise UsageError(f"the first float32 training step failed: {one_line(exc)}") from None
    check_loss(loss)
    if workload.step is not None and amp.steps == 0:
        raise UsageError(
            "the step function never called amp.step(optimizer): call amp.backward(loss) "
            "and amp.step(optimizer) so the scaler and clipping run"
        )
    return AmpConfig(dtype="float32", clip_norm=workload.clip_norm)
