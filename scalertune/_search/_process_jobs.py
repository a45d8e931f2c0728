"""The search's jobs for processes of their own, and what each sends back: one frozen
record per kind, pickled across (:mod:`scalertune._processes`).

Every job names the factory by its spec (a function crosses by its importable name), the
seed, the device and the memory each process may take; a job's own fields say the rest. Its
:meth:`perform` runs in the child, where it loads the factory again, and returns the job's
one result as its :class:`~scalertune._processes._protocol.Final` reply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from scalertune._amp._config import AmpConfig
from scalertune._processes._protocol import Final, Reply
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord, StopRule
from scalertune._run._timing import StepTimes

if TYPE_CHECKING:
    from scalertune._diagnose._report import IslandAdvice
    from scalertune._run._preflight import Checked

#: What the forkserver imports once for the search's jobs (this module's class names the
#: job it unpickles): the modules each job runs. Never the user's code, nor anything that
#: starts CUDA.
_PRELOAD = (
    "scalertune._search._process_jobs",
    "scalertune._run._loop",
    "scalertune._run._forward",
    "scalertune._run._timing",
    "scalertune._workload._factory",
    "scalertune._workload._loader",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Job:
    """What every job of the search carries."""

    preload: ClassVar[tuple[str, ...]] = _PRELOAD

    spec: str | Callable[[], Any]
    seed: int
    device: str
    memory_gb: float | None = None


@dataclasses.dataclass(frozen=True)
class Trained(Final):
    """A run's result: its record, the watcher's findings and the stop rule's step in it."""

    record: RunRecord


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunJob(_Job):
    """``run_config``: ``config`` trained for ``steps``. ``plan`` and ``stop`` cross as they
    are: the watcher is attached in the child, and the stop rule is asked after each window
    there, so the run stops where it would in the search's process."""

    config: AmpConfig
    steps: int
    plan: Plan | None = None
    stop: StopRule | None = None

    def perform(self, send: Callable[[Reply], None], device: str) -> Trained:
        from scalertune._run._loop import run_config
        from scalertune._workload._loader import load_factory

        factory = load_factory(self.spec)
        run = run_config(
            factory,
            self.config,
            steps=self.steps,
            plan=self.plan,
            stop=self.stop,
            seed=self.seed,
            device=torch.device(device),
        )
        return Trained(run)


@dataclasses.dataclass(frozen=True)
class ForwardRatio(Final):
    """``config``'s forward loss over float32's at a checkpoint's weights."""

    ratio: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForwardJob(_Job):
    """``forward_ratio``: ``config``'s forward against float32's at ``checkpoint``'s weights
    (on ranks, a DDP or FSDP factory is called only inside its group)."""

    config: AmpConfig
    checkpoint: str

    def perform(self, send: Callable[[Reply], None], device: str) -> ForwardRatio:
        from scalertune._run._forward import forward_ratio
        from scalertune._workload._loader import load_factory

        factory = load_factory(self.spec)
        ratio = forward_ratio(
            factory, self.config, self.checkpoint, seed=self.seed, device=torch.device(device)
        )
        return ForwardRatio(ratio)


@dataclasses.dataclass(frozen=True)
class Located(Final):
    """The float32 island a forward overflow's replay advises (``None``: none found)."""

    advice: IslandAdvice | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocateJob(_Job):
    """``locate_forward_overflow``: a pruned run of ``config`` replayed, module by module,
    over the steps whose ``losses`` it recorded."""

    config: AmpConfig
    losses: tuple[float, ...]

    def perform(self, send: Callable[[Reply], None], device: str) -> Located:
        from scalertune._diagnose._locate import locate_forward_overflow
        from scalertune._workload._loader import load_factory

        factory = load_factory(self.spec)
        advice = locate_forward_overflow(
            factory, self.config, list(self.losses), seed=self.seed, device=torch.device(device)
        )
        return Located(advice)


@dataclasses.dataclass(frozen=True)
class Timing(Reply):
    """Progress of the step timing: ``dtype`` is the one it times now (if the process dies
    before the next reply, that dtype killed it)."""

    dtype: str


@dataclasses.dataclass(frozen=True)
class Timed(Final):
    """The step timing's result (``None``: nothing could be timed)."""

    times: StepTimes | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimeJob(_Job):
    """``time_dtypes``: the interleaved step time of each of ``dtypes``, with the workload's
    clipping, on a fresh workload; a :class:`Timing` reply as each dtype starts."""

    dtypes: tuple[str, ...]
    clip_norm: float | None

    def perform(self, send: Callable[[Reply], None], device: str) -> Timed:
        from scalertune._run._timing import time_dtypes
        from scalertune._workload._factory import build_workload
        from scalertune._workload._loader import load_factory

        factory, dev = load_factory(self.spec), torch.device(device)
        workload = build_workload(factory, seed=self.seed, device=dev)
        times = time_dtypes(
            workload,
            list(self.dtypes),
            device=dev,
            clip_norm=self.clip_norm,
            announce=lambda dtype: send(Timing(dtype)),
        )
        return Timed(times)


@dataclasses.dataclass(frozen=True)
class Preflighted(Final):
    """What the one float32 step found of the workload (``preflight``'s ``Checked``)."""

    checked: Checked


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreflightJob(_Job):
    """``preflight``: one float32 step of the factory, with ``islands`` checked against its
    modules."""

    islands: frozenset[str]
    #: The space's float8 recipes: what each costs each Linear layer is measured too.
    float8_recipes: tuple[str, ...] = ()
    #: Whether the ranks' copies are meant (``--independent-ranks``): not refused.
    independent_ranks: bool = False

    def perform(self, send: Callable[[Reply], None], device: str) -> Preflighted:
        from scalertune._run._preflight import preflight
        from scalertune._workload._loader import load_factory

        factory = load_factory(self.spec)
        checked = preflight(
            factory,
            device=torch.device(device),
            seed=self.seed,
            islands=set(self.islands),
            float8_recipes=self.float8_recipes,
            independent_ranks=self.independent_ranks,
        )
        return Preflighted(checked)
