"""When to stop: a run that has its answer, a run that cannot win, a study that has converged.

A search is worth running only if it is cheap next to the training it protects, so nothing
trains past the point where its outcome is known:

- a run stops once it has **reached the target**: its steps to target, skipped steps and scale
  range are known then, and its step time is the study's interleaved figure for its dtype;
  but where the trial is the whole horizon and float32's own loss still falls clearly after
  that step, the run trains on until float32's has settled (unless it reached the target too
  late to tie with the best), and there its smoothed loss must still be within the target's
  tolerance of float32's at the same step, else it fell **behind**: a target reached at
  step 60 of 200 on a still-falling loss settles nothing;
- a run is pruned as **slower than the best** once it can no longer reach the target before
  the best run so far, even with its dtype's step time at the fast end of its measured spread
  and the best's at the slow end (within the noise it could still tie, and ties are decided by
  stability, so it runs on); Optuna records it as pruned, with the reason. Where float32
  clipped as the run is reached the target at some step, the run is not expected there
  before that step less a tie's margin (a :class:`Floor`), and is timed from there;
- the **study stops** once ``STUDY_PATIENCE`` sampled trials in a row found nothing faster
  than the best beyond the noise (after ``STUDY_MIN_TRIALS``): a run that only ties with the
  best, within float32's seed spread of steps and the step-time spreads, is no progress
  however much faster its point estimate; at once, whatever ``STUDY_MIN_TRIALS`` says, when
  ``STUDY_TIED_TRIALS`` sampled trials in a row reached the target and none after the first of
  them was faster than the best beyond the noise (the space's knobs do not change how fast
  this workload learns); or when the sampler keeps proposing configs already run.

The float32 reference always runs in full: its last steps define the target.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from scalertune import _policy
from scalertune._judge import _policy as _judge_policy
from scalertune._judge._outcome import Outcome
from scalertune._judge._rank import surely_faster
from scalertune._judge._settings import Noise
from scalertune._judge._target import Target
from scalertune._run._record import RunRecord
from scalertune._run._step_times import StepTimes


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


@dataclasses.dataclass(frozen=True)
class Floor:
    """The fewest steps in which a run can reach the target: float32, clipped as the run is,
    reached it at step ``reached``; a lower precision learns no faster per step (its rounding
    only adds noise, a skipped step does nothing), so nothing sooner than a tie's margin
    before that, ``steps``, is expected (float32's seed spread)."""

    steps: int
    reached: int


class StopRule:
    """After each read-back window: has this run reached the target, or can it no longer win?

    ``step_time`` is the (fast, slow) spread of the run's dtype's step time. A run is pruned
    as slower when a run of its own dtype reached the target in fewer steps than it has run
    (it can no longer even tie), or when even at the fast end of its spread it cannot reach
    the target before the best run at the slow end of that one's; with ``spoiled`` (why
    float8 under the run's recipe loses a layer from the first batch on) it is pruned at its
    first window, as ``float8``. Without ``best`` the run is
    only stopped at the target. With a ``floor``, a run is not expected at the target before
    its steps, and is timed from there. ``at_target=False`` notes when the target is reached
    but trains on (to compare an early stop with the full run).

    With ``run_on``, a run that reaches the target while float32's own loss still falls
    clearly (before :attr:`~scalertune._judge._target.Target.settled_step`) trains on to that
    step, at most to its last, as Lightning's ``EarlyStopping`` waits out a loss that still
    improves by more than ``min_delta``: its steps to target stay where it reached it, and
    the steps after are evidence that it follows float32 down. If its smoothed loss is more
    than ``TARGET_TOLERANCE`` above float32's at the step it stops (paired, on the same
    batches: float32's own noisy curve may sit above the target there), it is pruned as
    ``behind``. The cost stays bounded: no run trains past the trial's steps, none past the
    step where float32 settled, and one that reached the target too late to tie with the
    best stops there.

    Example:
        >>> target = Target.from_reference([10.0 - i * 0.04 for i in range(200)])
        >>> rule = StopRule(target)
        >>> record = RunRecord(config=None, seed=0, steps=200, losses=[1.0] * 10)
        >>> rule(record), record.reached_at, record.stopped
        (True, 1, 'reached')
    """

    def __init__(
        self,
        target: Target,
        *,
        step_time: tuple[float, float] | None = None,
        best: Best | None = None,
        floor: Floor | None = None,
        at_target: bool = True,
        run_on: bool = False,
        spoiled: str | None = None,
    ) -> None:
        self.target, self.step_time, self.best, self.at_target = target, step_time, best, at_target
        self.floor, self.run_on, self.spoiled = floor, run_on, spoiled

    def __call__(self, record: RunRecord) -> bool:
        if self.spoiled is not None:  # float8 loses a layer from step 0: pruned at once
            record.prune_kind = record.stopped = "float8"
            record.prune_reason = self.spoiled
            return True
        if record.reached_at is None:
            record.reached_at = self.target.steps_to_target(record.losses)
        if record.reached_at is not None:
            if not self.at_target:
                return False
            return self._at_target(record, record.reached_at)
        if record.steps_run >= record.steps:
            return False  # the run is over: it never reached the target, nothing to prune
        reason = self._slower(record) if self.best is not None else None
        if reason is None:
            return False
        record.prune_kind = record.stopped = "slower"
        record.prune_reason = (
            f"slower than the best: not at the target after {record.steps_run} steps"
            f"{self._far(record)}, {reason}"
        )
        return True

    def _far(self, record: RunRecord) -> str:
        """Where a run pruned as slower is far from float32's loss, not merely later: what
        the table's loss column says, said in its reason too (a stalled float8 recipe reads
        "slower" otherwise, where it stopped at 4x float32's loss)."""
        ratio, at = self.target.ratio_at(record.losses)
        if not (math.isfinite(ratio) and ratio > 1 + _policy.TARGET_TOLERANCE):
            return ""
        return f" (its smoothed loss {ratio:.3g}x float32's at step {at})"

    def _at_target(self, record: RunRecord, reached: int) -> bool:
        """Stop a run that reached the target, once float32 has settled (with ``run_on``);
        prune it as ``behind`` if it trained on and is more than the target's tolerance above
        float32 at the same step there. A run that reached it later than the best can tie is
        not the answer while the best holds: it stops at the target, and the steps it trained
        say so if it ever becomes one."""
        settled = self.target.settled_step if self.run_on else None
        until = min(settled, record.steps) if settled is not None else 0
        if until and self._slower(record, soonest=reached) is not None:
            until = 0
        if record.steps_run < until:
            return False  # float32 still learns past here: the evidence is not settled yet
        ratio, at = self.target.ratio_at(record.losses)
        if until > reached and not ratio <= 1 + _policy.TARGET_TOLERANCE:
            record.prune_kind = record.stopped = "behind"
            record.prune_reason = (
                f"fell behind after reaching the target at step {reached}: at step {at}, "
                f"where float32's loss had settled, its smoothed loss is {ratio:.3g}x "
                f"float32's, more than the target's {_policy.TARGET_TOLERANCE:.0%} above it"
            )
            return True
        record.stopped = "reached"
        return True

    def _slower(self, record: RunRecord, *, soonest: int | None = None) -> str | None:
        """Why the run cannot beat the best, at the target at step ``soonest`` (by default,
        not yet there: the step after its last, or the floor's), or ``None``."""
        best = self.best
        if best is None:
            return None
        floor = ""
        if soonest is None:
            soonest = record.steps_run + 1
            if self.floor is not None and self.floor.steps > soonest:
                soonest = self.floor.steps
                floor = (
                    f"and not before step {soonest} (float32 at its clip reached it at step "
                    f"{self.floor.reached}, less the noise), "
                )
        dtype = record.config.dtype
        if dtype in best.steps and soonest > best.steps[dtype][0] + best.margin:
            steps, label = best.steps[dtype]
            within = f", up to {best.margin:.0f} steps more being a tie" if best.margin else ""
            return f"{floor}while {label} ({dtype} too) reached it at step {steps}{within}"
        if self.step_time is not None and soonest * self.step_time[0] > best.time_high:
            return (
                f"{floor}so it cannot reach it before {best.label} ({best.time_high:.3g} s at "
                "the slow end of its timing spread)"
            )
        return None


def study_stop_reason(
    sampled: Sequence[Outcome],
    times: StepTimes | None,
    noise: Noise,
    *,
    min_trials: int = _policy.STUDY_MIN_TRIALS,
    tied_trials: int | None = _policy.STUDY_TIED_TRIALS,
) -> str | None:
    """Why the study should sample no more, from its sampled runs in the order they ran
    (``times`` and ``noise``: what is faster beyond the noise, see
    :func:`~scalertune._judge._rank.surely_faster`); ``None`` while more trials may help.
    ``tied_trials=None`` turns off the stop on a run of trials that reached the target
    without progress."""
    duplicates = 0
    for outcome in reversed(sampled):
        if not outcome.reused:
            break
        duplicates += 1
    if duplicates >= _judge_policy.MAX_CONSECUTIVE_DUPLICATES:
        return (
            f"the sampler proposed {duplicates} configs in a row that had already run: "
            "the space has nothing new to try"
        )
    # a float8 config pruned on the first batch's evidence (a layer its recipe spoils) trained
    # a window at most: a verdict known before it ran, no sign that sampling is spent (a new
    # user's Llama, its recipes each spoiling a layer, stopped after 6 such trials, before
    # the one that kept both layers out and held)
    fresh = [o for o in sampled if not o.reused and o.prune_kind != "float8"]
    best: Outcome | None = None
    # since: trials since the last progress; streak: trials in a row that reached the target,
    # the first of them possibly progress, none after it
    since = streak = 0
    for outcome in fresh:
        if outcome.reached and (best is None or surely_faster(outcome, best, times, noise)):
            best, since, streak = outcome, 0, 1
            continue
        since += 1
        streak = streak + 1 if outcome.reached else 0
        if best is not None and outcome.time_to_target < best.time_to_target:
            best = outcome  # a tie with a better estimate: the yardstick, but no progress
    if tied_trials and streak >= tied_trials:
        return (
            f"the last {streak} sampled trials all reached the target, none faster than "
            f"the best beyond the noise (stopped early after {len(fresh)})"
        )
    if len(fresh) >= min_trials and since >= _judge_policy.STUDY_PATIENCE and best is None:
        return (  # no time to target to beat: none reached it
            f"none of the last {since} sampled trials reached the target (stopped early after "
            f"{len(fresh)})"
        )
    if len(fresh) >= min_trials and since >= _judge_policy.STUDY_PATIENCE:
        return (
            f"the last {since} sampled trials found no faster time to target beyond the "
            f"noise (stopped early after {len(fresh)})"
        )
    return None
