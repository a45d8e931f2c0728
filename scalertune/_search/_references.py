"""The float32 references: the target of every seed a search needs, and the step timing.

The reference of the search's own seed runs first, once per study (whichever worker claims
it), in full: its last steps define the target. The interleaved step timing of every dtype
the study may run follows, on a fresh workload (:mod:`scalertune._run._timing`). With
``--isolate`` the reference runs in its own process like every trial, and the timing in
another. A reference that
goes non-finite stops the search (the workload is broken); one that does not learn is refused
before any trial runs, and the study it would have started is removed again, so that a rerun
with more steps is a fresh study rather than a clash of settings.
"""

from __future__ import annotations

from typing import Any, Callable

import optuna
import torch

from scalertune._amp._config import AmpConfig
from scalertune._errors import SearchError, UsageError
from scalertune._judge._outcome import reference_of
from scalertune._judge._target import Target
from scalertune._run._loop import run_config
from scalertune._run._memory import release_memory
from scalertune._run._timing import StepTimes, time_dtypes
from scalertune._search._isolate import (
    TrialCrashed,
    describe_error,
    run_here,
    run_isolated,
    time_isolated,
)
from scalertune._search._study import add_reference
from scalertune._storage._claims import Once
from scalertune._workload._contract import build_workload
from scalertune._workload._loader import FactoryError


class References:
    """The float32 targets of a study's seeds and the study's step timing, run on demand."""

    def __init__(self, study: optuna.Study, once: Once, factory: Callable[[], Any],
                 config: AmpConfig, *, spec: str | Callable[[], Any], steps: int, seed: int, device: torch.device,
                 dtypes: list[str], isolation: Any, log: Callable[[str], None]) -> None:
        self.study, self.once, self.factory, self.config = study, once, factory, config
        self.spec, self.isolation = spec, isolation
        self.steps, self.seed, self.device, self.dtypes, self.log = (
            steps, seed, device, dtypes, log)
        self._targets: dict[int, Target] = {}
        self._times: StepTimes | None = None

    def target(self, seed: int) -> Target:
        """The float32 target of ``seed``; runs and stores the reference if nobody has."""
        if seed not in self._targets:
            self.once(f"reference.{seed}", lambda: self._run(seed),
                      lambda: reference_of(self.study, seed) is not None)
            reference = reference_of(self.study, seed)
            self._targets[seed] = Target.from_reference(reference["losses"])
            if seed == self.seed:
                self._times = reference["step_times"]
        return self._targets[seed]

    @property
    def step_times(self) -> StepTimes | None:
        """The interleaved step time of each dtype (after :meth:`target` of the main seed)."""
        self.target(self.seed)
        return self._times

    def _run(self, seed: int) -> None:
        self.log(f"float32 reference, seed {seed} ...")
        try:
            if self.isolation is not None:
                record = run_isolated(self.spec, self.config, steps=self.steps, seed=seed,
                                      device=self.device, timeout_s=self.isolation.timeout_s,
                                      memory_gb=self.isolation.memory_gb)
            else:
                record = run_here(run_config, self.factory, self.config, steps=self.steps,
                                  seed=seed, device=self.device)
        except FactoryError as exc:
            raise SearchError(f"the float32 reference failed: the factory raised {exc}") from None
        except TrialCrashed as exc:  # its message's first line says how the process ended
            why = str(exc).partition("\n")[0]
            raise SearchError(f"the float32 reference failed: {why}") from None
        except Exception as exc:
            raise SearchError(f"the float32 reference failed: {describe_error(exc)}") from exc
        if record.pruned:
            raise SearchError(
                f"the float32 reference itself went non-finite ({record.prune_reason}): "
                "fix the workload (learning rate, loss, data) before searching AMP configs; "
                "if your training clips gradients, return clip_norm from the factory"
            )
        target = Target.from_reference(record.losses)
        try:
            target.check_learned(self.steps)
        except UsageError:
            _remove_if_empty(self.study)
            raise
        times = self._time() if seed == self.seed else None
        add_reference(self.study, record, self.config.to_dict(), times)
        measured = "" if times is None else ", step time " + ", ".join(
            f"{d} {times.median(d) * 1e3:.3g} ms" for d in times.rounds)
        self.log(f"float32 reference, seed {seed}: target loss {target.loss:.4g}{measured}")


    def _time(self) -> StepTimes | None:
        """The interleaved step timing of the study's dtypes, on a fresh workload (in its own
        process with ``--isolate``)."""
        if self.isolation is not None:
            return time_isolated(self.spec, self.dtypes, clip_norm=self.config.clip_norm,
                                 seed=self.seed, device=self.device,
                                 timeout_s=self.isolation.timeout_s,
                                 memory_gb=self.isolation.memory_gb)
        workload = run_here(build_workload, self.factory, seed=self.seed, device=self.device)
        try:
            return run_here(time_dtypes, workload, self.dtypes, device=self.device,
                            clip_norm=self.config.clip_norm)
        except Exception as exc:
            raise SearchError(f"the step timing failed: {describe_error(exc)}") from exc
        finally:
            del workload
            release_memory()


def _remove_if_empty(study: optuna.Study) -> None:
    """Delete a study that holds nothing yet: a refused first reference leaves no trace."""
    if not study.get_trials(deepcopy=False):
        optuna.delete_study(study_name=study.study_name, storage=study._storage)  # noqa: SLF001
