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
from optuna.trial import TrialState

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._guard import Guard
from scalertune._amp._schema import write_result
from scalertune._judge._outcome import Outcome, outcomes_of, reference_of
from scalertune._judge._rank import candidates, confirmations_of, ranked
from scalertune._judge._speedup import Speedup
from scalertune._judge._target import Target
from scalertune._review._describe import describe_outcome, forward_overflow_hint
from scalertune._run._record import skipped_steps
from scalertune._run._timing import StepTimes
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_RECOMMENDED,
    ROLE_SURPLUS,
    SETTINGS_ATTR,
    STOPPED_ATTR,
    TIMES_ATTR,
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
    recommended: Outcome | None
    #: float32 with the recommended config's own clipping, when that differs from the
    #: workload's: what the clipping alone does, and the fair yardstick for the precision.
    float32_clip: Outcome | None = None
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
        """The recommended config; float32 (with the workload's own clipping) when no AMP
        config was confirmed."""
        if self.recommended is not None:
            return self.recommended.config
        return AmpConfig.from_dict(self.settings.get("reference") or {"dtype": "float32"})

    @property
    def target(self) -> Target | None:
        return Target.from_reference(self.reference["losses"]) if self.reference else None

    @property
    def step_times(self) -> StepTimes | None:
        return self.reference.get("step_times") if self.reference else None

    @property
    def run_equivalents(self) -> float:
        """The search's cost: its training steps over the steps of one run."""
        steps = int(self.settings.get("steps") or 0)
        return self.steps_trained / steps if steps else math.nan

    @property
    def reference_time_to_target(self) -> float:
        ref = self.reference
        if not ref or ref.get("steps_to_target") is None or not ref.get("step_time_s"):
            return math.nan
        return ref["steps_to_target"] * ref["step_time_s"]

    @property
    def speedup(self) -> Speedup | None:
        """float32's time to target over the recommendation's, with its spread: steps to
        target on every seed it ran, times the interleaved step-time ratios."""
        rec, times = self.recommended, self.step_times
        if rec is None or times is None or rec.config.dtype not in times:
            return None
        twin = self.float32_clip
        if twin is not None and twin.reached and rec.reached:
            # float32 with the same clipping: the steps it saves are not the precision's
            ratios = [twin.steps_to_target / rec.steps_to_target]
        else:
            runs = [rec, *self.confirmations.get(rec.number, {}).values()]
            ratios = [self.references[o.seed]["steps_to_target"] / o.steps_to_target
                      for o in runs if o.seed in self.references and o.reached
                      and self.references[o.seed].get("steps_to_target")]
        if not ratios:
            return None
        return Speedup.of(ratios, times.ratios(rec.config.dtype))

    @property
    def verdict(self) -> str:
        device = self.settings.get("device", "this device")
        if self.recommended is None:
            if not self.candidates:
                return (f"no AMP config reached the float32 target without going non-finite; "
                        f"keep training in float32 on {device}")
            return (f"no AMP config stayed finite and reached the target on every "
                    f"confirmation seed; keep training in float32 on {device}")
        speedup = self.speedup
        if speedup is None:
            return f"speed against float32 unknown on {device} (no step timing)"
        return speedup.verdict(device) + self._clipping_clause()

    def _clipping_clause(self) -> str:
        """Whose steps the verdict compares with, when the recommendation clips otherwise
        than the workload: float32 clipped the same way, which is the fair comparison."""
        twin, ref = self.float32_clip, self.reference
        if twin is None or ref is None:
            return ""
        clip = f"clip {twin.config.clip_norm:.3g}"
        if not twin.reached:
            return (f". float32 with the same {clip} never reaches the target, so the "
                    "comparison is with the float32 reference")
        said = f". Compared with float32 at the same {clip} (target at step {twin.steps_to_target}"
        ref_steps = ref.get("steps_to_target")
        if ref_steps and twin.steps_to_target < 0.9 * ref_steps:
            said += (f", where the float32 reference needs {ref_steps}: the clipping, not the "
                     f"precision, saves those steps; clip at {twin.config.clip_norm:.3g} in "
                     "float32 too")
        return said + ")"

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
            if self.recommended is None:
                raise KeyError("no AMP config was recommended")
            return self.recommended
        if name.startswith("#"):
            return next(o for o in self.ranking if o.number == int(name[1:]))
        return self.baselines[name]

    def to_dict(self) -> dict[str, Any]:
        """The recommendation and its evidence as plain data (the YAML file's content)."""
        rec = self.recommended
        speedup = self.speedup
        evidence: dict[str, Any] = {
            "study": self.study_name,
            "storage": self.storage,
            "factory": self.settings.get("factory"),
            "device": self.settings.get("device"),
            "steps": self.settings.get("steps"),
            "search_space": (self.settings.get("space") or {}).get("name"),
            "verdict": self.verdict,
            "speedup_vs_float32": None if speedup is None else {
                "point": _num(speedup.point), "low": _num(speedup.low),
                "high": _num(speedup.high), "step_time_ratio": _num(speedup.step_time_ratio)},
        }
        if rec is not None:
            confirmed = self.confirmations.get(rec.number, {})
            evidence["trial"] = rec.number
            evidence["seeds"] = [rec.seed, *sorted(confirmed)]
            evidence.update(_run_evidence(rec))
            evidence["confirmation"] = {
                f"seed {seed}": _run_evidence(o) for seed, o in sorted(confirmed.items())
            }
        if self.float32_clip is not None:
            evidence["float32_same_clip"] = {"config": self.float32_clip.config.to_dict(),
                                             **_run_evidence(self.float32_clip)}
        if self.reference:
            evidence["float32"] = {
                "target_loss": _num(self.reference["target_loss"]),
                "steps_to_target": self.reference.get("steps_to_target"),
                "step_time_s": _num(self.reference.get("step_time_s")),
                "time_to_target_s": _num(self.reference_time_to_target),
            }
        for name, outcome in self.baselines.items():
            evidence[name] = {"config": outcome.config.to_dict(), **_run_evidence(outcome)}
        evidence["cost"] = {"run_equivalents": _num(self.run_equivalents),
                            "training_steps": self.steps_trained}
        if self.stop_reason:
            evidence["stopped_early"] = self.stop_reason
        data: dict[str, Any] = {"config": self.config.to_dict()}
        guard = self.guard()
        if guard is not None:
            data["guard"] = {"min_scale": guard.min_scale,
                             "max_consecutive_skips": guard.max_consecutive_skips}
        data["evidence"] = evidence
        return data

    def guard(self) -> Guard | None:
        """The production guard the evidence supports (float16 recommendations only): a floor
        ``GUARD_SCALE_MARGIN_POWERS`` powers of two below the smallest scale any run of the
        recommended config reached, and twice its longest run of skipped steps (at least the
        search's own limit)."""
        rec = self.recommended
        if rec is None or not rec.config.uses_scaler:
            return None
        runs = [rec, *self.confirmations.get(rec.number, {}).values()]
        lowest = min(min(o.scales) if o.scales else o.config.init_scale for o in runs)
        streak = max(_longest_skip_streak(o) for o in runs)
        floor = max(lowest / 2.0**_policy.GUARD_SCALE_MARGIN_POWERS, _policy.SCALE_FLOOR)
        return Guard(min_scale=float(f"{floor:.6g}"),
                     max_consecutive_skips=max(_policy.MAX_CONSECUTIVE_SKIPS, 2 * streak))

    def to_yaml(self, path: str) -> None:
        """Write the recommendation; :func:`scalertune.load` reads it back."""
        write_result(self.to_dict(), path)


def _longest_skip_streak(outcome: Outcome) -> int:
    skipped = set(skipped_steps(outcome.scales, outcome.config.init_scale))
    longest = current = 0
    for i in range(len(outcome.scales)):
        current = current + 1 if i in skipped else 0
        longest = max(longest, current)
    return longest


def _run_evidence(outcome: Outcome) -> dict[str, Any]:
    a = outcome.attrs
    out: dict[str, Any] = {"outcome": describe_outcome(outcome)}
    for key in ("steps_to_target", "time_to_target_s", "step_time_s", "skipped_steps",
                "min_scale", "final_scale", "first_nonfinite_step", "steps_run",
                "loss_vs_float32", "loss_vs_float32_step"):
        if a.get(key) is not None:
            out[key] = _num(a[key])
    return out


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    return value


def analyze(study: optuna.Study, *, storage: str = "") -> SearchResult:
    """Rebuild the result of a search from the study alone (no training runs)."""
    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    trials = study.get_trials(deepcopy=False)
    outcomes = outcomes_of(trials)
    ranking = ranked(outcomes)
    references = {s: ref for s in (int(settings.get("seed", 0)), *_policy.CONFIRM_SEEDS)
                  if (ref := reference_of(study, s)) is not None}
    seed_ref = references.get(int(settings.get("seed", 0)))
    times = seed_ref.get("step_times") if seed_ref else None
    clip = (settings.get("reference") or {}).get("clip_norm")
    ordered = candidates(ranking, times, clip)[:_policy.CONFIRM_TOP]
    failed_confirms = [Outcome.from_trial(t) for t in trials
                       if t.state == TrialState.FAIL and t.user_attrs.get("role") == ROLE_CONFIRM
                       and "error" in t.user_attrs]
    confirmations = {c.number: confirmations_of(c, [*outcomes, *failed_confirms])
                     for c in ordered}
    twins = [Outcome.from_trial(t) for t in trials
             if t.user_attrs.get("role") == ROLE_FLOAT32_CLIP
             and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    result = SearchResult(
        study_name=study.study_name, storage=storage, settings=settings,
        references=references, ranking=ranking, candidates=ordered,
        confirmations=confirmations,
        failed=sum(t.state == TrialState.FAIL and "error" in t.user_attrs
                   and t.user_attrs.get("role") != ROLE_SURPLUS for t in trials),
        lost=sum(t.state == TrialState.FAIL and "error" not in t.user_attrs for t in trials),
        recommended=None, steps_trained=_steps_trained(trials),
        reused=sum(o.reused for o in outcomes),
        stop_reason=study.user_attrs.get(STOPPED_ATTR), study=study,
    )
    recommended = next((c for c in ordered if result.confirmation_state(c) == "confirmed"
                        and all(result.confirmation_state(b) == "failed"
                                for b in ordered[:ordered.index(c)])), None)
    twin = None if recommended is None else next(
        (o for o in twins if o.seed == recommended.seed
         and o.config.clip_norm == recommended.config.clip_norm), None)
    return dataclasses.replace(result, recommended=recommended, float32_clip=twin)


def _steps_trained(trials: list[optuna.trial.FrozenTrial]) -> int:
    total = 0
    for trial in trials:
        attrs = trial.user_attrs
        if "duplicate_of" in attrs or attrs.get("role") == ROLE_RECOMMENDED:
            continue
        total += int(attrs.get("steps_run") or 0)
        times = trial.system_attrs.get(TIMES_ATTR)
        if times:
            total += int(times.get("steps", 0))
    return total
