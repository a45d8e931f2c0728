"""One worker's part in a search, phase by phase; any number of workers may share a study.

float32 reference (to the horizon, with its checkpoints and gradient trace) and step timing
-> sampled trials -> baselines -> the finalists branched at the phases of the horizon (and
a float32 island where one module's precision limited a late phase) -> confirmation of the
best on other seeds -> float32 at the recommendation's clip -> the recommended trial.

The once-per-study runs are queued as trials (:mod:`scalertune._search._jobs`); whichever
worker is free runs them, and a worker with nothing to run waits for the others' running
trials (which may fail and come back as retries) before it moves on.
"""

from __future__ import annotations

import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune import _interrupt, _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._stopping import study_stop_reason
from scalertune._judge._view import StudyView
from scalertune._search import _policy as _search_policy
from scalertune._search._jobs import Jobs
from scalertune._search._progress import Progress
from scalertune._search._references import References
from scalertune._search._setup import Setup
from scalertune._search._trials import TrialRunner, counted_search_trials
from scalertune._storage._claims import Once
from scalertune._storage._names import ROLE_SEARCH, STOPPED_ATTR
from scalertune._storage._recovery import recover
from scalertune._storage._trial_record import role_of
from scalertune._text import plural


class Pipeline:
    """The phases of a search, in order, for one worker."""

    def __init__(
        self, study: optuna.Study, setup: Setup, progress: Progress, *, timeout: float | None
    ) -> None:
        self.study, self.setup, self.progress = study, setup, progress
        once = Once(study)
        # the study as this worker reads it, each finished trial checked once for the search
        self.view = view = StudyView(study)
        reference = AmpConfig(dtype="float32", clip_norm=setup.clip_norm)
        self.references = References(
            view, once, setup, reference, dtypes=setup.space.timed_dtypes, log=progress.line
        )
        self.runner = TrialRunner(view, setup, self.references, progress)
        self.jobs = Jobs(view, setup, once, self.references, progress, drain=self.drain)
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def run(self) -> None:
        recover(self.study, self.progress.line)
        self.references.target(self.setup.seed)
        self.references.spread()
        trials = self.view.trials()
        self.progress.grow(
            sum(t.state == TrialState.WAITING for t in trials)
            + max(0, self.setup.n_trials - counted_search_trials(trials, self.view.marks))
        )
        while True:
            while self._sample_more():
                self.runner.run_one()
            self.drain()
            # A trial counted while another worker ran it can end up not counting: lost
            # with its retries spent, or its queued run reused as a finished twin's.
            if not self._sample_more():
                break
        self.jobs.baselines()
        self.jobs.replay_choice()
        self.jobs.phases()
        self.jobs.confirm()
        self.jobs.float32_clip()
        self.jobs.recommended()

    def drain(self) -> None:
        """Run what is queued; wait for other workers' running trials (which may fail and
        come back as retries) until nothing is left."""
        while True:
            recover(self.study, self.progress.line)
            trials = self.view.trials((TrialState.WAITING, TrialState.RUNNING))
            if any(t.state == TrialState.WAITING for t in trials):
                self.runner.run_one()
            elif trials:
                _interrupt.sleep(_policy.POLL_S)
            else:
                return

    def _sample_more(self) -> bool:
        recover(self.study, self.progress.line)
        trials = self.view.trials()
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        if counted_search_trials(trials, self.view.marks) >= self.setup.n_trials:
            return False
        reason = self._stop_reason(trials)
        if reason is not None:
            if self.study.user_attrs.get(STOPPED_ATTR) != reason:
                self.study.set_user_attr(STOPPED_ATTR, reason)
                self.progress.line(f"sampling stopped: {reason}")
            return False
        return True

    def _stop_reason(self, trials: list[FrozenTrial]) -> str | None:
        sampled = [
            t
            for t in self.view.sound(trials)[0]
            if role_of(t) == ROLE_SEARCH and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        ]
        distinct = self.setup.space.distinct_configs()
        configs = {self.view.records(t).job.config for t in sampled}
        if distinct is not None and len(configs) >= distinct:
            return (
                f"the space has {plural(distinct, 'distinct config')}, and "
                f"{'it has' if distinct == 1 else 'every one has'} run"
            )
        least = (
            _search_policy.STUDY_MIN_TRIALS_LONG if self.setup.long else _policy.STUDY_MIN_TRIALS
        )
        reason = study_stop_reason(
            [self.view.outcome(t) for t in sampled],
            self.references.step_times,
            self.setup.settings.noise(self.references.spread()),
            min_trials=least,
            tied_trials=None if self.setup.long else _policy.STUDY_TIED_TRIALS,
        )
        if reason is None and self.deadline is not None and time.monotonic() > self.deadline:
            reason = "the time budget (timeout) is spent"
        return reason
