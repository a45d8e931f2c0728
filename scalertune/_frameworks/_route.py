"""Which runtime a framework's forward and backward go through.

A framework runs the forward and the backward itself (Accelerate's ``backward``, a Hugging
Face Trainer's ``training_step``). A :class:`Route` points them at an
:class:`~scalertune.AmpRuntime`: the attached one in training (``scalertune.attach``), or,
during a search, the run's own, set again by every step the search takes (the start-up probe
passes one of its own), so the framework's code runs under whichever config is being tried.

The forward goes through the runtime's autocast, and its floating outputs come back in
float32, as Accelerate's mixed precision returns them: a loss computed from the outputs
outside the model (a Trainer's ``compute_loss``, a loss in the training loop) runs in float32,
as it does on a GPU under ``fp16=True``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from scalertune._amp._runtime import AmpRuntime

#: The attribute that marks a module (or an Accelerator) as routed through a runtime.
ROUTE_ATTR = "_scalertune_route"


def _float32(value: Any) -> Any:
    """``value`` with its float16 and bfloat16 tensors cast to float32 (nested tuples, lists,
    mappings and Hugging Face's ``ModelOutput`` included: Accelerate's own conversion)."""
    from accelerate.utils import convert_to_fp32

    return convert_to_fp32(value)


class Route:
    """The runtime a framework's forward and backward run under (see the module's docstring)."""

    def __init__(self, amp: AmpRuntime | None = None) -> None:
        self.amp = amp

    def runtime(self) -> AmpRuntime:
        if self.amp is None:
            raise RuntimeError("no runtime is routed yet: scalertune sets it before a step")
        return self.amp

    def wrap_forward(self, module: torch.nn.Module) -> None:
        """Run ``module``'s forward under the routed runtime's autocast (once per module)."""
        if getattr(module, ROUTE_ATTR, None) is self:
            return
        original: Callable[..., Any] = module.forward
        route = self

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            amp = route.runtime()
            if amp.config.dtype == "float32":
                return original(*args, **kwargs)
            with amp.autocast():
                output = original(*args, **kwargs)
            return _float32(output)

        module.forward = forward
        setattr(module, ROUTE_ATTR, self)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The routed runtime's backward (``scaler.scale(loss).backward()``)."""
        self.runtime().backward(loss, **kwargs)
