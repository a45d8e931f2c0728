"""What one worker of a search works with: the workload, the space, the device and the horizon."""

from __future__ import annotations

import dataclasses
import platform
from typing import Any, Callable

import torch

from scalertune import _limits
from scalertune._amp._device import resolve_device
from scalertune._errors import ParameterError, UsageError
from scalertune._run._preflight import preflight
from scalertune._search._space import SearchSpace
from scalertune._storage._store import normalized
from scalertune._text import plural
from scalertune._workload._loader import FactoryError, factory_name, load_factory


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
    #: Where the study's artifacts go, as given (a folder or ``s3://BUCKET``); ``None``: the
    #: study's recorded place, else beside its storage (:mod:`scalertune._storage._store`).
    artifact_dir: str | None = None

    @property
    def long(self) -> bool:
        """Whether the horizon goes past a trial: then the reference trains to it, and the
        finalists are branched at its phases."""
        return self.horizon > self.steps


def prepare(factory: str | Callable[[], Any], *, space: str | SearchSpace,
            fp32_modules: str | None, n_trials: int, steps: int, horizon: int | None,
            seed: int, device: str | None, timeout: float | None,
            isolation: Isolation | None, artifact_dir: str | None,
            ) -> tuple[Setup, dict[str, Any]]:
    """Everything a search checks before it writes anything: its numbers, its space, the
    device, the factory and one float32 step of it; the setup and the study's settings."""
    _limits.check(_limits.SEARCH, n_trials=n_trials, steps=steps, horizon=horizon, seed=seed,
                  timeout=timeout)
    location = None if artifact_dir is None else normalized(artifact_dir)
    space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    if fp32_modules:
        space = space.with_islands(fp32_modules)
    dev = resolve_device(device)
    user_factory = load_factory(factory, isolated=isolation is not None)
    try:
        checked = preflight(user_factory, device=dev, seed=seed, islands=space.island_names)
    except FactoryError as exc:
        raise UsageError(f"the factory {factory_name(factory)} raised {exc}: fix it and "
                         "rerun") from None
    if horizon is None and checked.horizon is not None:
        horizon = _declared_horizon(checked.horizon, factory_name(factory), steps)
    horizon = horizon or steps
    if horizon < steps:
        raise ParameterError("horizon", f"must be at least steps ({steps}): it is the "
                             f"training the evidence covers, at least one trial; got {horizon}")
    setup = Setup(spec=factory, factory=user_factory, space=space, device=dev, steps=steps,
                  seed=seed, n_trials=n_trials, clip_norm=checked.reference.clip_norm,
                  isolation=isolation, horizon=horizon,
                  artifact_dir=location)
    settings = {
        "factory": factory_name(factory), "steps": steps, "horizon": horizon, "seed": seed,
        "space": space.to_dict(), "device_type": dev.type, "device": describe_device(dev),
        "reference": checked.reference.to_dict(),
    }
    return setup, settings


def _declared_horizon(horizon: int, factory: str, steps: int) -> int:
    """The horizon the factory declares, held to the same range as ``--horizon``."""
    try:
        _limits.check(_limits.SEARCH, horizon=horizon)
    except ParameterError as exc:
        raise UsageError(f"the factory {factory} declares horizon {horizon}, which "
                         f"{exc.problem.split(', got')[0]}: declare another, or pass "
                         "--horizon") from None
    if horizon < steps:
        raise UsageError(f"the factory {factory} declares horizon {horizon}, shorter than a "
                         f"trial's {steps} steps (--steps): declare at least {steps}, or pass "
                         "--horizon (or a smaller --steps)")
    return horizon


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"{device.type} ({platform.machine()}, {plural(threads, 'thread')})"
