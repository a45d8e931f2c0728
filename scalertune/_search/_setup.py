"""What one worker of a search works with: the workload, the space, the device and the horizon."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from scalertune import _limits
from scalertune._search._space import SearchSpace


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Run each trial in its own process: ``timeout_s`` and ``memory_gb`` bound it."""

    timeout_s: float | None = None
    memory_gb: float | None = None

    def __post_init__(self) -> None:
        _limits.check(_limits.SEARCH, timeout_s=self.timeout_s, memory_gb=self.memory_gb)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every trial of one worker shares."""

    spec: str | Callable[[], Any]
    factory: Callable[[], Any]
    space: SearchSpace
    device: torch.device
    steps: int
    seed: int
    n_trials: int
    #: The workload's own clipping: every run without a clip of its own uses it.
    clip_norm: float | None
    isolation: Isolation | None
    #: The steps of training the evidence covers; ``steps`` when no longer horizon is asked.
    horizon: int = 0
    #: Where the float32 reference's checkpoints go (a folder the study owns).
    checkpoints: str = ""

    @property
    def long(self) -> bool:
        """Whether the horizon goes past a trial: then the reference trains to it, and the
        finalists are branched at its phases."""
        return self.horizon > self.steps
