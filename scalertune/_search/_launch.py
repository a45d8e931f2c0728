"""The search's runs in processes of their own: one (``--isolate``), or one per rank
(``--nproc-per-node``).

Each function here sends one typed job (:mod:`scalertune._search._process_jobs`) through
:func:`scalertune._processes._launcher.launch`, which starts the processes, receives the
replies and raises a failure as the search expects it: :class:`TrialCrashed` for a process
that died, hung or ran past its time limit (:class:`RankFailed` for one rank of several), and
for a job that raised, the error it raised (``JobFailed``, a ``TrialCrashed``, for the user's
code). On ranks every rank joins one ``torch.distributed`` process group before the factory
is called (:mod:`scalertune._run._ranks`); rank 0 sends the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._processes._launcher import launch
from scalertune._processes._protocol import JobFailed, RankFailed, Reply, TrialCrashed
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord, StopRule
from scalertune._run._timing import StepTimes
from scalertune._search._process_jobs import (
    ForwardJob,
    LocateJob,
    PreflightJob,
    RunJob,
    TimeJob,
    Timing,
)

if TYPE_CHECKING:
    from scalertune._diagnose._report import IslandAdvice
    from scalertune._run._preflight import Checked


def run_isolated(
    spec: str | Callable[[], Any],
    config: AmpConfig,
    *,
    steps: int,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    plan: Plan | None = None,
    stop: StopRule | None = None,
    ranks: int = 1,
) -> RunRecord:
    """``run_config`` in a fresh process (``ranks`` of them, one per rank);
    :class:`TrialCrashed` if one fails. ``plan`` and ``stop`` cross to it as they are (its
    watcher is attached there, and what it recorded comes back in the record; the stop rule
    is asked after each window there, so the run stops where it would in this process: on
    ranks every rank asks it of the same losses, those of the global batch, and all stop
    at the same window)."""
    job = RunJob(
        spec=spec,
        config=config,
        steps=steps,
        seed=seed,
        device=str(device),
        memory_gb=memory_gb,
        plan=plan,
        stop=stop,
    )
    return launch(job, timeout_s=timeout_s, ranks=ranks).record


def forward_isolated(
    spec: str | Callable[[], Any],
    config: AmpConfig,
    checkpoint: str,
    *,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    ranks: int = 1,
) -> float:
    """``forward_ratio`` at ``checkpoint``'s weights in a fresh process (one per rank);
    :class:`TrialCrashed` if one fails."""
    job = ForwardJob(
        spec=spec,
        config=config,
        checkpoint=checkpoint,
        seed=seed,
        device=str(device),
        memory_gb=memory_gb,
    )
    return launch(job, timeout_s=timeout_s, ranks=ranks).ratio


def locate_isolated(
    spec: str | Callable[[], Any],
    config: AmpConfig,
    losses: list[float],
    *,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    ranks: int = 1,
) -> IslandAdvice | None:
    """``locate_forward_overflow`` of a pruned run, in a fresh process (one per rank);
    :class:`TrialCrashed` if one fails."""
    job = LocateJob(
        spec=spec,
        config=config,
        losses=tuple(losses),
        seed=seed,
        device=str(device),
        memory_gb=memory_gb,
    )
    return launch(job, timeout_s=timeout_s, ranks=ranks).advice


def time_isolated(
    spec: str | Callable[[], Any],
    dtypes: Sequence[str],
    *,
    clip_norm: float | None,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    ranks: int = 1,
    log: Callable[[str], None] = lambda _line: None,
) -> StepTimes | None:
    """The step timing (:func:`scalertune._run._timing.time_dtypes`) in a fresh process, on a
    fresh workload. A rank that dies or hangs is a fault of one process: the timing runs
    again, ``MAX_RETRIES`` times at most. A dtype whose kernels kill the process (an abort,
    a hang past ``timeout_s``, out of memory) is left out and the others are timed again in
    another; ``None`` when even float32 cannot be timed. What is left out, and why, is said
    through ``log``, one line each."""
    left, again = list(dtypes), 0
    while True:
        started: list[str] = []

        def note(reply: Reply, started: list[str] = started) -> None:
            if isinstance(reply, Timing):
                started.append(reply.dtype)

        job = TimeJob(
            spec=spec,
            dtypes=tuple(left),
            clip_norm=clip_norm,
            seed=seed,
            device=str(device),
            memory_gb=memory_gb,
        )
        try:
            return launch(job, timeout_s=timeout_s, ranks=ranks, progress=note).times
        except JobFailed as exc:
            log(f"the step timing failed: {str(exc).splitlines()[0]}: speed not measured")
            return None
        except TrialCrashed as exc:
            why = str(exc).splitlines()[0]
            if isinstance(exc, RankFailed) and again < _policy.MAX_RETRIES:
                again += 1
                log(f"the step timing: {why}; run again")
                continue
            running = started[-1] if started else "float32"
            if running == "float32":
                log(f"the step timing failed: {why}: speed not measured")
                return None
            log(f"the step timing of {running}: {why}: {running} left out")
            left = [d for d in left if d != running]


def preflight_ranks(
    spec: str | Callable[[], Any],
    *,
    device: torch.device,
    seed: int,
    islands: set[str],
    timeout_s: float | None,
    ranks: int,
    float8_recipes: tuple[str, ...] = (),
    independent_ranks: bool = False,
) -> Checked:
    """``preflight`` (one float32 step) in every rank; :class:`UsageError` as a rank raised
    it, a failure of the factory (an error, a hang past ``timeout_s``, a process that ended
    without a result) as :class:`~scalertune._workload._loader.FactoryError`."""
    from scalertune._workload._loader import FactoryError

    job = PreflightJob(
        spec=spec,
        islands=frozenset(islands),
        seed=seed,
        device=str(device),
        float8_recipes=float8_recipes,
        independent_ranks=independent_ranks,
    )
    try:
        return launch(job, timeout_s=timeout_s, ranks=ranks).checked
    except JobFailed as exc:  # the factory (or its first step) raised
        raise FactoryError(str(exc).splitlines()[0]) from None
    except TrialCrashed as exc:  # timed out, or its process ended without a result
        raise FactoryError(
            f"did not finish its first call and float32 step: {str(exc).splitlines()[0]}",
            raised=False,
        ) from None
