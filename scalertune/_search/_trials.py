"""One trial: take the queued run or sample a config, reuse what already ran, train, judge, store.

Every run of a search but the float32 references is an Optuna trial taken with
``study.optimize`` (so Optuna's heartbeats cover it): a queued one first (a baseline, a
confirmation, a retry), otherwise a config sampled from the space. A sampled config the study
has already finished is not trained again: its result is copied and marked ``duplicate_of``.
While a run trains, its curve goes to the storage from a background thread, one point per
read-back window; the training loop never waits for a storage write.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._amp._config import DTYPES, AmpConfig
from scalertune._diagnose._islands import locate_forward_overflow
from scalertune._errors import SearchError
from scalertune._judge._outcome import Outcome, outcomes_of
from scalertune._judge._rank import Noise, time_bounds
from scalertune._judge._stopping import Best, StopRule
from scalertune._judge._target import Target
from scalertune._run._record import RunRecord
from scalertune._search._branch import run_branch
from scalertune._search._isolate import (
    TrialCrashed,
    describe_error,
    execute,
    locate_isolated,
    run_here,
)
from scalertune._search._points import fixed_params
from scalertune._search._references import References
from scalertune._search._reports import Reports
from scalertune._search._setup import Setup
from scalertune._search._space import SearchSpace
from scalertune._search._study import (
    judged_attrs,
    objective_value,
    store_constraint,
    store_curves,
    store_judged,
)
from scalertune._storage._names import (
    CONSTRAINT_ATTR,
    JUDGED_ATTR,
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_PHASE,
    ROLE_REPLAY,
    ROLE_SEARCH,
    ROLE_SURPLUS,
    TRACEBACK_ATTR,
)
from scalertune._storage._recovery import survive_lost_trial, take
from scalertune._workload._loader import FactoryError

#: A failed run's error as the dashboard shows it (its first line, cut to this length); the
#: traceback goes to a system attribute.
_ERROR_CHARS = 300
#: Trial states that hold a run: queued, running or finished (not failed).
LIVE = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)


class TrialFailed(Exception):
    """Raised out of the objective so that Optuna records the trial as failed."""


class TrialRunner:
    """Runs one trial at a time for one worker; any number of workers may share the study."""

    def __init__(self, study: optuna.Study, setup: Setup, references: References,
                 progress: Any) -> None:
        self.study, self.setup, self.references, self.progress = (
            study, setup, references, progress)
        self._failures: list[str] = []
        self._any_success = False

    def run_one(self) -> None:
        with survive_lost_trial(self.study, self.progress.line):
            self.study.optimize(self._objective, n_trials=1, catch=(TrialFailed,))

    # -- the objective ----------------------------------------------------------------------

    def _objective(self, trial: optuna.Trial) -> float:
        take(trial)
        role = trial.user_attrs.get("role")
        trials = self.study.get_trials(deepcopy=False)
        if role is None and _surplus(trials, trial.number, self.setup.n_trials):
            trial.set_user_attr("role", ROLE_SURPLUS)
            trial.set_user_attr("error", "not run: another worker took the study's last "
                                         "trial slot at the same moment")
            raise TrialFailed()
        config, seed, role = self._job(trial, role)
        if role == ROLE_SEARCH:
            original = _finished_twin(trials, config, seed, trial.number)
            if original is not None:
                return self._reuse(trial, config, original)
        target = self.references.target(seed)
        try:
            record, judged = self._train(trial, role, config, seed, target, trials)
        except Exception as exc:  # TrialCrashed, or anything the user's code raised
            self._failed(trial, exc)
            raise TrialFailed() from None
        self._any_success = True
        store_judged(trial, judged)
        store_curves(trial, record)
        store_constraint(trial, target.gap(record.losses) if role != ROLE_PHASE else 0.0)
        self.progress.finished(trial.number, _who(trial.user_attrs, seed), config, record,
                               judged)
        if record.pruned and role != ROLE_PHASE:
            raise optuna.TrialPruned(record.prune_reason)
        # float32 runs, other seeds and branches are yardsticks and evidence, not candidates:
        # never the study's best trial
        if config.dtype == "float32" or role in (ROLE_CONFIRM, ROLE_PHASE):
            return math.inf
        return objective_value(judged)

    def _job(self, trial: optuna.Trial, role: str | None) -> tuple[AmpConfig, int, str]:
        """The config, seed and role of ``trial``: sampled from the space, or queued."""
        setup = self.setup
        if role in (None, ROLE_SEARCH):
            config = setup.space.suggest(trial).with_clip(setup.clip_norm)
            for key, value in {"role": ROLE_SEARCH, "config": config.to_dict(),
                               "seed": setup.seed}.items():
                trial.set_user_attr(key, value)
            return config, setup.seed, ROLE_SEARCH
        _record_params(trial, setup.space)
        return (AmpConfig.from_dict(trial.user_attrs["config"]), int(trial.user_attrs["seed"]),
                role)

    def _train(self, trial: optuna.Trial, role: str, config: AmpConfig, seed: int,
               target: Target, trials: list[FrozenTrial]) -> tuple[RunRecord, dict[str, Any]]:
        """Run the trial's training and judge it: a short run from the start, or a branch
        from the float32 reference's checkpoint (``role`` phase)."""
        step_time = self._step_time(config)
        if role == ROLE_PHASE:
            attrs = trial.user_attrs
            start, end = int(attrs["start"]), int(attrs["end"])
            reports = Reports(trial, target)
            record = None
            try:
                record, judged = run_branch(self.setup, self.references, config, seed=seed,
                                            start=start, end=end, on_window=reports.window)
            finally:
                reports.close(record if record is not None and record.pruned else None)
            return record, {**judged_attrs(record, target, step_time), **judged}
        rule = self._stop_rule(role, config, target, trials)
        record = self._execute(config, seed, trial, target, rule, self._trial_steps(role))
        if record.prune_kind == "forward":
            self._locate_overflow(trial, config, seed, record)
        return record, judged_attrs(record, target, step_time)

    def _stop_rule(self, role: str, config: AmpConfig, target: Target,
                   trials: list[FrozenTrial]) -> StopRule:
        """Search runs, baselines, islands and the replay's choice may be pruned as slower
        than the best; confirmations and float32 with the recommendation's clipping only
        stop at their target (they must show where it is reached, not race)."""
        if role in (ROLE_CONFIRM, ROLE_FLOAT32_CLIP):
            return StopRule(target)
        if self.setup.long and role != ROLE_SEARCH:
            # the baselines and the proposed configs are finalists-to-be: a config faster to
            # the early target may fall behind later, so they must reach the target themselves
            return StopRule(target)
        times = self.references.step_times
        step_time = times.bounds(config.dtype) if times and config.dtype in times else None
        best = _best(trials, self.setup.seed, times, self.noise())
        if best is not None and self.setup.long:
            # over a long horizon a run is beaten only by its own dtype: another dtype's
            # faster start says nothing of the late phases, where it may fall behind
            best = dataclasses.replace(best, time_high=math.inf)
        return StopRule(target, step_time=step_time, best=best)

    def noise(self) -> Noise:
        """What counts as a tie in steps to the target (float32's seed spread of them)."""
        return Noise(self.references.spread(), self.setup.horizon if self.setup.long else 0)

    def _trial_steps(self, role: str) -> int:
        """How long a run from the start may train: a trial, and over a long horizon a tie's
        margin more for the runs that may become finalists, so that a config that loses a
        few steps at the start (a scale backing off) still reaches the early target."""
        if not self.setup.long or role in (ROLE_CONFIRM, ROLE_FLOAT32_CLIP):
            return self.setup.steps
        unit = _policy.READBACK_INTERVAL
        extra = math.ceil(self.noise().margin(self.setup.steps) / unit) * unit
        return min(self.setup.steps + extra, self.setup.horizon)

    def _step_time(self, config: AmpConfig) -> float | None:
        times = self.references.step_times
        return times.median(config.dtype) if times and config.dtype in times else None

    def _execute(self, config: AmpConfig, seed: int, trial: optuna.Trial, target: Target,
                 rule: StopRule, steps: int) -> RunRecord:
        reports = Reports(trial, target)
        record = None
        try:
            record = execute(self.setup, config, steps=steps, seed=seed, stop=rule,
                             on_window=reports.window)
            return record
        finally:
            reports.close(record if record is not None and record.pruned else None)

    def _reuse(self, trial: optuna.Trial, config: AmpConfig, original: FrozenTrial) -> float:
        """Finish ``trial`` with ``original``'s result: the same config already ran."""
        judged = Outcome.from_trial(original).attrs
        store_judged(trial, {k: v for k, v in judged.items()
                             if k in original.system_attrs.get(JUDGED_ATTR, {})})
        for key in ("overflow_module", "overflow_islands"):
            if key in original.user_attrs:
                trial.set_user_attr(key, original.user_attrs[key])
        trial.set_user_attr("duplicate_of", original.number)
        gap = original.system_attrs.get(CONSTRAINT_ATTR)
        if gap is not None:
            store_constraint(trial, gap)
        self.progress.line(f"#{trial.number} [{config.describe()}] is trial #{original.number}'s "
                           "config: its result is reused, nothing trained")
        self.progress.advance()
        if original.state == TrialState.PRUNED:
            raise optuna.TrialPruned(judged.get("prune_reason"))
        return float(original.value)

    def _locate_overflow(self, trial: optuna.Trial, config: AmpConfig, seed: int,
                         record: RunRecord) -> None:
        """Name the modules where the forward overflowed, and the islands checked to fix it."""
        setup = self.setup
        try:
            if setup.isolation is not None:
                advice = locate_isolated(setup.spec, config, record.losses, seed=seed,
                                         device=setup.device,
                                         timeout_s=setup.isolation.timeout_s,
                                         memory_gb=setup.isolation.memory_gb)
            else:
                advice = run_here(locate_forward_overflow, setup.factory, config,
                                  record.losses, seed=seed, device=setup.device)
        except Exception:  # the diagnosis is a courtesy; the prune reason stands without it
            return
        if advice is not None:
            trial.set_user_attr("overflow_module", advice.where)
            if advice.fixed:
                trial.set_user_attr("overflow_islands", ",".join(advice.islands))
            record.prune_reason = (f"{record.prune_reason}; the modules whose own computation "
                                   f"overflowed: {advice.where}")

    def _failed(self, trial: optuna.Trial, exc: BaseException) -> None:
        cause = exc.__cause__ if isinstance(exc, FactoryError) and exc.__cause__ else exc
        if isinstance(cause, TrialCrashed):
            message, _, trace = str(cause).partition("\n")
        else:
            message = describe_error(cause)
            trace = "".join(traceback.format_exception(cause))
        trial.set_user_attr("error", message[:_ERROR_CHARS])
        trial.storage.set_trial_system_attr(trial._trial_id, TRACEBACK_ATTR,  # noqa: SLF001
                                            trace[-4000:])
        self.progress.line(f"#{trial.number} failed: {message}")
        self._failures.append(message)
        recent = self._failures[-_policy.SAME_FAILURES_BEFORE_STOP:]
        if (not self._any_success and len(recent) == _policy.SAME_FAILURES_BEFORE_STOP
                and len(set(recent)) == 1):
            raise SearchError(
                f"the first {len(recent)} runs all failed with the same error, so the workload "
                f"is broken rather than a config: {message}"
            )
        self.progress.advance()


def _record_params(trial: optuna.Trial, space: SearchSpace) -> None:
    """Record the parameters a queued run was given, so it shows as a point of the space."""
    fixed = fixed_params(trial)
    if len(fixed) > 1:
        space.suggest(trial)
    elif "dtype" in fixed:
        trial.suggest_categorical("dtype", list(DTYPES))


def _finished_twin(trials: list[FrozenTrial], config: AmpConfig, seed: int,
                   number: int) -> FrozenTrial | None:
    """A finished run of the same config on the same seed, trained (not itself reused)."""
    for t in trials:
        attrs = t.user_attrs
        if (t.number != number and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                and attrs.get("role") in (ROLE_SEARCH, ROLE_BASELINE)
                and "duplicate_of" not in attrs and attrs.get("seed") == seed
                and AmpConfig.from_dict(attrs["config"]) == config):
            return t
    return None


def _best(trials: list[FrozenTrial], seed: int, times: Any, noise: Noise) -> Best | None:
    """The main-seed runs that reached the target soonest: overall, at the slow end of its
    timing spread, and per dtype in steps."""
    runs = [o for o in outcomes_of(trials)
            if o.role in (ROLE_SEARCH, ROLE_BASELINE, ROLE_ISLAND, ROLE_REPLAY)
            and o.seed == seed and o.reached
            and not o.reused]
    if not runs:
        return None
    steps: dict[str, tuple[int, str]] = {}
    for o in runs:
        dtype = o.config.dtype
        if dtype not in steps or o.steps_to_target < steps[dtype][0]:
            steps[dtype] = (o.steps_to_target, o.label)
    fastest = min(runs, key=lambda o: time_bounds(o, times, noise)[1])
    return Best(time_high=time_bounds(fastest, times, noise)[1], label=fastest.label,
                steps=steps, margin=noise.margin(min(s for s, _ in steps.values())))


def counted_search_trials(trials: list[FrozenTrial]) -> int:
    """Sampled trials that use up the budget: trained, running or queued, or failed on an
    error of their own (a config can fail: it was tried). Not those lost with a worker, whose
    retries count instead, nor reused duplicates. A just-asked trial has no role yet; count
    it too."""
    return sum(
        1 for t in trials
        if (t.state in LIVE or "error" in t.user_attrs) and "duplicate_of" not in t.user_attrs
        and (t.user_attrs.get("role") == ROLE_SEARCH
             or ("role" not in t.user_attrs and t.state == TrialState.RUNNING))
    )


def _surplus(trials: list[FrozenTrial], number: int, n_trials: int) -> bool:
    """Whether a freshly sampled trial is over the study's budget (a race between workers
    asking at the same moment; trials already counted are those numbered lower)."""
    return counted_search_trials([t for t in trials if t.number < number]) >= n_trials


def _who(attrs: dict[str, Any], seed: int) -> str:
    role = attrs.get("role")
    if role == ROLE_BASELINE:
        return str(attrs.get("baseline"))
    if role == ROLE_CONFIRM:
        return f"confirm #{attrs.get('confirms')} seed {seed}"
    if role == ROLE_FLOAT32_CLIP:
        return f"float32 with #{attrs.get('clip_of')}'s clipping"
    return ""

