"""Search spaces: which AMP configs a study may try, read from YAML and validated up front.

A space file names its parameters in Optuna's own terms::

    dtype:
      choices: [float16, bfloat16]
    init_scale: {low: 1.0, high: 16777216.0, log: true}
    growth_factor: {low: 1.5, high: 4.0}
    backoff_factor: {low: 0.25, high: 0.75}
    growth_interval: {low: 10, high: 5000, log: true}
    clip_norm: {low: 0.1, high: 100.0, log: true, optional: true}

A plain value fixes a parameter (``init_scale: 4096``); a parameter left out keeps PyTorch's
default. The scaler's four knobs are searched only on trials that choose float16: bfloat16 has
float32's exponent range and runs without a scaler. ``optional: true`` on ``clip_norm`` also
tries no clipping at all. ``fp32_modules`` (float16 trials only) keeps modules in float32:
``fp32_modules: {choices: ["", "attn.score"]}`` tries with and without that island. Entries
are ``model.named_modules()`` names or glob patterns over them (``"*.DenseReluDense.wo"``);
each must select a module of the model, which the search checks before any study row exists.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from importlib import resources
from typing import Any

import optuna

from scalertune._amp._config import (
    ALL_DTYPES,
    FLOAT8_KNOBS,
    SCALER_KNOBS,
    AmpConfig,
    parse_islands,
)
from scalertune._amp._yaml import parse_yaml, read_yaml
from scalertune._errors import UsageError
from scalertune._judge._settings import dtype_choices, space_dtypes
from scalertune._search import _deepspeed
from scalertune._search._float8_space import (
    check_float8,
    float8_distinct,
    float8_params_for,
    suggest_float8,
)
from scalertune._search._sampler import DtypeSampler
from scalertune._storage._optuna import fixed_params

_RANGE_KEYS = {"low", "high", "log", "step", "optional"}
#: Searched, like the scaler's knobs, only on float16 trials: the range problem islands fix.
FLOAT16_ONLY = (*SCALER_KNOBS, "fp32_modules")
NUMERIC_KNOBS = (*SCALER_KNOBS, "clip_norm")
#: The dtypes whose trials search the float32 islands: float16's range, float8's precision.
ISLAND_DTYPES = ("float16", "float8")


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A validated search space; :meth:`suggest` turns an Optuna trial into an AmpConfig.

    Example:
        >>> from scalertune import SearchSpace
        >>> space = SearchSpace.from_dict({"dtype": {"choices": ["bfloat16"]}}, name="bf16")
        >>> space.dtypes
        ('bfloat16',)
    """

    name: str
    params: Mapping[str, Any]
    description: str = ""

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The autocast dtypes the space tries."""
        return space_dtypes(self.params)

    @property
    def dtype_choices(self) -> list[str]:
        """The choices of the ``dtype`` parameter every run of its study records."""
        return dtype_choices(self.params)

    @classmethod
    def load(cls, name_or_path: str) -> SearchSpace:
        """A shipped space by name, or a space YAML.

        Args:
            name_or_path: ``"default"`` (float16 and bfloat16, every knob), ``"float16"``,
                ``"bfloat16"``, or the path of a YAML file in the module's format.

        Returns:
            The validated space, named after the shipped space or the file.

        Raises:
            UsageError: No such file or shipped space, or a file that is not a valid space (the
                message names the key and what it may be).

        Example:
            >>> from scalertune import SearchSpace
            >>> space = SearchSpace.load("bfloat16")
            >>> space.dtypes, space.distinct_configs()
            (('bfloat16',), None)
        """
        path = name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path
        # a FIFO or a folder named as the file: read_yaml says what it is
        if os.path.isfile(name_or_path) or (path and os.path.lexists(name_or_path)):
            data = read_yaml(name_or_path, what="a search space")
            name = os.path.splitext(os.path.basename(name_or_path))[0]
        else:
            if path:
                raise UsageError(f"no such search space file: {name_or_path}")
            shipped = shipped_spaces()
            if name_or_path not in shipped:
                raise UsageError(
                    f"unknown search space {name_or_path!r}: use one of "
                    f"{', '.join(sorted(shipped))}, or a path to a YAML file"
                )
            data = parse_yaml(shipped[name_or_path], where=f"search space {name_or_path}")
            name = name_or_path
        if not isinstance(data, Mapping):
            raise UsageError(f"search space {name_or_path} must be a mapping of parameters")
        data = dict(data)
        description = data.pop("description", "")
        return cls.from_dict(data, name=name, description=str(description))

    @classmethod
    def from_dict(
        cls, params: Mapping[str, Any], *, name: str, description: str = ""
    ) -> SearchSpace:
        """Validate ``params``, a space file's content without its ``description``.

        Args:
            params: Each parameter's range (``{low, high, log, step, optional}``), choices
                (``{choices: [...]}``) or fixed value, by name.
            name: The space's name (in messages, and in the study).
            description: A line saying what the space is for.

        Returns:
            The space.

        Raises:
            UsageError: An unknown key, or a range, choice or value a config cannot take.

        Example:
            >>> from scalertune import SearchSpace
            >>> SearchSpace.from_dict({"dtype": "bfloat16"}, name="bf16").dtypes
            ('bfloat16',)
            >>> SearchSpace.from_dict({"init_scale": {"choices": [1024.0, 4096.0]}}, name="x")
            Traceback (most recent call last):
            ...
            scalertune._errors.UsageError: search space 'x': init_scale ...
        """
        params = dict(params)
        known = (
            "dtype",
            *NUMERIC_KNOBS,
            "fp32_modules",
            *FLOAT8_KNOBS,
            "float8_islands",
            *_deepspeed.SPACE_KEYS,
        )
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise UsageError(
                f"search space {name!r}: unknown key(s) {', '.join(unknown)}; use "
                f"{', '.join(known)}"
            )
        _check_dtype(name, params.get("dtype", {"choices": ["float16"]}))
        for key in NUMERIC_KNOBS:
            if key in params:
                _check_numeric(name, key, params[key])
        for key in ("fp32_modules", "float8_islands"):
            if key in params:
                _check_islands(name, params[key], key)
        for key in FLOAT8_KNOBS:
            if key in params:
                check_float8(name, key, params[key])
        _deepspeed.check(name, params)
        return cls(name=name, params=params, description=description)

    @property
    def deepspeed(self) -> bool:
        """Whether the space is a DeepSpeed workload's, in its scaler's knobs."""
        return _deepspeed.is_deepspeed(self.params)

    def for_deepspeed(self, *, bfloat16: bool) -> SearchSpace:
        """The same space for a DeepSpeed workload, in the knobs of DeepSpeed's loss scaler.

        ``init_scale`` becomes ``initial_scale_power``, ``growth_interval``
        ``loss_scale_window``; ``hysteresis``, ``min_loss_scale`` and
        ``consecutive_hysteresis`` are kept where the space has them; growth and backoff
        factors and float32 islands are left out (see :mod:`scalertune._search._deepspeed`).
        A search does this itself for a DeepSpeed workload.

        Args:
            bfloat16: Whether the device runs bfloat16 (DeepSpeed's accelerator says): the
                space's bfloat16 is dropped where it does not.

        Returns:
            The DeepSpeed space (itself, where it is one already).

        Example:
            >>> from scalertune import SearchSpace
            >>> space = SearchSpace.load("float16").for_deepspeed(bfloat16=False)
            >>> space.dtypes, "initial_scale_power" in space.params
            (('float16',), True)
        """
        if self.deepspeed:
            return self
        return SearchSpace(
            name=self.name,
            params=_deepspeed.deepspeed_params(self.name, self.params, bfloat16=bfloat16),
            description=self.description,
        )

    @property
    def timed_dtypes(self) -> list[str]:
        """The dtypes whose step time a study measures: the space's, float32 (the reference)
        and float16 (the baselines; not in a float8 space, whose baseline is torchao's), in a
        fixed order."""
        baselines = set() if self.float8_only else {"float16"}
        return [d for d in ALL_DTYPES if d in {*self.dtypes, *baselines, "float32"}]

    @property
    def float8_only(self) -> bool:
        """Whether float8 is the one low precision the space tries (its baseline is torchao's
        defaults, not PyTorch's float16 ones)."""
        return "float8" in self.dtypes and "float16" not in self.dtypes

    @property
    def island_names(self) -> set[str]:
        """Every module name or pattern the space may keep in float32."""
        spec = self.params.get("fp32_modules")
        if spec is None:
            return set()
        choices = spec["choices"] if isinstance(spec, Mapping) else [spec]
        return {n for c in choices for n in parse_islands(c or "")}

    @property
    def fixed_islands(self) -> tuple[str, ...]:
        """The float32 islands every float16 run of this space has (``--fp32-modules``, or a
        plain value in the file); none when the space searches them or has none."""
        spec = self.params.get("fp32_modules")
        if spec is None or isinstance(spec, Mapping):
            return ()
        return parse_islands(spec or "")

    def with_islands(self, names: str) -> SearchSpace:
        """The same space with ``fp32_modules`` fixed to ``names`` (``--fp32-modules``).

        Args:
            names: Module names or glob patterns, comma-separated.

        Returns:
            A new space, named ``NAME+fp32:NAMES``.

        Raises:
            UsageError: ``names`` are not module names or patterns.

        Example:
            >>> from scalertune import SearchSpace
            >>> SearchSpace.load("default").with_islands("lm_head").fixed_islands
            ('lm_head',)
        """
        parsed = parse_islands(names)
        if not parsed:
            raise UsageError(
                f"--fp32-modules {names!r} names no module: give module names or patterns, "
                "comma-separated, or leave the flag out"
            )
        return SearchSpace.from_dict(
            {**self.params, "fp32_modules": names},
            name=f"{self.name}+fp32:{names}",
            description=self.description,
        )

    def sampler(self, *, seed: int | None = None) -> optuna.samplers.BaseSampler:
        """The sampler a study of this space uses: Optuna's TPE, ``dtype`` kept to the space's.

        Args:
            seed: The sampler's seed; ``None`` for a random one.

        Returns:
            The sampler (see :class:`DtypeSampler`).

        Example:
            >>> import optuna
            >>> from scalertune import SearchSpace
            >>> space = SearchSpace.load("bfloat16")
            >>> study = optuna.create_study(sampler=space.sampler(seed=0))  # doctest: +SKIP
        """
        return DtypeSampler(list(self.dtypes), seed=seed)

    def suggest(self, trial: optuna.Trial) -> AmpConfig:
        """Ask the trial for each searched parameter and build the config it names.

        Args:
            trial: An Optuna trial of a study whose sampler is :meth:`sampler` (or another that
                keeps ``dtype`` to the space's choices).

        Returns:
            The config.

        Raises:
            UsageError: The sampler proposed a dtype outside the space.

        Example:
            >>> import optuna
            >>> from scalertune import SearchSpace
            >>> space = SearchSpace.load("bfloat16")
            >>> study = optuna.create_study(sampler=space.sampler(seed=0))  # doctest: +SKIP
            >>> space.suggest(study.ask()).dtype  # doctest: +SKIP
            'bfloat16'
        """
        return _suggest(self, trial)

    def params_for(self, config: AmpConfig) -> dict[str, Any] | None:
        """The parameters :meth:`suggest` would record to produce ``config``.

        A baseline queued with these is a point of the same space as the sampled trials.

        Args:
            config: The config, taken before the workload's own clipping is applied: a
                ``clip_norm`` of ``None`` is "no clipping of its own", which the space spells
                ``use_clip_norm: false``.

        Returns:
            The parameters, or ``None`` when the space cannot produce ``config`` (a value outside
            a range, or fixed otherwise).

        Example:
            >>> from scalertune import AmpConfig, SearchSpace
            >>> SearchSpace.load("default").params_for(AmpConfig())["use_clip_norm"]
            False
            >>> SearchSpace.load("bfloat16").params_for(AmpConfig("bfloat16", clip_norm=1000.0))
        """
        return _params_for(self, config)

    def distinct_configs(self) -> int | None:
        """How many different configs the space can produce.

        A purely categorical space runs out: the search stops once all have run.

        Returns:
            The count, or ``None`` when a range makes it endless.

        Example:
            >>> from scalertune import SearchSpace
            >>> SearchSpace.from_dict({"dtype": {"choices": ["float16", "bfloat16"]}},
            ...                       name="dtypes").distinct_configs()
            2
        """
        return _distinct_configs(self)

    def to_dict(self) -> dict[str, Any]:
        """The space as the study stores it.

        Returns:
            ``name`` and ``params``.

        Example:
            >>> from scalertune import SearchSpace
            >>> SearchSpace.from_dict({"dtype": {"choices": ["bfloat16"]}}, name="bf16").to_dict()
            {'name': 'bf16', 'params': {'dtype': {'choices': ['bfloat16']}}}
        """
        return {"name": self.name, "params": dict(self.params)}


def _suggest(space: SearchSpace, trial: optuna.Trial) -> AmpConfig:
    # Every run of a study, the float32 references included, is a point of one dtype
    # parameter over all three dtypes; the space's sampler keeps to the space's choices.
    values: dict[str, Any] = {"dtype": trial.suggest_categorical("dtype", space.dtype_choices)}
    if values["dtype"] not in space.dtypes and "dtype" not in fixed_params(trial):
        raise UsageError(
            f"the study's sampler proposed dtype {values['dtype']!r}, outside "
            f"search space {space.name!r}: create the study with "
            "sampler=space.sampler()"
        )
    islands = space.params.get("fp32_modules")
    if islands is not None and values["dtype"] in ISLAND_DTYPES:
        values["fp32_modules"] = (
            trial.suggest_categorical("fp32_modules", list(islands["choices"]))
            if isinstance(islands, Mapping)
            else islands
        )
    if values["dtype"] == "float8":
        values.update(suggest_float8(space.params, trial))
        more = space.params.get("float8_islands")
        if more is not None:
            chosen = trial.suggest_categorical("float8_islands", list(more["choices"]))
            values["fp32_modules"] = tuple(  # a name given and chosen is kept once
                dict.fromkeys(
                    (*parse_islands(values.get("fp32_modules") or ""), *parse_islands(chosen or ""))
                )
            )
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
            values[key] = trial.suggest_float(
                key, float(spec["low"]), float(spec["high"]), **kwargs
            )
    if space.deepspeed:
        return _deepspeed.suggest(space.params, trial, values)
    return AmpConfig(**values)


def _params_for(space: SearchSpace, config: AmpConfig) -> dict[str, Any] | None:
    params: dict[str, Any] = {"dtype": config.dtype}
    float16 = config.dtype == "float16"
    if config.float8:
        knobs = float8_params_for(space.params, config)
        if knobs is None:
            return None
        params.update(knobs)
    keys: tuple[str, ...] = NUMERIC_KNOBS
    if space.deepspeed:  # its scaler's knobs, and clip_norm below
        knobs = _deepspeed.params_for(space.params, config)
        if knobs is None:
            return None
        params.update(knobs)
        keys = ("clip_norm",)
    config_islands = config.fp32_modules
    more = space.params.get("float8_islands")
    if config.float8 and isinstance(more, Mapping):
        fixed = space.fixed_islands
        extra = ",".join(m for m in config_islands if m not in fixed)
        if extra not in more["choices"]:
            return None
        params["float8_islands"] = extra
        config = dataclasses.replace(config, fp32_modules=fixed)
    islands = space.params.get("fp32_modules")
    if islands is not None and config.dtype in ISLAND_DTYPES:
        joined = ",".join(config.fp32_modules)
        if not isinstance(islands, Mapping):
            if parse_islands(islands or "") != config.fp32_modules:
                return None
        elif joined in islands["choices"]:
            params["fp32_modules"] = joined
        else:
            return None
    elif config.fp32_modules:
        return None
    for key in keys:
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


def _distinct_configs(space: SearchSpace) -> int | None:
    total = 0
    for dtype in space.dtypes:
        count = 1
        if space.deepspeed and dtype == "float16":
            knobs = _deepspeed.distinct(space.params)
            if knobs is None:
                return None
            count = knobs
        for key in NUMERIC_KNOBS:
            spec = space.params.get(key)
            if not isinstance(spec, Mapping) or (key in FLOAT16_ONLY and dtype != "float16"):
                continue
            if spec["low"] != spec["high"]:
                return None
            count *= 2 if spec.get("optional") else 1
        islands = space.params.get("fp32_modules")
        if isinstance(islands, Mapping) and dtype in ISLAND_DTYPES:
            count *= len(set(islands["choices"]))
        if dtype == "float8":
            count *= float8_distinct(space.params)
            more = space.params.get("float8_islands")
            count *= len(set(more["choices"])) if isinstance(more, Mapping) else 1
        total += count
    return total


def shipped_spaces() -> dict[str, str]:
    """Name -> YAML text of the spaces that ship inside the package.

    Installed, they are the package ``scalertune.search_spaces``. In a source tree that is
    imported without being installed (the tests of an unpacked sdist, run from its folder),
    they are the ``search_spaces`` folder beside the package.
    """
    try:
        folder: Any = resources.files("scalertune.search_spaces")
    except ModuleNotFoundError:
        folder = pathlib.Path(__file__).resolve().parents[2] / "search_spaces"
    return {
        entry.name.rsplit(".", 1)[0]: entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    }


def _check_dtype(space: str, spec: Any) -> None:
    choices = spec.get("choices") if isinstance(spec, Mapping) else [spec]
    if isinstance(spec, Mapping) and set(spec) - {"choices"}:
        raise UsageError(f"search space {space!r}: dtype takes only 'choices'")
    if not isinstance(choices, list) or not choices:
        raise UsageError(f"search space {space!r}: dtype needs a non-empty list of choices")
    for choice in choices:
        if choice not in ("float16", "bfloat16", "float8"):
            raise UsageError(
                f"search space {space!r}: unknown dtype {choice!r}; use float16, bfloat16 or "
                "float8 (float32 always runs as the reference)"
            )


def _check_islands(space: str, spec: Any, key: str) -> None:
    where = f"search space {space!r}: {key}"
    choices = spec.get("choices") if isinstance(spec, Mapping) else [spec]
    if isinstance(spec, Mapping) and set(spec) - {"choices"}:
        raise UsageError(f"{where} takes only 'choices'")
    if (
        not isinstance(choices, list)
        or not choices
        or not all(c is None or isinstance(c, str) for c in choices)
    ):
        raise UsageError(
            f"{where} must be module names or glob patterns "
            "('attn.score,*.DenseReluDense.wo') or choices of them ('' for none)"
        )


def _check_numeric(space: str, key: str, spec: Any) -> None:
    where = f"search space {space!r}: {key}"
    if not isinstance(spec, Mapping):
        values = [spec]
    else:
        unknown = sorted(set(spec) - _RANGE_KEYS)
        if unknown:
            raise UsageError(
                f"{where} has unknown key(s) {', '.join(unknown)}; use low, high, "
                "log, step (and optional for clip_norm)"
            )
        if "low" not in spec or "high" not in spec:
            raise UsageError(f"{where} needs both low and high (or a single fixed value)")
        if spec.get("optional") and key != "clip_norm":
            raise UsageError(f"{where}: only clip_norm can be optional")
        if spec.get("log") and spec.get("step") is not None:
            raise UsageError(f"{where}: log and step cannot be combined (Optuna's rule)")
        values = [spec["low"], spec["high"]]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UsageError(f"{where}: low and high must be numbers, got {v!r}")
        if spec["low"] > spec["high"]:
            raise UsageError(f"{where}: low ({spec['low']}) is greater than high ({spec['high']})")
        if "step" in spec and not (isinstance(spec["step"], (int, float)) and spec["step"] > 0):
            raise UsageError(f"{where}: step must be a positive number")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UsageError(f"{where} must be a number, got {v!r}")
        knob: dict[str, Any] = {key: v}  # AmpConfig checks the value by the knob's name
        try:
            AmpConfig(**knob)
        except UsageError as exc:
            raise UsageError(f"search space {space!r}: {exc}") from None
