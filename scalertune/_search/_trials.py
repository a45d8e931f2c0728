"""One trial: take the queued run or sample a config, reuse what already ran, train, judge, store.

Every run of a search but the float32 references is an Optuna trial taken with
``study.optimize`` (so Optuna's heartbeats cover it): a queued one first (a baseline, a
confirmation, a retry), otherwise a config sampled from the space. A sampled config the study
has already finished is not trained again: its result is copied and marked ``duplicate_of``.
While a run trains, its curve goes to the storage from a background thread, one point per
read-back window, written together at most once a second; the training loop never waits for
a storage write.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune._amp._config import AmpConfig
from scalertune._errors import MissingEvidence, SearchError
from scalertune._judge._judged import Judged, PhaseFigures, store
from scalertune._judge._stopping import StopRule
from scalertune._judge._target import Target
from scalertune._judge._view import StudyView
from scalertune._processes._hosts import HostLost
from scalertune._processes._protocol import RankFailed, TrialCrashed, describe_error
from scalertune._run._record import RunRecord
from scalertune._search import _policy as _search_policy
from scalertune._search._branch import run_branch, run_from_start
from scalertune._search._isolate import execute
from scalertune._search._references import References
from scalertune._search._reports import Reports
from scalertune._search._reuse import locate_overflow, reuse
from scalertune._search._rules import Rules
from scalertune._search._setup import Setup
from scalertune._search._space import SearchSpace
from scalertune._search._study import (
    judged_of,
    objective_value,
    store_constraint,
    store_curves,
)
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_PHASE,
    ROLE_SEARCH,
    ROLE_SURPLUS,
    TRACEBACK_ATTR,
)
from scalertune._storage._optuna import fixed_params, set_system_attr, storage_of, trial_id
from scalertune._storage._outage import outage_behind, storage_error
from scalertune._storage._recovery import retry, survive_lost_trial, take
from scalertune._storage._trial_record import Job, Marks, Retry, role_of
from scalertune._workload._loader import FactoryError

#: A failed run's error as the dashboard shows it (its first line, cut to this length); the
#: traceback goes to a system attribute.
_ERROR_CHARS = 300
#: Trial states that hold a run: queued, running or finished (not failed).
LIVE = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
#: A trial asked for and not yet ended: one with no role yet is a sampled one.
_UNSTARTED = (TrialState.WAITING, TrialState.RUNNING)


class TrialFailed(Exception):
    """Raised out of the objective so that Optuna records the trial as failed."""


class TrialRunner:
    """Runs one trial at a time for one worker; any number of workers may share the study."""

    def __init__(
        self, view: StudyView, setup: Setup, references: References, progress: Any
    ) -> None:
        self.view, self.study = view, view.study
        self.setup, self.references, self.progress = setup, references, progress
        self.rules = Rules(setup, references, view)
        self._failures: list[str] = []
        self._any_success = False

    def run_one(self) -> None:
        with survive_lost_trial(self.study, self.progress.line):
            try:
                self.study.optimize(self._objective, n_trials=1, catch=(TrialFailed,))
            except Exception as exc:
                behind = outage_behind(exc)
                if behind is not None:
                    raise behind from None
                raise

    # -- the objective ----------------------------------------------------------------------

    def _objective(self, trial: optuna.Trial) -> float:
        take(trial)
        role = role_of(trial)
        trials = self.view.trials()
        if (
            role is None
            and not _a_retry(trials, trial.number)
            and _surplus(self.view, trials, trial.number, self.setup.n_trials)
        ):
            Job(role=ROLE_SURPLUS).write(trial)
            Marks(
                error="not run: another worker took the study's last trial slot at the same moment"
            ).write(trial)
            raise TrialFailed()
        config, seed, role = self._job(trial, role)
        if role == ROLE_SEARCH:
            original = _finished_twin(self.view, trials, config, seed, trial.number)
            if original is not None:
                return reuse(trial, config, original, self.progress)
        target = self.references.target(seed)
        try:
            record, judged = self._train(trial, role, config, seed, target, trials)
        except MissingEvidence as exc:  # never the config's failure: run again
            self._missing(trial, str(exc))
            if isinstance(exc, HostLost):  # a rank on another host is gone: the search ends
                raise
            raise TrialFailed() from None
        except RankFailed as exc:  # one rank died or hung: a fault, not the config's
            self._missing(trial, str(exc).splitlines()[0])
            raise TrialFailed() from None
        except Exception as exc:  # TrialCrashed, or anything the user's code raised
            if storage_error(exc):  # a write the storage refused: not the config's either
                self._missing(trial, f"the storage failed: {describe_error(exc)}")
            else:
                self._failed(trial, exc)
            raise TrialFailed() from None
        self._any_success = True
        store(trial, judged)
        store_curves(trial, record)
        store_constraint(trial, target.gap(record.losses) if role != ROLE_PHASE else 0.0)
        self.progress.finished(
            trial.number, _who(Job.of_trial(trial), seed), config, record, judged
        )
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
            Job(role=ROLE_SEARCH, config=config, seed=setup.seed).write(trial)
            return config, setup.seed, ROLE_SEARCH
        _record_params(trial, setup.space)
        job = Job.of_trial(trial)
        if job.config is None or job.seed is None:
            raise MissingEvidence(f"queued trial #{trial.number} names no config and seed")
        return job.config, job.seed, role

    def _train(
        self,
        trial: optuna.Trial,
        role: str,
        config: AmpConfig,
        seed: int,
        target: Target,
        trials: list[FrozenTrial],
    ) -> tuple[RunRecord, Judged]:
        """Run the trial's training and judge it: a short run from the start, or (``role``
        phase) a branch from the float32 reference's checkpoint or a run from step 0 to the
        horizon (``start`` 0)."""
        step_time = self.rules.step_time(config)
        if role == ROLE_PHASE:
            record, phase, own_steps = _phase_run(
                self.setup, self.references, trial, config, seed, target, log=self.progress.line
            )
            # the short trial's target means nothing in a window starting at step `start`:
            # its figures are left off where a phase's verdict is stored
            judged = judged_of(record, target, step_time)
            figures = judged.figures
            if own_steps is not None:
                figures = dataclasses.replace(figures, steps_run=own_steps)
            return record, dataclasses.replace(
                judged, figures=figures, phase=phase, initial_scale=record.initial_scale
            )
        rule = self.rules.stop_rule(role, config, target, trials)
        record = _short_run(
            self.setup, config, seed, trial, target, rule, self.rules.trial_steps(role)
        )
        if record.prune_kind == "forward":
            locate_overflow(self.setup, trial, config, seed, record)
        return record, judged_of(record, target, step_time)

    def _missing(self, trial: optuna.Trial, why: str) -> None:
        """A run that could not get its evidence: it is queued again (at most
        ``MAX_RETRIES`` times), and says why; its trial fails without an error of its own."""
        Marks(missing=why[:_ERROR_CHARS]).write(trial)
        frozen = storage_of(self.study).get_trial(trial_id(trial))
        queued = retry(self.study, frozen)
        self.progress.line(
            f"#{trial.number}: evidence missing: {why}: "
            + (
                "queued again"
                if queued
                else "retried enough: rerun the same command once the cause is fixed"
            )
        )
        if queued:
            self.progress.grow(1)

    def _failed(self, trial: optuna.Trial, exc: BaseException) -> None:
        cause = exc.__cause__ if isinstance(exc, FactoryError) and exc.__cause__ else exc
        if isinstance(cause, TrialCrashed):
            message, _, trace = str(cause).partition("\n")
        else:
            message = describe_error(cause)
            trace = "".join(traceback.format_exception(cause))
        Marks(error=message[:_ERROR_CHARS]).write(trial)
        set_system_attr(trial, TRACEBACK_ATTR, trace[-4000:])
        self.progress.line(f"#{trial.number} failed: {message}")
        self._failures.append(message)
        recent = self._failures[-_search_policy.SAME_FAILURES_BEFORE_STOP :]
        if (
            not self._any_success
            and len(recent) == _search_policy.SAME_FAILURES_BEFORE_STOP
            and len(set(recent)) == 1
        ):
            raise SearchError(
                f"the first {len(recent)} runs all failed with the same error, so the workload "
                f"is broken rather than a config: {message}"
            )
        self.progress.advance()


def _short_run(
    setup: Setup,
    config: AmpConfig,
    seed: int,
    trial: optuna.Trial,
    target: Target,
    rule: StopRule,
    steps: int,
) -> RunRecord:
    """A trial's own run from step 0, its curve written while it trains."""
    reports = Reports(trial, target)
    record = None
    try:
        record = execute(setup, config, steps=steps, seed=seed, stop=rule, on_window=reports.window)
        return record
    finally:
        reports.close(record if record is not None and record.pruned else None)


def _phase_run(
    setup: Setup,
    references: References,
    trial: optuna.Trial,
    config: AmpConfig,
    seed: int,
    target: Target,
    *,
    log: Callable[[str], None],
) -> tuple[RunRecord, PhaseFigures, int | None]:
    """A phase's run: a branch from the float32 reference's checkpoint at its ``start``, or a
    run from step 0 (``start`` 0, or a continuation of one) judged at every window; the
    record, its verdict, and the steps a continuation trained itself."""
    job = Job.of_trial(trial)
    start, end = int(job.start or 0), int(job.end or 0)
    reports = Reports(trial, target)
    record = None
    try:
        if job.from_start:
            record, phase, own_steps = run_from_start(
                setup,
                references,
                config,
                seed=seed,
                end=end,
                on_window=reports.window,
                save=job.save,
                continues=job.continues,
                resumed_at=start,
                log=lambda line: log(f"#{trial.number}: {line}"),
            )
        else:
            own_steps = None
            record, phase = run_branch(
                setup, references, config, seed=seed, start=start, end=end, on_window=reports.window
            )
    finally:
        reports.close(record if record is not None and record.pruned else None)
    return record, phase, own_steps


def _record_params(trial: optuna.Trial, space: SearchSpace) -> None:
    """Record the parameters a queued run was given, so it shows as a point of the space."""
    fixed = fixed_params(trial)
    if len(fixed) > 1:
        space.suggest(trial)
    elif "dtype" in fixed:
        trial.suggest_categorical("dtype", space.dtype_choices)


def _finished_twin(
    view: StudyView, trials: list[FrozenTrial], config: AmpConfig, seed: int, number: int
) -> FrozenTrial | None:
    """A finished run of the same config on the same seed, trained (not itself reused), among
    ``trials`` whose evidence is sound (each read once, by ``view``)."""
    for t in view.sound(trials)[0]:
        if (
            t.number != number
            and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and role_of(t) in (ROLE_SEARCH, ROLE_BASELINE)
            and (records := view.records(t)).marks.duplicate_of is None
            and records.job.seed == seed
            and records.job.config == config
        ):
            return t
    return None


def counted_search_trials(trials: list[FrozenTrial], marks: Callable[[FrozenTrial], Marks]) -> int:
    """Sampled trials that use up the budget: trained, running or queued, or failed on an
    error of their own (a config can fail: it was tried). Not those lost with a worker, whose
    retries count instead, nor reused duplicates. A just-asked trial has no role yet, nor the
    retry of one whose worker died before writing its role; count them too. ``marks`` reads a
    trial's marks (``StudyView.marks``: a finished trial's kept)."""
    count = 0
    for t in trials:
        role, noted = role_of(t), marks(t)
        if (
            (t.state in LIVE or noted.error is not None)
            and noted.duplicate_of is None
            and (role == ROLE_SEARCH or (role is None and t.state in _UNSTARTED))
        ):
            count += 1
    return count


def _a_retry(trials: list[FrozenTrial], number: int) -> bool:
    """Whether trial ``number`` retries a failed one: a sampled config queued again, counted
    in the budget while it waited, never surplus."""
    return any(t.number == number and Retry.sound(t).failed_trial is not None for t in trials)


def _surplus(view: StudyView, trials: list[FrozenTrial], number: int, n_trials: int) -> bool:
    """Whether a freshly sampled trial is over the study's budget (a race between workers
    asking at the same moment; trials already counted are those numbered lower)."""
    earlier = [t for t in trials if t.number < number]
    return counted_search_trials(earlier, view.marks) >= n_trials


def _who(job: Job, seed: int) -> str:
    if job.role == ROLE_BASELINE:
        return str(job.baseline)
    if job.role == ROLE_CONFIRM:
        return f"confirm #{job.confirms} seed {seed}"
    if job.role == ROLE_FLOAT32_CLIP:
        return f"float32 with #{job.clip_of}'s clipping"
    return ""
