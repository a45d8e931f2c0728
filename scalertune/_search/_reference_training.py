"""The float32 reference's training run of one seed, and what a refused one leaves behind.

To the horizon when it goes past a trial: from the latest checkpoint that loads
(:mod:`scalertune._search._reference_checkpoints`), saying once how long the rest will take.
A run whose rank died or hung is recorded as missing evidence and run again, as a trial is; a
run that goes non-finite stops the search (the workload is broken), and one refused before any
trial ran removes the study it would have started
(:meth:`~scalertune._search._references.References.target` runs it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import MissingEvidence, SearchError, UsageError
from scalertune._processes._protocol import RankFailed, TrialCrashed, describe_error
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord
from scalertune._run._trace_collector import TraceCollector
from scalertune._search import _policy as _search_policy
from scalertune._search._isolate import execute
from scalertune._search._reference_checkpoints import Checkpoints
from scalertune._search._setup import Setup
from scalertune._search._study import add_failed_reference
from scalertune._storage._optuna import storage_of
from scalertune._text import duration
from scalertune._workload._loader import FactoryError

#: How long into the reference's training its time to the horizon is said: the step time
#: of the first windows (warm-up aside) is a fair guess by then.
_TIME_LEFT_AFTER_S = 3.0


class ReferenceTraining:
    """Trains the float32 reference of a seed, with its retries and its checkpoints."""

    def __init__(
        self,
        study: optuna.Study,
        setup: Setup,
        config: AmpConfig,
        checkpoints: Checkpoints,
        *,
        log: Callable[[str], None],
    ) -> None:
        self.study, self.setup, self.config = study, setup, config
        self.checkpoints, self.log = checkpoints, log

    def __call__(self, seed: int, main: bool, long: bool) -> RunRecord:
        """The reference run itself, to the horizon with its checkpoints when ``long``."""
        steps = self.setup.horizon if long else self.setup.steps
        try:
            record = self._execute(seed, main, long, steps)
        except FactoryError as exc:
            raised = "raised " if exc.raised else ""
            raise SearchError(f"the float32 reference failed: the factory {raised}{exc}") from None
        except TrialCrashed as exc:  # its message's first line says how the process ended
            why = str(exc).partition("\n")[0]
            raise SearchError(f"the float32 reference failed: {why}") from None
        except UsageError:  # a state its checkpoint cannot hold (a scheduler's own types)
            remove_if_empty(self.study, self.checkpoints)
            raise
        except MissingEvidence as exc:  # its checkpoint could not be stored: not the workload's
            raise MissingEvidence(f"the float32 reference stopped: {exc}") from None
        except Exception as exc:
            raise SearchError(f"the float32 reference failed: {describe_error(exc)}") from exc
        if record.pruned:
            raise SearchError(
                f"the float32 reference itself went non-finite ({record.prune_reason}): "
                "fix the workload (learning rate, loss, data) before searching AMP configs; "
                "if your training clips gradients, return clip_norm from the factory"
            )
        return record

    def _execute(self, seed: int, main: bool, long: bool, steps: int) -> RunRecord:
        """The reference's run; one whose rank died or hung is missing evidence, recorded as
        such and run again (a long one from its latest checkpoint), ``MAX_RETRIES`` times at
        most, as a trial is; then :class:`MissingEvidence` (the search stops, nothing
        lost)."""

        def train(plan: Plan | None) -> RunRecord:
            return execute(
                self.setup,
                self.config,
                steps=steps,
                seed=seed,
                plan=plan,
                on_window=_TimeLeft(self.log, steps) if long else None,
            )

        def run() -> RunRecord:
            if long:  # from its latest checkpoint that loads
                return self.checkpoints.run_resuming(lambda: TraceCollector(steps), train)
            return train(Plan(watcher=TraceCollector(steps)) if main else None)

        runs = 0
        while True:
            try:
                return run()
            except RankFailed as exc:  # a fault of one process: missing evidence, no verdict
                why, runs = str(exc).splitlines()[0], runs + 1
                add_failed_reference(
                    self.study, seed, self.config, why, settings=self.setup.settings
                )
                if runs > _policy.MAX_RETRIES:
                    raise MissingEvidence(
                        f"{why}; {runs} runs in a row lost a rank: rerun the same command "
                        "once the cause is fixed"
                    ) from None
                self.log(f"float32 reference, seed {seed}: {why}; run again")


def remove_if_empty(study: optuna.Study, checkpoints: Checkpoints) -> None:
    """Delete a study that holds nothing yet, and the checkpoints its reference wrote: a
    refused first reference leaves no trace."""
    if not study.get_trials(deepcopy=False):
        checkpoints.remove()
        optuna.delete_study(study_name=study.study_name, storage=storage_of(study))


class _TimeLeft:
    """Says once, a few seconds into the reference's training to the horizon, how long the
    rest will take at its step time so far, and how often it saves a checkpoint."""

    def __init__(self, log: Callable[[str], None], steps: int) -> None:
        self.log, self.steps, self.said = log, steps, False
        self.started = time.monotonic()

    def __call__(self, record: RunRecord, start: int) -> None:
        timed = len(record.window_step_times) - _policy.WARMUP_WINDOWS
        left = self.steps - record.start - record.steps_run
        if (
            self.said
            or timed < 1
            or left <= 0
            or (time.monotonic() - self.started < _TIME_LEFT_AFTER_S)
        ):
            return
        self.said = True
        each = record.median_step_time
        self.log(
            f"float32 reference: {each * 1e3:.3g} ms a step, about "
            f"{duration(left * each)} to step {self.steps} (a checkpoint every "
            f"{duration(_search_policy.CHECKPOINT_EVERY_S)} of training; interrupted, it "
            "resumes from the last)"
        )
