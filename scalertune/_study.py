"""The Optuna study a search lives in: its settings, the float32 references and the trials.

One study holds everything a search ran, so that resuming, a second worker or a later
``report`` see the same evidence:

- a study user attribute with the settings the study was created with (factory, steps, seed,
  space, device type, the reference's clipping): a rerun with other settings is refused;
- one *reference* trial per seed the search needed: the float32 run, its loss curve as
  intermediate values, its target loss and step time as attributes;
- the two named *baseline* trials, the sampled *search* trials and the *confirmation* reruns,
  each with its config, its loss curve and its judged attributes.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from scalertune._errors import UsageError
from scalertune._judge import Target
from scalertune._run import RunRecord
from scalertune._storage import first_line, redact
from scalertune._workload import factory_name

SETTINGS_ATTR = "scalertune.settings"
ROLE_REFERENCE = "reference"
#: The settings whose change makes stored trials incomparable with new ones.
COMPARABLE = ("factory", "steps", "seed", "space", "device_type", "reference")
_SETTINGS_WAIT_S = 30


def default_study_name(factory: str | Callable[[], Any]) -> str:
    """``examples/codepoints.py:make_model`` -> ``codepoints:make_model``; a function
    ``make_model`` of module ``pkg.models`` -> ``pkg.models:make_model``."""
    module, _, name = factory_name(factory).rpartition(":")
    stem = os.path.splitext(os.path.basename(module))[0] if module.endswith(".py") else module
    return f"{stem}:{name}"


def open_study(storage: Any, study_name: str, settings: dict[str, Any], *, seed: int,
               url: str) -> optuna.Study:
    """Create the study, or load it when it exists with the same settings."""
    sampler = optuna.samplers.TPESampler(seed=seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(storage=storage, study_name=study_name,
                                        direction="minimize", sampler=sampler,
                                        load_if_exists=True)
    except Exception as exc:
        raise UsageError(f"cannot open study {study_name!r} in {redact(url)}: "
                         f"{redact(first_line(exc))}") from None
    stored = study.user_attrs.get(SETTINGS_ATTR)
    if stored is None and study.trials:
        # Another worker created the study a moment ago and is writing its settings.
        deadline = time.monotonic() + _SETTINGS_WAIT_S
        while stored is None and time.monotonic() < deadline:
            time.sleep(0.2)
            stored = optuna.load_study(study_name=study_name, storage=storage).user_attrs.get(
                SETTINGS_ATTR)
    if stored is None:
        study.set_user_attr(SETTINGS_ATTR, settings)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["time to target (s)"])
        return study
    for key in COMPARABLE:
        if stored.get(key) != settings.get(key):
            raise UsageError(
                f"study {study_name!r} was created with {key}={_short(stored.get(key))}, not "
                f"{_short(settings.get(key))}: rerun with the same {key}, or pass a new "
                "--study-name"
            )
    return study


def _short(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return repr(value["name"])
    return repr(value)


def reference_of(study: optuna.Study, seed: int) -> dict[str, Any] | None:
    """The float32 reference of ``seed`` as plain data, or ``None`` if it has not run yet."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        attrs = trial.user_attrs
        if attrs.get("role") == ROLE_REFERENCE and attrs.get("seed") == seed:
            steps = sorted(trial.intermediate_values)
            return {
                "trial": trial.number,
                "seed": seed,
                "losses": [trial.intermediate_values[s] for s in steps],
                "median_step_time_s": attrs["median_step_time_s"],
                "target_loss": attrs["target_loss"],
                "steps_to_target": attrs["steps_to_target"],
            }
    return None


def add_reference(study: optuna.Study, record: RunRecord, config: dict[str, Any]) -> None:
    """Store a finished float32 run as the reference trial of its seed."""
    target = Target.from_reference(record.losses)
    steps = target.steps_to_target(record.losses)
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        value=(steps or record.steps) * record.median_step_time,
        intermediate_values=dict(enumerate(record.losses)),
        user_attrs={
            "role": ROLE_REFERENCE, "seed": record.seed, "config": config,
            "median_step_time_s": record.median_step_time, "target_loss": target.loss,
            "steps_to_target": steps, "steps_run": record.steps_run,
        },
    ))


def judged_attrs(record: RunRecord, target: Target) -> dict[str, Any]:
    """The per-trial attributes a user reads in the summary and the dashboard."""
    steps_to_target = None if record.pruned else target.steps_to_target(record.losses)
    attrs: dict[str, Any] = {
        "skipped_steps": len(record.skipped),
        "final_scale": record.scales[-1] if record.scales else None,
        "min_scale": min(record.scales) if record.scales else None,
        "first_nonfinite_step": record.first_nonfinite_step,
        "median_step_time_s": _finite_or_none(record.median_step_time),
        "steps_run": record.steps_run,
        "steps_to_target": steps_to_target,
        "time_to_target_s": (None if steps_to_target is None
                             else steps_to_target * record.median_step_time),
        "loss_vs_float32": _finite_or_none(target.final_ratio(record.losses)),
    }
    if record.pruned:
        attrs["pruned_because"] = record.prune_kind
        attrs["prune_reason"] = record.prune_reason
    return attrs


def objective_value(record: RunRecord, judged: dict[str, Any]) -> float:
    """What Optuna minimises: time to target, or the whole run's time when never reached.

    ``judged`` is :func:`judged_attrs` of the run. Runs that never reach the target are also
    marked infeasible through Optuna's constraint (``target_gap`` > 0), so
    ``study.best_trial`` and the dashboard agree with our ranking.
    """
    if judged["time_to_target_s"] is not None:
        return judged["time_to_target_s"]
    return record.steps * record.median_step_time


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
