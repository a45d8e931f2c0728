"""torch's internals, in one place: what scalertune relies on that torch does not make public.

No other module of the package names a private part of torch; each entry below is checked
against the installed torch by ``tests/unit/test_torch_private.py``. torch is a dependency
users bring in their own build (a CUDA one, often): :data:`RELEASES` is the range those
tests ran on, and a torch outside it is *warned* about once (:func:`check_release`), not
refused. What is relied on:

- GradScaler's live scale tensor ``_scale`` (``None`` before its first step), the
  ``_init_scale`` that tensor is made from, its on/off switch ``_enabled``,
  ``_growth_tracker`` (the steps taken since the scale last changed), and
  ``_per_optimizer_states`` (where ``unscale_`` records that it ran for an optimizer);
- ``Module._forward_pre_hooks`` (torch keeps no public list of a module's hooks);
- ``torch._foreach_norm``: the largest magnitude of many tensors in one kernel;
- ``torch._C._current_graph_task_id``: whether the autograd engine is running a backward
  now (a forward run then is activation checkpointing's recompute);
- ``torch._dynamo``, imported once by the process server before it forks.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from scalertune._releases import Releases

#: The torch releases the per-name tests passed on.
RELEASES = Releases("torch", (2, 6), (2, 15), checked="2.13")

#: GradScaler's attributes read or set, and their kinds.
SCALER_NAMES = ("_scale", "_init_scale", "_enabled", "_growth_tracker", "_per_optimizer_states")
#: A module's attribute read.
MODULE_NAMES = ("_forward_pre_hooks",)
#: torch's functions called.
TORCH_NAMES = ("_foreach_norm",)
#: torch._C's functions called.
TORCH_C_NAMES = ("_current_graph_task_id",)
#: torch's private modules a process server imports before it forks (every optimizer's
#: constructor imports the compiler stack: once there, not once per run).
PRELOADED_MODULES = ("torch._dynamo",)


def live_scale(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """GradScaler's scale as the device holds it (no sync); ``None`` before its first step."""
    return scaler._scale  # noqa: SLF001 - its live scale


def start_at(scaler: torch.amp.GradScaler, scale: float) -> None:
    """Where a scaler that has taken no step yet starts (its scale tensor is made from it)."""
    scaler._init_scale = float(scale)  # noqa: SLF001 - read when the scale tensor is made


def restart_growth(scaler: torch.amp.GradScaler) -> None:
    """Count the steps toward the next growth from zero again (on the device, no sync), as
    GradScaler does itself whenever its scale changes: a scale set from outside then grows
    ``growth_interval`` clean steps later, not sooner."""
    tracker = scaler._growth_tracker  # noqa: SLF001 - GradScaler has no public setter
    if tracker is not None:  # None before the first step: it is made at zero
        tracker.zero_()


def switch_off(scaler: torch.amp.GradScaler) -> None:
    """Disable a scaler for good: ``scale`` returns the loss as it is, ``step`` steps."""
    scaler._enabled = False  # noqa: SLF001 - GradScaler has no public switch after it is made


def switch_on(scaler: torch.amp.GradScaler) -> None:
    """Enable again a scaler made enabled and then switched off (:func:`switch_off`): its
    scale and growth tracker are where they were."""
    scaler._enabled = True  # noqa: SLF001 - GradScaler has no public switch after it is made


def optimizer_states(scaler: torch.amp.GradScaler) -> Any:
    """What ``unscale_`` and ``step`` record per optimizer (by ``id``) this step."""
    return scaler._per_optimizer_states  # noqa: SLF001 - GradScaler keeps no public record


def forward_pre_hooks(module: torch.nn.Module) -> Any:
    """A module's forward pre-hooks (an ordered mapping of id to hook)."""
    return module._forward_pre_hooks  # noqa: SLF001 - torch keeps no public list of them


def foreach_max_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's largest magnitude, in one fused kernel."""
    return list(torch._foreach_norm(tensors, float("inf")))  # noqa: SLF001 - one kernel for all


def in_backward() -> bool:
    """Whether the autograd engine runs a backward in this thread now: a module's forward
    run then is activation checkpointing recomputing it."""
    return int(torch._C._current_graph_task_id()) != -1  # noqa: SLF001 - no public test


@functools.cache
def check_release() -> None:
    """Warn once where the installed torch is outside :data:`RELEASES` (a user's own build is
    taken: only its private names may have moved)."""
    version = torch.__version__.split("+")[0]
    if not RELEASES.takes(version):
        warnings.warn(
            f"scalertune was checked on {RELEASES.requirement}; this is torch {version}: if a "
            "run fails on a torch internal, tell us or install a checked release",
            UserWarning,
            stacklevel=3,
        )
