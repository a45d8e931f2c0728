"""float8's part of a search space: its knobs (torchao's recipe, the precision around it,
the scale rounding), suggested, named back from a config, counted and checked. (The layers a
float8 trial may keep out of float8, ``float8_islands``, and the default space gaining float8
are the search's setup: :mod:`scalertune._search._setup`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from scalertune._amp._config import FLOAT8_AROUND, FLOAT8_KNOBS, FLOAT8_RECIPES, AmpConfig
from scalertune._errors import UsageError

#: The values each float8 knob may take (a space file names them as ``choices`` or one value).
FLOAT8_CHOICES: dict[str, tuple[Any, ...]] = {
    "float8_recipe": FLOAT8_RECIPES,
    "float8_around": FLOAT8_AROUND,
    "float8_round_scales": (None, True, False),
}


def suggest_float8(params: Mapping[str, Any], trial: optuna.Trial) -> dict[str, Any]:
    """The float8 knobs of a float8 trial; rowwise_with_gw_hp runs around float32 only."""
    values: dict[str, Any] = {}
    for key in FLOAT8_KNOBS:
        spec = params.get(key)
        if spec is None or (key == "float8_around" and _gw_hp(values)):
            continue
        values[key] = (
            trial.suggest_categorical(key, list(spec["choices"]))
            if isinstance(spec, Mapping)
            else spec
        )
    return values


def _gw_hp(values: Mapping[str, Any]) -> bool:
    return values.get("float8_recipe") == "rowwise_with_gw_hp"


def float8_params_for(params: Mapping[str, Any], config: AmpConfig) -> dict[str, Any] | None:
    """The parameters that name ``config``'s float8 knobs in a space's ``params`` (``None``:
    they cannot)."""
    found: dict[str, Any] = {}
    for key in FLOAT8_KNOBS:
        value, spec = getattr(config, key), params.get(key)
        if key == "float8_around" and _gw_hp({"float8_recipe": config.float8_recipe}):
            spec = None if value == "float32" else spec
        if spec is None:
            if value != getattr(AmpConfig(), key):
                return None
        elif not isinstance(spec, Mapping):
            if value != spec:
                return None
        elif value in spec["choices"]:
            found[key] = value
        else:
            return None
    return found


def float8_distinct(params: Mapping[str, Any]) -> int:
    """How many float8 settings a space's knobs make (rowwise_with_gw_hp around float32 only)."""
    choices = {
        k: list(params[k]["choices"]) if isinstance(params.get(k), Mapping) else [params.get(k)]
        for k in FLOAT8_KNOBS
    }
    around = len(set(choices["float8_around"]))
    per_recipe = sum(
        1 if r == "rowwise_with_gw_hp" else around for r in set(choices["float8_recipe"])
    )
    return per_recipe * len(set(choices["float8_round_scales"]))


def check_float8(space: str, key: str, spec: Any) -> None:
    where = f"search space {space!r}: {key}"
    choices = spec.get("choices") if isinstance(spec, Mapping) else [spec]
    if isinstance(spec, Mapping) and set(spec) - {"choices"}:
        raise UsageError(f"{where} takes only 'choices'")
    allowed = FLOAT8_CHOICES[key]
    if not isinstance(choices, list) or not choices or any(c not in allowed for c in choices):
        wrong = [c for c in choices if c not in allowed] if isinstance(choices, list) else []
        got = ", ".join(map(repr, wrong)) if wrong else repr(spec)
        raise UsageError(
            f"{where} must be one of, or choices of, {', '.join(map(str, allowed))}; got {got}"
        )
