"""Pruning savings: a search whose configs mostly go non-finite, with and without pruning.

The same configs run twice, interleaved: pruned as a search prunes them, and to full length
(what a search without pruning would spend). Also: how many steps a non-finite run trains
past its first non-finite step before the check at the end of its read-back window stops it.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

from scalertune import AmpConfig
from scalertune._run._loop import run_config

STEPS = 200


class _Overflowing(nn.Module):
    """Activations of ~1e5: float16 overflows in the forward pass at every loss scale, and
    only bfloat16 trains it."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 64), nn.Linear(64, 1)
        with torch.no_grad():
            self.up.weight.mul_(3e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x) / 1e5)


def overflowing() -> dict[str, Any]:
    model = _Overflowing()
    w = torch.randn(8, 1)
    batches = [(x, x @ w) for x in (torch.randn(32, 8) for _ in range(4))]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.01),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


def configs(n: int = 10) -> list[AmpConfig]:
    """What the default space samples: float16 with random scaler knobs, some bfloat16."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        if i % 5 == 4:
            out.append(AmpConfig(dtype="bfloat16"))
        else:
            out.append(
                AmpConfig(
                    init_scale=2.0 ** rng.randint(-8, 24),
                    growth_factor=rng.uniform(1.25, 4),
                    backoff_factor=rng.uniform(0.125, 0.75),
                    growth_interval=rng.randint(10, 5000),
                )
            )
    return out


def measure() -> dict[str, Any]:
    cpu = torch.device("cpu")
    pruned_s = full_s = 0.0
    past: list[int] = []
    n_pruned = 0
    for config in configs()[:2]:  # the first runs pay for autocast's and oneDNN's warm-up
        run_config(overflowing, config, steps=STEPS, seed=0, device=cpu)
    for config in configs():
        t0 = time.perf_counter()
        record = run_config(overflowing, config, steps=STEPS, seed=0, device=cpu)
        pruned_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        run_config(overflowing, config, steps=STEPS, seed=0, device=cpu, prune=False)
        full_s += time.perf_counter() - t0
        if record.pruned:
            n_pruned += 1
            past.append(record.steps_run - 1 - record.first_nonfinite_step)
    return {
        "configs": len(configs()),
        "pruned": n_pruned,
        "pruned_s": pruned_s,
        "full_s": full_s,
        "saving": full_s / pruned_s,
        "steps_past_first_nonfinite_max": max(past) if past else 0,
        "steps_past_first_nonfinite_median": statistics.median(past) if past else 0,
    }


if __name__ == "__main__":
    print(measure(), file=sys.stdout)
