"""The points of a search space: the config a trial names, and the params that name a config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import optuna

from scalertune._amp._config import DTYPES, SCALER_KNOBS, AmpConfig
from scalertune._errors import UsageError

if TYPE_CHECKING:
    from scalertune._search._space import SearchSpace



#: Searched, like the scaler's knobs, only on float16 trials: the range problem islands fix.
FLOAT16_ONLY = (*SCALER_KNOBS, "fp32_modules")


NUMERIC_KNOBS = (*SCALER_KNOBS, "clip_norm")


def fixed_params(trial: optuna.Trial) -> dict[str, Any]:
    """The parameters a queued trial was given (``study.enqueue_trial``)."""
    return trial.storage.get_trial_system_attrs(trial._trial_id).get(  # noqa: SLF001
        "fixed_params") or {}


def suggest(space: SearchSpace, trial: optuna.Trial) -> AmpConfig:
    """Ask the trial for each searched parameter and build the config it names.

    The study's sampler must be :meth:`sampler` (or another that keeps ``dtype`` to the
    space's choices)."""
    # Every run of a study, the float32 references included, is a point of one dtype
    # parameter over all three dtypes; the space's sampler keeps to the space's choices.
    values: dict[str, Any] = {"dtype": trial.suggest_categorical("dtype", list(DTYPES))}
    if values["dtype"] not in space.dtypes and "dtype" not in fixed_params(trial):
        raise UsageError(f"the study's sampler proposed dtype {values['dtype']!r}, outside "
                         f"search space {space.name!r}: create the study with "
                         "sampler=space.sampler()")
    islands = space.params.get("fp32_modules")
    if islands is not None and values["dtype"] == "float16":
        values["fp32_modules"] = (
            trial.suggest_categorical("fp32_modules", list(islands["choices"]))
            if isinstance(islands, Mapping) else islands)
    for key in NUMERIC_KNOBS:
        if key not in space.params or (key in FLOAT16_ONLY and values["dtype"] != "float16"):
            continue
        spec = space.params[key]
        if not isinstance(spec, Mapping):
            values[key] = spec
            continue
        if spec.get("optional") and not trial.suggest_categorical(f"use_{key}", [False, True]):
            continue
        kwargs = {k: spec[k] for k in ("log", "step") if k in spec}
        if key == "growth_interval":
            values[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]), **kwargs)
        else:
            values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]),
                                              **kwargs)
    return AmpConfig(**values)


def params_for(space: SearchSpace, config: AmpConfig) -> dict[str, Any] | None:
    """The parameters :meth:`suggest` would record to produce ``config``, or ``None``
    when the space cannot produce it (a value outside a range, or fixed otherwise).

    A baseline queued with these is a point of the same space as the sampled trials.
    ``config`` is taken before the workload's own clipping is applied: a ``clip_norm`` of
    ``None`` is "no clipping of its own", which the space spells ``use_clip_norm: false``.
    """
    params: dict[str, Any] = {"dtype": config.dtype}
    float16 = config.dtype == "float16"
    islands = space.params.get("fp32_modules")
    if islands is not None and float16:
        joined = ",".join(config.fp32_modules)
        if not isinstance(islands, Mapping):
            if AmpConfig(fp32_modules=islands or "").fp32_modules != config.fp32_modules:
                return None
        elif joined in islands["choices"]:
            params["fp32_modules"] = joined
        else:
            return None
    elif config.fp32_modules:
        return None
    for key in NUMERIC_KNOBS:
        value = getattr(config, key)
        spec = space.params.get(key)
        if spec is None or (key in FLOAT16_ONLY and not float16):
            if key in FLOAT16_ONLY and float16 and value != getattr(AmpConfig(), key):
                return None
            if key == "clip_norm" and value is not None:
                return None
            continue
        if not isinstance(spec, Mapping):
            if value != spec:
                return None
            continue
        if spec.get("optional"):
            params[f"use_{key}"] = value is not None
            if value is None:
                continue
        if value is None or not spec["low"] <= value <= spec["high"]:
            return None
        params[key] = value
    return params


def distinct_configs(space: SearchSpace) -> int | None:
    """How many different configs the space can produce; ``None`` when a range makes it
    endless. (A purely categorical space runs out: the search stops once all have run.)"""
    total = 0
    for dtype in space.dtypes:
        count = 1
        for key in NUMERIC_KNOBS:
            spec = space.params.get(key)
            if not isinstance(spec, Mapping) or (key in FLOAT16_ONLY and dtype != "float16"):
                continue
            if spec["low"] != spec["high"]:
                return None
            count *= 2 if spec.get("optional") else 1
        islands = space.params.get("fp32_modules")
        if isinstance(islands, Mapping) and dtype == "float16":
            count *= len(set(islands["choices"]))
        total += count
    return total
