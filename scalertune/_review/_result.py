"""SearchResult: the recommendation and its evidence, recomputed from what the study stores.

Like Lightning's learning-rate finder, a search returns an object, not a bare dict: the
config to use (:attr:`SearchResult.config`), the evidence behind it (the float32 reference,
the baselines, the ranking, the confirmation runs, the interleaved step timing) and ways to
show it (:meth:`summary`, :meth:`to_yaml`). :func:`analyze` builds it from storage alone, so it
is the same after one worker, several workers or a crash.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import optuna

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._guard import Guard
from scalertune._amp._schema import write_result
from scalertune._errors import ParameterError, UsageError
from scalertune._judge._horizon import finalists, holds
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult, phase_windows
from scalertune._judge._speedup import Speedup
from scalertune._judge._target import Target
from scalertune._replay._forecast import forecast
from scalertune._replay._predict import Prediction, predict
from scalertune._review import _document, _verdict
from scalertune._review._describe import forward_overflow_hint
from scalertune._review._scaler import trace_of
from scalertune._run._timing import StepTimes
from scalertune._storage._names import (
    ROLE_BASELINE,
)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """What a search found: :attr:`config` to train with, and the evidence for it.

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model")  # doctest: +SKIP
        >>> print(result.summary())  # doctest: +SKIP
        >>> result.to_yaml("amp.yaml")  # doctest: +SKIP
        >>> amp = scalertune.load("amp.yaml", device="cuda")  # doctest: +SKIP
    """

    study_name: str
    storage: str
    settings: dict[str, Any]
    #: float32 reference per seed that ran (the search's seed, then the confirmation seeds).
    references: dict[int, dict[str, Any]]
    ranking: list[Outcome]
    #: Distinct configs that reached the target, in the order they are confirmed.
    candidates: list[Outcome]
    confirmations: dict[int, dict[int, Outcome]]
    #: Runs (of any role) that raised an error.
    failed: int
    #: The AMP run recommended; ``None`` when float32 is the answer (see :attr:`config`).
    recommended: Outcome | None
    #: float32 with the best AMP config's own clipping, when that differs from the
    #: workload's: what the clipping alone does, and the fair yardstick for the precision.
    float32_clip: Outcome | None = None
    #: The best AMP config that held for the horizon and was confirmed on every seed, whether
    #: or not it is faster than float32 on this device (the answer to use on a GPU when a CPU
    #: search recommends float32).
    best_amp: Outcome | None = None
    #: When float32 is the answer: ``float32_clip`` if clipping float32 that way reaches the
    #: target sooner and holds, else ``None`` (the workload's own float32).
    float32_choice: Outcome | None = None
    #: Every distinct config that reached the target, in the order they would be confirmed,
    #: before the horizon is taken into account (the finalists come from these).
    pool: list[Outcome] = dataclasses.field(default_factory=list)
    #: Run number -> how its branches did at the phases of the horizon.
    phases: dict[int, list[PhaseResult]] = dataclasses.field(default_factory=dict)
    #: Runs with one module in float32 that a late phase proposed, trained from the start.
    islands: list[Outcome] = dataclasses.field(default_factory=list)
    #: float32's seed-to-seed spread of steps to the target: within it, steps tie.
    spread: float = 0.0
    #: Runs stopped by Ctrl-C or SIGTERM, or lost with a worker that died.
    lost: int = 0
    #: Training steps every run and the step timing executed (reused duplicates cost none).
    steps_trained: int = 0
    #: Sampled configs that had run already: their result was reused, nothing trained.
    reused: int = 0
    stop_reason: str | None = None
    interrupted: bool = False
    study: optuna.Study | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def reference(self) -> dict[str, Any] | None:
        """The float32 reference of the search's own seed."""
        return self.references.get(int(self.settings.get("seed", 0)))

    @property
    def config(self) -> AmpConfig:
        """The config to train with: the recommended AMP config, or float32 (with the
        workload's own clipping, or with the best AMP config's where that reaches the target
        sooner and holds) when no AMP config is faster on this device."""
        if self.recommended is not None:
            return self.recommended.config
        if self.float32_choice is not None:
            return self.float32_choice.config
        return AmpConfig.from_dict(self.settings.get("reference") or {"dtype": "float32"})

    @property
    def target(self) -> Target | None:
        return Target.from_reference(self.reference["losses"]) if self.reference else None

    @property
    def step_times(self) -> StepTimes | None:
        return self.reference.get("step_times") if self.reference else None

    @property
    def run_equivalents(self) -> float:
        """The search's cost: its training steps over the horizon's (the float32 reference,
        which trains to the horizon once, is 1)."""
        return self.steps_trained / self.horizon if self.horizon else math.nan

    @property
    def reference_time_to_target(self) -> float:
        ref = self.reference
        if not ref or ref.get("steps_to_target") is None or not ref.get("step_time_s"):
            return math.nan
        return ref["steps_to_target"] * ref["step_time_s"]

    @property
    def speedup(self) -> Speedup | None:
        """float32's time to target over the best AMP config's, with its spread: steps to
        target on every seed it ran, times the interleaved step-time ratios."""
        return _verdict.speedup(self, self.best_amp)

    @property
    def verdict(self) -> str:
        return _verdict.verdict(self)

    @property
    def horizon(self) -> int:
        """The training steps the evidence covers."""
        return int(self.settings.get("horizon") or self.settings.get("steps") or 0)

    @property
    def long(self) -> bool:
        """Whether the horizon goes past a trial (the finalists were branched at its phases)."""
        return self.horizon > int(self.settings.get("steps") or 0)

    @property
    def windows(self) -> list[tuple[int, int]]:
        return phase_windows(self.horizon, int(self.settings.get("steps") or 0))

    @property
    def finalists(self) -> list[Outcome]:
        """The candidates branched at every phase of the horizon."""
        return finalists(self.pool, self.ranking,
                         (self.settings.get("reference") or {}).get("clip_norm"))

    def predict(self, config: AmpConfig, *, horizon: int | None = None) -> Prediction:
        """What ``config``'s GradScaler will do over the horizon (or ``horizon`` steps of it),
        replayed from the float32 reference's gradient trace: its ``skipped_steps``, and
        where; its ``min_scale`` and ``final_scale``; the share of gradient values that flush
        to zero, per tenth of it.

        Example:
            >>> result = scalertune.analyze(study)  # doctest: +SKIP
            >>> result.predict(scalertune.AmpConfig()).skipped_steps  # doctest: +SKIP
            64
        """
        trace = trace_of(self)
        if trace is None:
            raise UsageError("this study's float32 reference has no gradient trace (it ran "
                             "before scalertune recorded one): rerun the search with a new "
                             "study name")
        return predict(trace, config, horizon=horizon or self.horizon)

    def forecast(self) -> str | None:
        """Beyond the horizon: the first module whose forward peaks, at their trend, would
        reach float16's range, and when; ``None`` where no trend is significant."""
        trace = trace_of(self)
        found = forecast(trace, self.horizon) if trace is not None else []
        return f"Forecast beyond the horizon: {found[0].describe()}" if found else None

    def holds(self, outcome: Outcome) -> bool | None:
        """Whether ``outcome``'s config holds for the horizon (``None``: not known yet)."""
        return holds(outcome, self.phases, self.windows)

    @property
    def baselines(self) -> dict[str, Outcome]:
        return {o.attrs["baseline"]: o for o in self.ranking if o.role == ROLE_BASELINE}

    @property
    def forward_overflow_modules(self) -> list[str] | None:
        """``None`` unless *every* float16 run was pruned for a forward overflow; then where
        each overflowed (its culprit modules, as patterns), most frequent first (empty if
        none was named)."""
        runs = [o for o in self.ranking if o.config.dtype == "float16"]
        if not runs or any(o.prune_kind != "forward" for o in runs):
            return None
        named = [o.attrs["overflow_module"] for o in runs if o.attrs.get("overflow_module")]
        return sorted(set(named), key=lambda m: -named.count(m))

    def forward_overflow_hint(self) -> str | None:
        """What to do when every float16 trial overflowed in the forward pass."""
        if self.forward_overflow_modules is None:
            return None
        runs = [o.attrs for o in self.ranking if o.config.dtype == "float16"]
        return forward_overflow_hint(self.settings.get("factory", "FACTORY"), self.study_name,
                                     runs, space=self.settings.get("space", {}).get("name"))

    @property
    def pruned_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.ranking:
            if outcome.state == "pruned":
                kind = outcome.prune_kind or "unknown"
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def confirmation_state(self, candidate: Outcome) -> str:
        """``confirmed``, ``failed`` (a seed that went non-finite or never reached its
        target), or ``pending`` (a seed not yet run)."""
        runs = self.confirmations.get(candidate.number, {})
        if any(not o.reached for o in runs.values()):
            return "failed"
        if all(s in runs for s in _policy.CONFIRM_SEEDS):
            return "confirmed"
        return "pending"

    @property
    def next_to_confirm(self) -> Outcome | None:
        """The candidate whose confirmation runs come next: the best one, and the next only
        once every one before it failed. ``None`` when one is confirmed or none is left."""
        for candidate in self.candidates:
            state = self.confirmation_state(candidate)
            if state == "pending":
                return candidate
            if state == "confirmed":
                return None
        return None

    def summary(self, *, top: int = 5) -> str:
        """The table printed at the end of a search (and by ``scalertune report``)."""
        from scalertune._review._summary import render

        return render(self, top=top)

    def plot(self, path: str, *, run: str = "recommended") -> None:
        """Write a PNG of ``run`` (``recommended``, a baseline's name, or ``#N``): its loss
        over float32's and its loss scale, step by step. Needs matplotlib."""
        from scalertune._review._plots import plot_run

        plot_run(self, self._run(run), path)

    def write_pictures(self, next_to: str) -> dict[int, str]:
        """PNGs of the recommendation and of PyTorch's defaults beside ``next_to`` (the YAML).

        Returns trial number -> path; empty when matplotlib is not installed.
        """
        from scalertune._review._plots import have_matplotlib, picture_path, plot_run

        if not have_matplotlib():
            return {}
        stem = os.path.splitext(next_to)[0]
        written = {}
        for name in ("recommended", "pytorch-default"):
            try:
                outcome = self._run(name)
            except KeyError:
                continue
            path = picture_path(stem, name, outcome.number)
            plot_run(self, outcome, path)
            written[outcome.number] = path
        return written

    def _run(self, name: str) -> Outcome:
        if name == "recommended":
            chosen = self.recommended or self.best_amp
            if chosen is None:
                raise KeyError("no AMP config held")
            return chosen
        if name.startswith("#"):
            return next(o for o in self.ranking if o.number == int(name[1:]))
        return self.baselines[name]

    def to_dict(self) -> dict[str, Any]:
        """The recommendation and its evidence as plain data (the YAML file's content)."""
        return _document.document(self)

    def guard(self) -> Guard | None:
        """The production guard the evidence supports (see :func:`_document.guard`)."""
        return _document.guard(self)

    def to_yaml(self, path: str) -> None:
        """Write the recommendation; :func:`scalertune.load` reads it back."""
        write_result(self.to_dict(), path)

    def for_trial(self, number: int) -> "SearchResult":
        """The same evidence with trial ``number``'s config as the answer (``report --trial``):
        its YAML loads that config, and says it was chosen by hand."""
        chosen = next((o for o in [*self.ranking, *self.islands] if o.number == number), None)
        if chosen is None:
            raise ParameterError("trial", f"must be a finished run of this study, got {number}")
        return dataclasses.replace(self, recommended=chosen, best_amp=chosen)
