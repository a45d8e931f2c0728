"""Workloads where float8's per-tensor scale fails: one row in 16 carries a massive value in a
feature the loss ignores (an attention-sink token, an outlier channel), so a tensorwise scale
set by it flushes every ordinary value of the tensor to zero, where a scale per row spoils
that row only.

- :func:`make_model`: the massive value is there from the start (``MASSIVE``);
- :func:`make_growing`: it grows from 1 to ``MASSIVE`` over ``GROWING_STEPS`` steps, as an
  outlier grows late in training: float8's tensorwise scale holds for the first thousands of
  steps, then fails.

The loss is the mean squared error over the ordinary rows only (each target row carries its
weight: 0 for the massive row).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

#: The massive value (an attention sink's activation reaches 1e4-1e6 in large models).
MASSIVE = 1e6
#: One row in this many carries it.
EVERY = 16
FEATURES, HIDDEN = 32, 64
BATCH = 64
#: The targets' own noise: the loss float32 can reach (a language model's loss has a floor too);
#: without it, float8's 3 significant bits set the floor (a stall at its precision).
NOISE = 0.3
GROWING_STEPS = int(os.environ.get("SCALERTUNE_FLOAT8_STEPS", "3000"))


def _weighted_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    weight = target[:, 1:]
    return ((output.float() - target[:, :1]) ** 2 * weight).sum() / weight.sum()


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )


def _batches(steps: int, massive: Callable[[int], float]) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1234)
    teacher = torch.randn(FEATURES - 1, 1, generator=generator) / (FEATURES - 1) ** 0.5
    batches = []
    for step in range(steps):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        x[:, -1] = 0.0
        rows = torch.arange(0, BATCH, EVERY)
        x[rows, -1] = massive(step)
        y = torch.tanh(3 * x[:, :-1] @ teacher) + 0.5 * (x[:, :-1] @ teacher) ** 2
        y = y + NOISE * torch.randn(BATCH, 1, generator=generator)
        weight = torch.ones(BATCH, 1)
        weight[rows] = 0.0
        batches.append((x, torch.cat([y, weight], dim=1)))
    return batches


def workload(steps: int, massive: Callable[[int], float]) -> dict:
    """``steps`` batches whose massive value at each step is ``massive(step)``."""
    model = _model()
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0),
        "loss_fn": _weighted_mse,
        "batches": _batches(steps, massive),
    }


def make_model() -> dict:
    """The massive value from the first step."""
    return workload(GROWING_STEPS, lambda step: MASSIVE)


def make_growing() -> dict:
    """The massive value growing from 1 to ``MASSIVE`` over ``GROWING_STEPS`` steps."""
    return workload(GROWING_STEPS, lambda step: MASSIVE ** (step / (GROWING_STEPS - 1)))
