"""The Optuna study a search lives in: storage, naming, stored settings and the reference.

One study holds everything a search ran, so that resuming, a second worker or a later
``report`` see the same evidence:

- study user attributes: the settings the study was created with (factory, steps, seed,
  space, device type) and the float32 reference run of each seed it needed;
- trials: the two named baselines, the sampled trials and the confirmation reruns, each
  with its config, its per-step loss as intermediate values and its judged attributes.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from typing import Any

import optuna

from scalertune._errors import UsageError
from scalertune._judge import Target
from scalertune._run import RunRecord

DEFAULT_STORAGE = "sqlite:///scalertune.db"
SETTINGS_ATTR = "scalertune.settings"
_REFERENCE_ATTR = "scalertune.float32_reference.seed{seed}"
#: The settings whose change makes stored trials incomparable with new ones.
COMPARABLE = ("factory", "steps", "seed", "space", "device_type", "reference")


def redact(url: str) -> str:
    """The storage URL with any password replaced by ``***``: safe to print and store."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def default_study_name(factory_spec: str) -> str:
    """``examples/codepoints.py:make_model`` -> ``codepoints:make_model``."""
    module, _, name = factory_spec.rpartition(":")
    stem = os.path.splitext(os.path.basename(module))[0] if module.endswith(".py") else module
    return f"{stem}:{name}"


def load_existing_study(storage: str, study_name: str) -> optuna.Study:
    """Load a study that must exist already; never creates a database or a study."""
    if storage.startswith("sqlite:///") and not os.path.exists(storage[len("sqlite:///"):]):
        raise UsageError(f"no such database: {storage} (check --storage)")
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"no study {study_name!r} in {redact(storage)}: "
                         "check --study-name and --storage") from None
    except Exception as exc:
        raise UsageError(f"cannot open storage {redact(storage)}: "
                         f"{redact(_first_line(exc))}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_study(storage: str, study_name: str, settings: dict[str, Any], *, seed: int) -> optuna.Study:
    """Create the study, or load it when it exists with the same settings."""
    sampler = optuna.samplers.TPESampler(seed=seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(
                storage=storage, study_name=study_name, direction="minimize",
                sampler=sampler, load_if_exists=True,
            )
    except (ImportError, ModuleNotFoundError) as exc:
        raise UsageError(
            f"storage {redact(storage)} needs a database driver that is not installed "
            f"({exc.name or exc}): pip install it"
        ) from None
    except Exception as exc:  # Optuna raises many kinds for a bad URL or an unreachable DB
        raise UsageError(
            f"cannot open storage {redact(storage)}: {redact(_first_line(exc))} "
            "(check the URL, e.g. sqlite:///scalertune.db or postgresql://user@host/db)"
        ) from None
    stored = study.user_attrs.get(SETTINGS_ATTR)
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


def stored_reference(study: optuna.Study, seed: int) -> dict[str, Any] | None:
    return study.user_attrs.get(_REFERENCE_ATTR.format(seed=seed))


def store_reference(study: optuna.Study, record: RunRecord) -> dict[str, Any]:
    """Keep the float32 run of ``record.seed``: its curve, its step time, its target."""
    target = Target.from_reference(record.losses)
    reference = {
        "seed": record.seed,
        "losses": record.losses,
        "median_step_time_s": record.median_step_time,
        "target_loss": target.loss,
        "steps_to_target": target.steps_to_target(record.losses),
    }
    study.set_user_attr(_REFERENCE_ATTR.format(seed=record.seed), reference)
    return reference


def judged_attrs(record: RunRecord, target: Target) -> dict[str, Any]:
    """The per-trial attributes a user reads in the summary and the dashboard."""
    steps_to_target = None if record.pruned else target.steps_to_target(record.losses)
    first_bad = record.first_nonfinite_step
    attrs: dict[str, Any] = {
        "skipped_steps": len(record.skipped),
        "final_scale": record.scales[-1] if record.scales else None,
        "min_scale": min(record.scales) if record.scales else None,
        "first_nonfinite_step": first_bad,
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


def objective_value(record: RunRecord, target: Target) -> float:
    """What Optuna minimises: time to target, or the whole run's time when never reached.

    Runs that never reach the target are also marked infeasible through Optuna's constraint
    (``target_gap`` > 0), so ``study.best_trial`` and the dashboard agree with our ranking.
    """
    steps = target.steps_to_target(record.losses)
    return (steps if steps is not None else record.steps) * record.median_step_time


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
