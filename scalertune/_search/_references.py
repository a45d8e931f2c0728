"""The float32 references: the target of every seed a search needs, and the step timing.

The reference of the search's own seed runs first, once per study (whichever worker claims
it). Its first ``steps`` define the target of the trials. When the horizon goes past a trial,
it trains on to the horizon, once (:mod:`scalertune._search._reference_training`): it
saves checkpoints to the study's artifact store (:mod:`scalertune._search._reference_checkpoints`:
at the start of every phase window, where
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

from collections.abc import Callable

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import MissingEvidence, SearchError, UsageError
from scalertune._judge._horizon import seed_spread
from scalertune._judge._reference import Reference, same_on_every_seed, unseeded_note
from scalertune._judge._target import Target
from scalertune._judge._view import StudyView
from scalertune._processes._protocol import describe_error
from scalertune._replay._trace import Trace
from scalertune._run._memory import release_memory
from scalertune._run._timing import StepTimes, time_dtypes
from scalertune._search._isolate import run_here
from scalertune._search._launch import time_isolated
from scalertune._search._reference_checkpoints import Checkpoints
from scalertune._search._reference_training import ReferenceTraining, remove_if_empty
from scalertune._search._setup import Setup
from scalertune._search._study import add_reference
from scalertune._storage._claims import Once
from scalertune._workload._factory import build_workload


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
        self._said_unseeded = False
        self.checkpoints = Checkpoints(view.study, once, setup, config, log=log)
        self.training = ReferenceTraining(view.study, setup, config, self.checkpoints, log=log)

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
        seeds = (self.setup.seed, *_policy.confirm_seeds(self.setup.seed))
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
        record = self.training(seed, main, long)
        target = Target.from_reference(record.losses[: self.setup.steps])
        try:
            target.check_learned(self.setup.steps)
        except UsageError:
            remove_if_empty(self.study, self.checkpoints)
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
        if not main and not self._said_unseeded:
            first = self.reference(self.setup.seed)
            if same_on_every_seed([first.losses, record.losses[: self.setup.steps]]):
                self._said_unseeded = True  # once: the summary says it of every seed
                self.log(unseeded_note([self.setup.seed, seed]))


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
