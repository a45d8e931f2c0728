"""The factory contract: what ``make_model()`` returns, checked, seeded and moved to the device.

The factory contract: ``make_model()`` returns a :class:`Workload` or a mapping with

- ``model``: an ``nn.Module`` with trainable parameters;
- ``optimizer``: a ``torch.optim.Optimizer`` over that model's parameters;
- ``loss_fn(output, target) -> scalar tensor`` (optional when ``step`` is given);
- ``batches``: a re-iterable of ``(inputs, targets)`` (a list, a DataLoader), not empty;
- ``step(model, batch, amp) -> loss`` (optional): the user's own AMP step body, written
  against the same :class:`~scalertune.AmpRuntime` that training code uses afterwards;
- ``clip_norm`` (optional): the gradient-clipping norm the user's float32 training already
  uses. The float32 reference clips with it; a model that explodes without clipping has no
  unclipped float32 run to compare with;
- ``schedulers`` (optional): the learning-rate schedulers (anything with ``state_dict()`` and
  ``load_state_dict()``) a ``step`` function steps, so that a checkpoint of the float32
  reference restarts the schedule where it was;
- ``horizon`` (optional): how many steps the user's training runs: what the search's evidence
  must cover when no ``horizon`` is given to it.

scalertune seeds Python's, NumPy's and torch's RNGs and calls the factory afresh for every run,
so every trial starts from the same weights and sees the same data order.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from scalertune._errors import UsageError
from scalertune._text import shown_type
from scalertune._workload._rng import kept_rng

StepFn = Callable[[torch.nn.Module, Any, Any], torch.Tensor]


@dataclasses.dataclass
class Workload:
    """What a factory returns: the model, its optimizer, the loss and the data.

    scalertune seeds Python's, NumPy's and torch's RNGs and calls the factory afresh for
    every run, so every trial starts from the same weights and sees the same data order. A
    mapping with the same keys is taken as well.

    Args:
        model: An ``nn.Module`` with trainable parameters.
        optimizer: A ``torch.optim.Optimizer`` built on that model's parameters.
        batches: A re-iterable of ``(inputs, targets)`` (a list, a DataLoader), not empty
            and not a one-shot iterator.
        loss_fn: ``loss_fn(output, target)`` returns a scalar tensor; optional when ``step``
            is given.
        step: ``step(model, batch, amp)`` returns the loss: your own AMP step body, written
            against the same :class:`AmpRuntime` that training code uses afterwards (it calls
            ``amp.backward`` and ``amp.step``); ``None`` for the canonical step.
        clip_norm: The gradient-clipping norm your float32 training already uses: the float32
            reference clips with it (a model that explodes without clipping has no unclipped
            float32 run to compare with); ``None`` for none.
        schedulers: The LR schedulers (anything with ``state_dict()`` and
            ``load_state_dict()``) a ``step`` function steps, so that a checkpoint of the
            float32 reference restarts the schedule where it was.
        horizon: How many steps your training runs: what the search's evidence must cover
            when no ``horizon`` is given to it; ``None`` for the trial's ``steps``.

    Example:
        >>> import torch, scalertune
        >>> def make_model():
        ...     model = torch.nn.Linear(4, 1)
        ...     batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
        ...     return scalertune.Workload(
        ...         model=model,
        ...         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...         loss_fn=torch.nn.functional.mse_loss,
        ...         batches=batches,
        ...     )
        >>> make_model().model.out_features
        1
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterable[Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    step: StepFn | None = None
    clip_norm: float | None = None
    schedulers: Sequence[Any] = ()
    horizon: int | None = None


_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))


def from_result(result: Any) -> Workload:
    """A factory's :class:`Workload`, or the one its mapping describes."""
    if isinstance(result, Workload):
        return result
    if not isinstance(result, Mapping):
        raise UsageError(
            f"the factory returned {shown_type(result)}: return a scalertune.Workload "
            f"or a dict with keys {', '.join(_FIELDS)}"
        )
    unknown = sorted(set(result) - set(_FIELDS))
    if unknown:
        raise UsageError(
            f"the factory returned unknown key(s) {', '.join(map(repr, unknown))}: "
            f"use {', '.join(_FIELDS)}"
        )
    missing = [k for k in ("model", "optimizer", "batches") if k not in result]
    if missing:
        raise UsageError(
            f"the factory's result lacks {', '.join(missing)}: return all of "
            "model, optimizer, batches and loss_fn (or step)"
        )
    return Workload(**result)


def check_workload(w: Workload) -> None:
    """Refuse, in one line, a workload that breaks the contract."""
    if not isinstance(w.model, torch.nn.Module):
        raise UsageError(f"'model' is a {type(w.model).__name__}: return a torch.nn.Module")
    if not isinstance(w.optimizer, torch.optim.Optimizer):
        raise UsageError(
            f"'optimizer' is a {type(w.optimizer).__name__}: return a torch.optim.Optimizer"
        )
    trainable = [p for p in w.model.parameters() if p.requires_grad]
    if not trainable:
        raise UsageError("the model has no trainable parameters: nothing to train")
    model_params = {id(p) for p in w.model.parameters()}
    if any(id(p) not in model_params for g in w.optimizer.param_groups for p in g["params"]):
        raise UsageError(
            "the optimizer holds parameters that are not the model's: build it on "
            "model.parameters() inside the factory"
        )
    if w.step is None and w.loss_fn is None:
        raise UsageError("the factory's result has neither 'loss_fn' nor 'step': give one")
    for name in ("loss_fn", "step"):
        value = getattr(w, name)
        if value is not None and not callable(value):
            raise UsageError(f"'{name}' is a {type(value).__name__}: it must be callable")
    if w.clip_norm is not None and (
        isinstance(w.clip_norm, bool)
        or not isinstance(w.clip_norm, (int, float))
        or not w.clip_norm > 0
    ):
        raise UsageError(f"'clip_norm' must be a positive number or None, got {w.clip_norm!r}")
    if w.horizon is not None and (
        isinstance(w.horizon, bool) or not isinstance(w.horizon, int) or w.horizon < 1
    ):
        raise UsageError(
            f"'horizon' must be a positive integer (the steps your training runs) "
            f"or None, got {w.horizon!r}"
        )
    bad = [
        s for s in w.schedulers if not (hasattr(s, "state_dict") and hasattr(s, "load_state_dict"))
    ]
    if bad:
        raise UsageError(
            f"'schedulers' holds a {type(bad[0]).__name__}, which has no "
            "state_dict()/load_state_dict(): give the LR schedulers themselves"
        )
    if w.step is not None and len(inspect.signature(w.step).parameters) != 3:
        raise UsageError("'step' must take (model, batch, amp) and return the loss")
    try:
        iterator = iter(w.batches)
    except TypeError:
        raise UsageError(
            f"'batches' is a {type(w.batches).__name__}: return a list or a DataLoader"
        ) from None
    if iterator is w.batches:
        raise UsageError(
            "'batches' is a one-shot iterator: return a list or a DataLoader that can be "
            "iterated again for every epoch"
        )
    with kept_rng():  # a DataLoader draws from torch's RNG as a pass begins: not this one
        first = next(iterator, _EMPTY)
    if first is _EMPTY:
        raise UsageError("'batches' is empty: return at least one (inputs, targets) batch")


_EMPTY = object()


def to_device(obj: Any, device: torch.device) -> Any:
    """Move the tensors in a batch (nested tuples, lists, dicts) to ``device``; the common
    batch, a pair of tensors, without the walk (a visible share of a small model's step)."""
    if type(obj) is tuple and len(obj) == 2:
        x, y = obj
        if type(x) is torch.Tensor and type(y) is torch.Tensor:
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj
