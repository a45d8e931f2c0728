"""When to stop: a run that has its answer, a run that cannot win, a study that has converged.

A search is worth running only if it is cheap next to the training it protects, so nothing
trains past the point where its outcome is known:

- a run stops once it has **reached the target**: its steps to target, skipped steps and scale
  range are known then, and its step time is the study's interleaved figure for its dtype;
- a run is pruned as **slower than the best** once it can no longer reach the target before
  the best run so far, even with its dtype's step time at the fast end of its measured spread
  and the best's at the slow end (within the noise it could still tie, and ties are decided by
  stability, so it runs on); Optuna records it as pruned, with the reason;
- the **study stops** once ``STUDY_PATIENCE`` sampled trials in a row found nothing faster
  by ``STUDY_MIN_IMPROVEMENT`` (after ``STUDY_MIN_TRIALS``), or the sampler keeps proposing
  configs already run.

The float32 reference always runs in full: its last steps define the target.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from scalertune import _policy
from scalertune._judge._target import Target
from scalertune._run._record import RunRecord


@dataclasses.dataclass(frozen=True)
class Best:
    """The runs to beat: the best time to target at the slow end of its dtype's spread, and
    per dtype the fewest steps to target (within a dtype the step time is the same, so steps
    alone decide)."""

    time_high: float
    label: str
    steps: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    #: Steps to the target within this many of the best's are a tie.
    margin: float = 0.0


class StopRule:
    """After each read-back window: has this run reached the target, or can it no longer win?

    ``step_time`` is the (fast, slow) spread of the run's dtype's step time. A run is pruned
    as slower when a run of its own dtype reached the target in fewer steps than it has run
    (it can no longer even tie), or when even at the fast end of its spread it cannot reach
    the target before the best run at the slow end of that one's. Without ``best`` the run is
    only stopped at the target. ``at_target=False`` notes when the target is reached but
    trains on (to compare an early stop with the full run).

    Example:
        >>> target = Target.from_reference([10.0 - i * 0.04 for i in range(200)])
        >>> rule = StopRule(target)
        >>> record = RunRecord(config=None, seed=0, steps=200, losses=[1.0] * 10)
        >>> rule(record), record.reached_at, record.stopped
        (True, 1, 'reached')
    """

    def __init__(self, target: Target, *, step_time: tuple[float, float] | None = None,
                 best: Best | None = None, at_target: bool = True) -> None:
        self.target, self.step_time, self.best, self.at_target = target, step_time, best, at_target

    def __call__(self, record: RunRecord) -> bool:
        if record.reached_at is None:
            record.reached_at = self.target.steps_to_target(record.losses)
        if record.reached_at is not None:
            if self.at_target:
                record.stopped = "reached"
            return self.at_target
        if record.steps_run >= record.steps:
            return False  # the run is over: it never reached the target, nothing to prune
        reason = self._slower(record) if self.best is not None else None
        if reason is None:
            return False
        record.prune_kind = record.stopped = "slower"
        record.prune_reason = (f"slower than the best: not at the target after "
                               f"{record.steps_run} steps, {reason}")
        return True

    def _slower(self, record: RunRecord) -> str | None:
        best = self.best
        dtype = record.config.dtype
        if dtype in best.steps and record.steps_run >= best.steps[dtype][0] + best.margin:
            steps, label = best.steps[dtype]
            within = (f", up to {best.margin:.0f} steps more being a tie" if best.margin
                      else "")
            return f"while {label} ({dtype} too) reached it at step {steps}{within}"
        if self.step_time is None:
            return None
        if (record.steps_run + 1) * self.step_time[0] > best.time_high:
            return (f"so it cannot reach it before {best.label} ({best.time_high:.3g} s at the "
                    "slow end of its timing spread)")
        return None


def study_stop_reason(sampled: Sequence[tuple[float | None, bool]],
                      min_trials: int = _policy.STUDY_MIN_TRIALS) -> str | None:
    """Why the study should sample no more, from its sampled trials in the order they ran:
    ``(time to target or None, reused)`` each. ``None`` while more trials may help."""
    duplicates = 0
    for _, reused in reversed(sampled):
        if not reused:
            break
        duplicates += 1
    if duplicates >= _policy.MAX_CONSECUTIVE_DUPLICATES:
        return (f"the sampler proposed {duplicates} configs in a row that had already run: "
                "the space has nothing new to try")
    fresh = [time for time, reused in sampled if not reused]
    if len(fresh) < min_trials:
        return None
    best, since = float("inf"), 0
    for time in fresh:
        if time is not None and time < best * (1 - _policy.STUDY_MIN_IMPROVEMENT):
            best, since = time, 0
        else:
            best = min(best, time if time is not None else best)
            since += 1
    if since >= _policy.STUDY_PATIENCE:
        return (f"the last {since} sampled trials found no faster time to target "
                f"(stopped early after {len(fresh)})")
    return None
