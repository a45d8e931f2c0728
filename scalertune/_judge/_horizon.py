"""Judging for the horizon: which configs hold over it, the finalists, and the noise.

A config **holds for the horizon** when its short trial reached the target and, over a horizon
longer than a trial, its branch at every phase window stayed finite and did not fall behind
float32 (:mod:`scalertune._judge._phases`). The **finalists** are the candidates that get those
branches. The **seed spread** is how far float32's own steps to its target move from seed to
seed: two runs of one dtype whose steps to the target differ by less are tied, and a tie goes
to the simpler config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._amp._config import DEFAULTS_BASELINES
from scalertune._judge import _policy as _judge_policy
from scalertune._judge._judged import PhaseFigures
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._judge._stored import Records
from scalertune._storage._names import ROLE_BASELINE, ROLE_PHASE
from scalertune._storage._trial_record import Job, role_of

#: How a trial's records are read: a search's view keeps them (``StudyView.records``).
RecordsOf = Callable[[FrozenTrial], Records]


def phases_of(trials: Iterable[FrozenTrial], records: RecordsOf) -> dict[int, list[PhaseResult]]:
    """Run number -> how it did, window by window (finished runs only): its run from step 0
    at the windows that run reached (the stronger evidence: it supersedes a branch there),
    its branches at the others. ``trials`` are sound ones (:meth:`~scalertune._judge._view.
    StudyView.sound`: a run whose stored evidence is damaged is left out before), each read
    with ``records`` (``StudyView.records``, which reads a trial once)."""
    found: dict[int, dict[int, PhaseResult]] = {}
    for job, phase in _phase_runs(trials, records):
        windows = found.setdefault(int(job.of or 0), {})
        if phase.results is not None:  # a run from step 0, or its continuation
            windows.update({p.start: p for p in phase.results})
        elif not ((start := int(job.start or 0)) in windows and windows[start].from_start):
            windows[start] = phase.result(start, int(job.end or 0))
    return {n: sorted(w.values(), key=lambda p: p.start) for n, w in found.items() if w}


def _phase_runs(
    trials: Iterable[FrozenTrial], records: RecordsOf
) -> Iterator[tuple[Job, PhaseFigures]]:
    """The finished phase runs among ``trials`` that stored a verdict: each one's job and
    verdict (:class:`~scalertune._judge._judged.PhaseFigures`)."""
    for trial in trials:
        if role_of(trial) != ROLE_PHASE or trial.state not in (
            TrialState.COMPLETE,
            TrialState.PRUNED,
        ):
            continue
        read = records(trial)
        if read.judged.phase is not None:
            yield read.job, read.judged.phase


def holds(
    outcome: Outcome,
    phases: dict[int, list[PhaseResult]],
    windows: Sequence[tuple[int, int]],
    ruled: dict[str, RuledOut] | None = None,
) -> bool | None:
    """Whether ``outcome``'s config holds for the horizon: ``None`` while a window's branch
    has not run (``True`` at once when there are no windows: the trial is the evidence).
    A config of a dtype that another run ``ruled`` out (see :class:`RuledOut`) does not hold
    unless trained from step 0 itself."""
    if not outcome.reached:
        return False
    if not windows:
        return True
    done = {p.start: p for p in phases.get(outcome.number, [])}
    if any(not p.holds for p in done.values()):
        return False
    if ruling(outcome, list(done.values()), ruled) is not None:
        return False
    return True if all(start in done for start, _ in windows) else None


@dataclasses.dataclass(frozen=True)
class RuledOut:
    """A run that fell behind float32, and what that says of others of its dtype: at
    float32's own weights its forward was as good as float32's (``stalled``: it fell behind
    on its way, which no branch of the dtype can show), or worse by ``forward`` (the
    precision fails there, for every config of the dtype with the same float32 modules)."""

    number: int
    start: int
    end: int
    forward: float
    fp32_modules: tuple[str, ...]
    #: The checkpoint's step that forward was measured at.
    forward_at: int = 0

    @property
    def stalled(self) -> bool:
        return self.forward <= 1 + _policy.PHASE_TOLERANCE

    def covers(self, config: Any) -> bool:
        return self.stalled or tuple(config.fp32_modules) == self.fp32_modules


def ruling(
    outcome: Outcome, done: Sequence[PhaseResult], ruled: dict[str, RuledOut] | None
) -> RuledOut | None:
    """The run of another config of ``outcome``'s dtype that rules it out (``done``: its own
    windows), unless it was trained from step 0 itself."""
    rule = (ruled or {}).get(precision(outcome.config))
    if (
        rule is None
        or rule.number == outcome.number
        or not rule.covers(outcome.config)
        or any(p.from_start for p in done)
    ):
        return None
    return rule


def precision(config: Any) -> str:
    """What a run that falls behind rules out for others (:class:`RuledOut`): its dtype, and
    for float8 its recipe and the precision around it too (``float8 tensorwise in float32``):
    one massive row sets a per-tensor scale that flushes the tensor's ordinary values, where
    a per-row scale loses that row alone, so tensorwise failing says nothing of rowwise. A
    scale rounded down to a power of two moves the flush by one binade at most: it is the
    same precision."""
    if getattr(config, "float8", False):
        return f"float8 {config.float8_recipe} in {config.float8_around}"
    return str(config.dtype)


def ruled_out(trials: Iterable[FrozenTrial], records: RecordsOf) -> dict[str, RuledOut]:
    """precision (:func:`precision`: the dtype, float8's recipe too) -> the first run of it
    that fell behind float32, with its forward at float32's
    weights where it did (see :class:`RuledOut`): trained from step 0, or branched where that
    forward shows the precision failing; each phase run read with ``records``."""
    out: dict[str, RuledOut] = {}
    for job, phase in _phase_runs(trials, records):
        if phase.forward is None or job.config is None:
            continue
        if phase.results is not None:
            behind = [(p.start, p.end) for p in phase.results if p.behind and not p.nonfinite]
        else:  # a branch rules out only for the precision: its start was float32's own state
            behind = (
                [(int(job.start or 0), int(job.end or 0))]
                if (phase.forward > 1 + _policy.PHASE_TOLERANCE)
                else []
            )
        if behind:
            out.setdefault(
                precision(job.config),
                RuledOut(
                    int(job.of or 0),
                    *behind[0],
                    phase.forward,
                    tuple(job.config.fp32_modules or ()),
                    int(phase.forward_at or 0),
                ),
            )
    return out


def seed_spread(steps_by_seed: Sequence[int | None]) -> float:
    """How far float32's steps to its own target move between seeds, as a share of the
    fewest: ``(max - min) / min`` over the seeds that reached it, at least
    ``SEED_SPREAD_FLOOR``."""
    steps = [s for s in steps_by_seed if s]
    if len(steps) < 2:
        return _judge_policy.SEED_SPREAD_FLOOR
    return max(_judge_policy.SEED_SPREAD_FLOOR, (max(steps) - min(steps)) / min(steps))


def fewer_steps(a: int, b: int, spread: float) -> bool:
    """Whether ``a`` steps to the target is fewer than ``b`` beyond the seed spread."""
    return a * (1 + spread) < b


def finalists(
    candidates: Sequence[Outcome], ranking: Sequence[Outcome], clip_norm: float | None = None
) -> list[Outcome]:
    """The runs branched at the phases, at most ``PHASE_FINALISTS``: PyTorch's defaults when
    they reached the target, then the first candidate of each family (its dtype, and whether
    it clips otherwise than the workload: a clip that helps early may hurt late, so the best
    unclipped run of a dtype must be seen too), then the next candidates in order."""
    defaults = next(
        (
            o
            for o in ranking
            if o.role == ROLE_BASELINE and o.baseline in DEFAULTS_BASELINES and o.reached
        ),
        None,
    )
    chosen: list[Outcome] = [defaults] if defaults is not None else []
    families = {_family(o, clip_norm) for o in chosen}
    for c in candidates:
        if _family(c, clip_norm) not in families and all(c.config != o.config for o in chosen):
            families.add(_family(c, clip_norm))
            chosen.append(c)
    chosen += [c for c in candidates if all(c.config != o.config for o in chosen)]
    return chosen[: _policy.PHASE_FINALISTS]


def _family(outcome: Outcome, clip_norm: float | None) -> tuple[str, bool]:
    return outcome.config.dtype, outcome.config.clip_norm != clip_norm


def behind_from(results: Sequence[PhaseResult]) -> str:
    """Where a config stopped holding, in words: ``falls behind float32 by 1000-1200: 1.9x at
    1000-1200, 4.3x at 1800-2000`` (its loss over float32's, window by window), said to be
    ``trained from step 0`` where it was."""
    ran = [p for p in results if p.from_start]
    how = (
        ""
        if not ran
        else "trained from step 0, "
        if len(ran) == len(results)
        else f"trained from step 0 through {ran[-1].start}-{ran[-1].end} and branched after, "
    )
    failed = [p for p in results if not p.holds]
    if not failed:
        return f"{how}holds at every phase"
    first = failed[0]
    if first.nonfinite and first.at is not None:
        return f"{how}goes non-finite at step {first.at}" + "".join(
            f", {p.describe()}" for p in results if p is not first
        )
    verb = "goes non-finite" if first.nonfinite else "falls behind float32"
    return f"{how}{verb} by {first.start}-{first.end}: " + ", ".join(p.describe() for p in results)
