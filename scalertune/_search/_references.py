"""The float32 references: the target of every seed a search needs, and the step timing.

The reference of the search's own seed runs first, once per study (whichever worker claims
it). Its first ``steps`` define the target of the trials. When the horizon goes past a trial,
it trains on to the horizon, once: it saves checkpoints to the study's artifact store
(:mod:`scalertune._search._reference_checkpoints`: at the start of every phase window, where
the finalists are branched, and every few minutes, so that a reference that was interrupted
resumes instead of starting over), says how long it will take, keeps its per-step losses over
the windows (float32's own continuation, which a branch is compared with) and records the
gradient trace that the scaler replay reads. The interleaved step timing of every dtype the
study may run follows, on a fresh workload (:mod:`scalertune._run._timing`). With
``--isolate`` the reference runs in its own process like every trial, and the timing in
another. A reference that goes non-finite stops the search (the workload is broken); one that
does not learn is refused before any trial runs, and the study it would have started is
removed again, so that a rerun with more steps is a fresh study rather than a clash of
settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import MissingEvidence, SearchError, UsageError
from scalertune._judge._horizon import seed_spread
from scalertune._judge._reference import Reference
from scalertune._judge._target import Target
from scalertune._judge._view import StudyView
from scalertune._processes._protocol import RankFailed, TrialCrashed, describe_error
from scalertune._replay._trace import Trace
from scalertune._run._loop import Plan
from scalertune._run._memory import release_memory
from scalertune._run._record import RunRecord
from scalertune._run._timing import StepTimes, time_dtypes
from scalertune._run._trace_collector import TraceCollector
from scalertune._search import _policy as _search_policy
from scalertune._search._isolate import execute, run_here
from scalertune._search._launch import time_isolated
from scalertune._search._reference_checkpoints import Checkpoints
from scalertune._search._setup import Setup
from scalertune._search._study import add_failed_reference, add_reference
from scalertune._storage._claims import Once
from scalertune._storage._optuna import storage_of
from scalertune._text import duration
from scalertune._workload._factory import build_workload
from scalertune._workload._loader import FactoryError

#: How long into the reference's training its time to the horizon is said: the step time
#: of the first windows (warm-up aside) is a fair guess by then.
_TIME_LEFT_AFTER_S = 3.0


class References:
    """The float32 targets of a study's seeds and the study's step timing, run on demand."""

    def __init__(
        self,
        view: StudyView,
        once: Once,
        setup: Setup,
        config: AmpConfig,
        *,
        dtypes: list[str],
        log: Callable[[str], None],
    ) -> None:
        self.view, self.study = view, view.study
        self.once, self.setup, self.config = once, setup, config
        self.dtypes, self.log = dtypes, log
        self._targets: dict[int, Target] = {}
        self._times: StepTimes | None = None
        self._stored: dict[int, Reference] = {}
        self._traces: dict[int, Trace] = {}
        self.checkpoints = Checkpoints(view.study, once, setup, config, log=log)

    def target(self, seed: int) -> Target:
        """The float32 target of ``seed``; runs and stores the reference if nobody has."""
        if seed not in self._targets:
            if self.view.reference_of(seed) is None:  # a damaged one is run again
                for why in self.view.damaged_references(seed).values():
                    self.log(f"{why}: the float32 reference of seed {seed} runs again")
            self.once(
                f"reference.{seed}",
                lambda: self._run(seed),
                lambda: self.view.reference_of(seed) is not None,
            )
            reference = self._stored_reference(seed)
            self._targets[seed] = reference.target
            if seed == self.setup.seed:
                self._times = reference.step_times
        return self._targets[seed]

    @property
    def step_times(self) -> StepTimes | None:
        """The interleaved step time of each dtype (after :meth:`target` of the main seed)."""
        self.target(self.setup.seed)
        return self._times

    def reference(self, seed: int) -> Reference:
        """The stored float32 reference of ``seed`` (run first if nobody has)."""
        self.target(seed)
        if seed not in self._stored:
            self._stored[seed] = self._stored_reference(seed)
        return self._stored[seed]

    def _stored_reference(self, seed: int) -> Reference:
        reference = self.view.reference_of(seed)
        if reference is None:  # run above, or by the worker that held the claim
            raise MissingEvidence(
                f"the float32 reference of seed {seed} ran but the study does not hold it"
            )
        return reference

    def trace(self, seed: int) -> Trace:
        """The reference's gradient trace (decoded, and checked, as the study was read)."""
        if seed not in self._traces:
            trace = self.reference(seed).trace
            if trace is None:  # the search's own seed records one, always
                raise MissingEvidence(
                    f"the float32 reference of seed {seed} holds no gradient trace"
                )
            self._traces[seed] = trace.floored(self.setup.settings.loss_floor)
        return self._traces[seed]

    def spread(self) -> float:
        """float32's seed-to-seed spread of steps to its own target, over the search's seed
        and the confirmation seeds (their references run now if they have not)."""
        seeds = (self.setup.seed, *_policy.CONFIRM_SEEDS)
        return seed_spread([self.reference(s).steps_to_target for s in seeds])

    def checkpoint(self, seed: int, start: int) -> str:
        """float32's checkpoint at ``start`` as a file here, checked (rebuilt first where it
        is missing or damaged: :meth:`Checkpoints.get`)."""
        return self.checkpoints.get(self.reference(seed).checkpoints[start], start)

    def _run(self, seed: int) -> None:
        main = seed == self.setup.seed
        long = main and self.setup.long
        self.log(
            f"float32 reference, seed {seed}"
            + (f", to the horizon of {self.setup.horizon} steps" if long else "")
            + " ..."
        )
        record = self._train(seed, main, long)
        target = Target.from_reference(record.losses[: self.setup.steps])
        try:
            target.check_learned(self.setup.steps)
        except UsageError:
            self._remove_if_empty()
            raise
        times = _time(self.setup, self.dtypes, self.config.clip_norm, self.log) if main else None
        add_reference(
            self.study,
            record,
            self.config,
            times,
            settings=self.setup.settings,
            checkpoints=self.checkpoints.phase_names() if long else {},
        )
        measured = (
            ""
            if times is None
            else ", step time "
            + ", ".join(f"{d} {times.median(d) * 1e3:.3g} ms" for d in times.rounds)
        )
        self.log(f"float32 reference, seed {seed}: target loss {target.loss:.4g}{measured}")

    def _train(self, seed: int, main: bool, long: bool) -> RunRecord:
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
            self._remove_if_empty()
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

    def _remove_if_empty(self) -> None:
        """Delete a study that holds nothing yet, and the checkpoints its reference wrote: a
        refused first reference leaves no trace."""
        study = self.study
        if not study.get_trials(deepcopy=False):
            self.checkpoints.remove()
            optuna.delete_study(study_name=study.study_name, storage=storage_of(study))


def _time(
    setup: Setup, dtypes: list[str], clip_norm: float | None, log: Callable[[str], None]
) -> StepTimes | None:
    """The interleaved step timing of the study's ``dtypes``, on a fresh workload (in its own
    process with ``--isolate``, in its ranks on ranks; what it leaves out is said)."""
    if setup.isolation is not None:
        return time_isolated(
            setup.spec,
            dtypes,
            clip_norm=clip_norm,
            seed=setup.seed,
            device=setup.device,
            timeout_s=setup.isolation.timeout_s,
            memory_gb=setup.isolation.memory_gb,
            ranks=setup.isolation.nproc_per_node,
            log=log,
        )
    workload = run_here(build_workload, setup.factory, seed=setup.seed, device=setup.device)
    try:
        return run_here(time_dtypes, workload, dtypes, device=setup.device, clip_norm=clip_norm)
    except Exception as exc:
        raise SearchError(f"the step timing failed: {describe_error(exc)}") from exc
    finally:
        del workload
        release_memory()


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
