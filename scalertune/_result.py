"""SearchResult: the recommendation and its evidence, recomputed from what the study stores.

Like Lightning's learning-rate finder, a search returns an object, not a bare dict: the
config to use (:attr:`SearchResult.config`), the evidence behind it (the float32 reference,
the baselines, the ranking, the confirmation runs) and ways to show it (:meth:`summary`,
:meth:`to_yaml`). :func:`analyze` builds it from storage alone, so it is the same after one
worker, several workers or a crash.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import optuna
import yaml

from scalertune import _policy
from scalertune._config import FLOAT32, AmpConfig
from scalertune._errors import UsageError
from scalertune._runtime import Guard
from scalertune._judge import Target, speed_verdict
from scalertune._rank import (ROLE_BASELINE, Outcome, confirmations_of,
                              distinct_candidates, outcomes_of, ranked)
from scalertune._study import SETTINGS_ATTR, reference_of

FORMAT_VERSION = 1


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
    reference: dict[str, Any] | None
    ranking: list[Outcome]
    candidates: list[Outcome]
    confirmations: dict[int, dict[int, Outcome]]
    failed: int
    recommended: Outcome | None
    interrupted: bool = False
    study: optuna.Study | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def config(self) -> AmpConfig:
        """The recommended config; float32 when no AMP config was confirmed."""
        return self.recommended.config if self.recommended else FLOAT32

    @property
    def target(self) -> Target | None:
        return Target.from_reference(self.reference["losses"]) if self.reference else None

    @property
    def reference_time_to_target(self) -> float:
        if not self.reference or self.reference.get("steps_to_target") is None:
            return math.nan
        return self.reference["steps_to_target"] * self.reference["median_step_time_s"]

    @property
    def speedup(self) -> float:
        """float32's time to target over the recommendation's (>1: AMP is faster)."""
        if self.recommended is None:
            return math.nan
        return self.reference_time_to_target / self.recommended.time_to_target

    @property
    def verdict(self) -> str:
        device = self.settings.get("device", "this device")
        if self.recommended is None:
            if not self.candidates:
                return (f"no AMP config reached the float32 target without going non-finite; "
                        f"keep training in float32 on {device}")
            return (f"no AMP config stayed finite and reached the target on every "
                    f"confirmation seed; keep training in float32 on {device}")
        step_ratio = (self.recommended.attrs.get("median_step_time_s") or math.nan) / (
            self.reference["median_step_time_s"] if self.reference else math.nan)
        return speed_verdict(self.speedup, step_ratio, device)

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
        from scalertune._diagnose import forward_overflow_hint

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

    def summary(self, *, top: int = 5) -> str:
        """The table printed at the end of a search (and by ``scalertune report``)."""
        from scalertune._summary import render

        return render(self, top=top)

    def plot(self, path: str, *, run: str = "recommended") -> None:
        """Write a PNG of ``run`` (``recommended``, a baseline's name, or ``#N``): its loss
        over float32's and its loss scale, step by step. Needs matplotlib."""
        from scalertune._plots import plot_run

        plot_run(self, self._run(run), path)

    def write_pictures(self, next_to: str) -> dict[int, str]:
        """PNGs of the recommendation and of PyTorch's defaults beside ``next_to`` (the YAML).

        Returns trial number -> path; empty when matplotlib is not installed.
        """
        from scalertune._plots import have_matplotlib, plot_run

        if not have_matplotlib():
            return {}
        stem = os.path.splitext(next_to)[0]
        written = {}
        for name in ("recommended", "pytorch-default"):
            try:
                outcome = self._run(name)
            except KeyError:
                continue
            path = f"{stem}.{name}.trial-{outcome.number}.png"
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
        evidence: dict[str, Any] = {
            "study": self.study_name,
            "storage": self.storage,
            "factory": self.settings.get("factory"),
            "device": self.settings.get("device"),
            "steps": self.settings.get("steps"),
            "search_space": (self.settings.get("space") or {}).get("name"),
            "verdict": self.verdict,
            "speedup_vs_float32": _num(self.speedup),
        }
        if rec is not None:
            confirmed = self.confirmations.get(rec.number, {})
            evidence["trial"] = rec.number
            evidence["seeds"] = [rec.seed, *sorted(confirmed)]
            evidence.update(_run_evidence(rec))
            evidence["confirmation"] = {
                f"seed {seed}": _run_evidence(o) for seed, o in sorted(confirmed.items())
            }
        if self.reference:
            evidence["float32"] = {
                "target_loss": _num(self.reference["target_loss"]),
                "steps_to_target": self.reference.get("steps_to_target"),
                "median_step_time_s": _num(self.reference["median_step_time_s"]),
                "time_to_target_s": _num(self.reference_time_to_target),
            }
        for name, outcome in self.baselines.items():
            evidence[name] = {"config": outcome.config.to_dict(), **_run_evidence(outcome)}
        data = {"scalertune": FORMAT_VERSION, "config": self.config.to_dict()}
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
        header = (
            "# Written by scalertune. Load it in training code with\n"
            "#   amp = scalertune.load(\"" + os.path.basename(path) + "\", device=\"cuda\")\n"
            "# 'config' is what the runtime uses; 'evidence' says why it was chosen.\n"
        )
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(header)
            yaml.safe_dump(self.to_dict(), f, sort_keys=False, width=100)
        os.replace(tmp, path)


def _longest_skip_streak(outcome: Outcome) -> int:
    longest = current = 0
    previous = outcome.config.init_scale
    for scale in outcome.scales:
        current = current + 1 if scale < previous else 0
        longest = max(longest, current)
        previous = scale
    return longest


def _run_evidence(outcome: Outcome) -> dict[str, Any]:
    a = outcome.attrs
    out: dict[str, Any] = {"outcome": describe_outcome(outcome)}
    for key in ("steps_to_target", "time_to_target_s", "median_step_time_s", "skipped_steps",
                "min_scale", "final_scale", "first_nonfinite_step", "loss_vs_float32"):
        if a.get(key) is not None:
            out[key] = _num(a[key])
    return out


def describe_outcome(outcome: Outcome) -> str:
    """One phrase: what happened to this run."""
    if outcome.state == "pruned":
        return f"pruned: {outcome.attrs.get('prune_reason', 'non-finite')}"
    skipped = outcome.attrs.get("skipped_steps") or 0
    tail = f", {skipped} skipped steps" if skipped else ""
    if outcome.reached:
        return f"reached the float32 target at step {outcome.attrs['steps_to_target']}{tail}"
    ratio = outcome.loss_vs_float32
    return (f"never reached the float32 target (final loss {ratio:.3g}x float32's){tail}"
            if math.isfinite(ratio) else f"never reached the float32 target{tail}")


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    return value


def analyze(study: optuna.Study, *, storage: str = "") -> SearchResult:
    """Rebuild the result of a search from the study alone (no training runs)."""
    settings = study.user_attrs.get(SETTINGS_ATTR) or {}
    seed = int(settings.get("seed", 0))
    trials = study.get_trials(deepcopy=False)
    outcomes = outcomes_of(trials)
    ranking = ranked(outcomes)
    candidates = distinct_candidates(ranking, _policy.CONFIRM_TOP)
    confirmations = {c.number: confirmations_of(c, outcomes) for c in candidates}
    recommended = next(
        (c for c in candidates
         if all(s in confirmations[c.number] and confirmations[c.number][s].reached
                for s in _policy.CONFIRM_SEEDS)),
        None,
    )
    failed = sum(t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("role") != "surplus"
                 for t in trials)
    return SearchResult(
        study_name=study.study_name, storage=storage, settings=settings,
        reference=reference_of(study, seed), ranking=ranking, candidates=candidates,
        confirmations=confirmations, failed=failed, recommended=recommended, study=study,
    )


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path} (run scalertune search first)") from None
    except yaml.YAMLError:
        raise UsageError(f"{path} is not valid YAML") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UsageError(f"{path} has no 'config' mapping: is it a scalertune result file?")
    return data


def load_config(path: str) -> AmpConfig:
    """Read the ``config`` block of a YAML file written by ``scalertune search``."""
    return AmpConfig.from_dict(_read(path)["config"])


def load_guard(path: str) -> Guard | None:
    """The ``guard`` block of a result YAML, if it has one."""
    block = _read(path).get("guard")
    if block is None:
        return None
    try:
        return Guard(min_scale=float(block["min_scale"]),
                     max_consecutive_skips=int(block["max_consecutive_skips"]))
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: 'guard' needs min_scale and max_consecutive_skips") from None

