"""AmpConfig: the settings one mixed-precision run uses, and nothing else."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from scalertune._amp._modules import _split
from scalertune._errors import UsageError
from scalertune._limits import FLOAT32_MAX, FLOAT32_TINY
from scalertune._text import shown

#: What ``dtype`` may name. float32 means "no autocast, no scaler": the reference. float8 is
#: torchao's float8 training of the Linear layers (see :mod:`scalertune._amp._float8`); it is
#: not among :data:`DTYPES`, the choices a study without float8 records, so that the studies
#: made before it still resume with the same ``dtype`` distribution.
DTYPES = ("float16", "bfloat16", "float32")
ALL_DTYPES = (*DTYPES, "float8")

#: torchao's float8 recipes, fastest first: one scale per tensor; one per row (an outlier
#: spoils its own row only); one per row with the weight gradient computed in high precision.
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")

#: The precision around the float8 matmuls: bfloat16 autocast, or none (float32).
FLOAT8_AROUND = ("float32", "bfloat16")

#: The float8 knobs, by their flat names here (the YAML nests them in a ``float8`` block),
#: with torchao's defaults: what every config that is not float8 holds.
FLOAT8_DEFAULTS: dict[str, Any] = {
    "float8_recipe": "tensorwise",
    "float8_around": "float32",
    "float8_round_scales": None,
}
FLOAT8_KNOBS = tuple(FLOAT8_DEFAULTS)

#: GradScaler counts finite steps towards ``growth_interval`` in an int32 tensor.
MAX_GROWTH_INTERVAL = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class AmpConfig:
    """The knobs of one AMP configuration, with PyTorch's defaults.

    Only float16 needs a loss scaler: its largest finite value is 65504 and its smallest
    subnormal is about 6e-8, so gradients are multiplied by the scale before backward
    (keeping small ones from flushing to zero) and divided again before the optimizer sees
    them. bfloat16 has float32's exponent range and runs unscaled; float32 runs without
    autocast at all. Without a scaler the four scaler knobs mean nothing and are reset to
    PyTorch's defaults, so two configs that train alike compare equal.

    Args:
        dtype: The autocast dtype: ``"float16"`` (the default), ``"bfloat16"`` or
            ``"float32"`` (no autocast, no scaler: the reference).
        init_scale: The scale the scaler starts at (PyTorch's ``2**16`` by default).
        growth_factor: What the scale is multiplied by after ``growth_interval`` consecutive
            finite steps (2.0); must be above 1.
        backoff_factor: What the scale is multiplied by on each step whose gradients hold inf
            or NaN, a step that is skipped (0.5); in (0, 1).
        growth_interval: The finite steps in a row before the scale grows (2000).
        clip_norm: The global gradient norm to clip to, *after* unscaling; ``None`` (the
            default) for no clipping.
        fp32_modules: Modules (as ``model.named_modules()`` names them) that run with autocast
            off and their inputs cast to float32: *float32 islands*, for activations that
            exceed float16's range in the forward pass, where no loss scale can help. An entry
            may be a glob pattern over those names (``*.DenseReluDense.wo``: every T5
            feed-forward output layer); a comma-separated string is split. Empty by default.
            Under float8 an island is also kept out of float8: the Linear layers that float8
            would spoil run in float32.
        float8_recipe: float8 only: torchao's recipe, ``"tensorwise"`` (torchao's default, the
            fastest: one scale per tensor, so one massive value flushes the rest of its tensor
            towards zero), ``"rowwise"`` (one scale per row) or ``"rowwise_with_gw_hp"`` (per
            row, the weight gradient in high precision; with ``float8_around`` float32 only).
        float8_around: float8 only: the precision of everything outside the float8 matmuls,
            ``"float32"`` (the default: no autocast) or ``"bfloat16"`` (bfloat16 autocast).
        float8_round_scales: float8 only: round each float8 scale down to a power of two
            (exact to apply, a little less range used); ``None`` (the default) keeps the
            recipe's own choice (off for tensorwise, on for the rowwise recipes).

    Raises:
        UsageError: An unknown ``dtype``, or a knob out of its range (the message names it
            and the range).

    Example:
        >>> from scalertune import AmpConfig
        >>> AmpConfig(dtype="float16", init_scale=4096.0).uses_scaler
        True
        >>> AmpConfig(dtype="bfloat16", init_scale=4096.0) == AmpConfig(dtype="bfloat16")
        True
        >>> AmpConfig(fp32_modules="encoder.*.wo, lm_head").fp32_modules
        ('encoder.*.wo', 'lm_head')
        >>> AmpConfig(dtype="float8", float8_recipe="rowwise").to_dict()["float8"]
        {'recipe': 'rowwise', 'around': 'float32', 'round_scales_to_power_of_2': None}
    """

    dtype: str = "float16"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clip_norm: float | None = None
    fp32_modules: tuple[str, ...] = ()
    float8_recipe: str = "tensorwise"
    float8_around: str = "float32"
    float8_round_scales: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp32_modules", parse_islands(self.fp32_modules))
        if not isinstance(self.dtype, str) or self.dtype not in ALL_DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}: use one of {', '.join(ALL_DTYPES)}")
        _check_float8(self)
        if not all(isinstance(name, str) and name for name in self.fp32_modules):
            raise UsageError(f"fp32_modules must be module names, got {self.fp32_modules!r}")
        _check(
            "init_scale",
            self.init_scale,
            "a number, finite and at least 2**-126 (float32's smallest normal number: "
            "GradScaler keeps its scale in float32, where a smaller one rounds toward 0)",
            lambda v: v >= FLOAT32_TINY,
        )
        _check("growth_factor", self.growth_factor, "> 1 and finite", lambda v: v > 1)
        _check("backoff_factor", self.backoff_factor, "in (0, 1)", lambda v: 0 < v < 1)
        _check(
            "growth_interval",
            self.growth_interval,
            f"an integer >= 1 (at most {MAX_GROWTH_INTERVAL})",
            lambda v: v % 1 == 0 and 1 <= v <= MAX_GROWTH_INTERVAL,
        )
        object.__setattr__(self, "growth_interval", int(self.growth_interval))
        if self.clip_norm is not None:
            _check("clip_norm", self.clip_norm, "> 0 and finite, or null", lambda v: v > 0)
        if not self.uses_scaler:
            # Without a scaler the four knobs mean nothing; normalised, two configs that train
            # alike compare equal (a study never trains the same config twice).
            for knob in SCALER_KNOBS:
                object.__setattr__(self, knob, getattr(_DEFAULTS, knob))
        if not self.float8:
            for knob, default in FLOAT8_DEFAULTS.items():
                object.__setattr__(self, knob, default)

    @property
    def uses_scaler(self) -> bool:
        """Whether a GradScaler is active (float16 only: torchao's float8 scales each tensor
        itself, from its own largest value, at every matmul)."""
        return self.dtype == "float16"

    @property
    def float8(self) -> bool:
        """Whether the Linear layers train in float8 (torchao's float8 training)."""
        return self.dtype == "float8"

    @property
    def autocast_dtype(self) -> str:
        """The dtype autocast runs in around the matmuls: float8's ``float8_around``, or the
        config's own dtype (``"float32"``: no autocast)."""
        return self.float8_around if self.float8 else self.dtype

    def float8_block(self) -> dict[str, Any]:
        """The YAML's ``float8`` block.

        Returns:
            ``recipe``, ``around`` and ``round_scales_to_power_of_2`` (``None``: the recipe's).

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig(dtype="float8", float8_around="bfloat16").float8_block()["around"]
            'bfloat16'
        """
        return {
            "recipe": self.float8_recipe,
            "around": self.float8_around,
            "round_scales_to_power_of_2": self.float8_round_scales,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, in a stable key order: what the YAML file and Optuna store.

        Returns:
            ``dtype``, the scaler's four knobs (float16 alone), ``clip_norm`` and, when there are
            islands, ``fp32_modules``.

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig(dtype="bfloat16", clip_norm=1.0).to_dict()
            {'dtype': 'bfloat16', 'clip_norm': 1.0}
        """
        scaler = (
            {
                "init_scale": float(self.init_scale),
                "growth_factor": float(self.growth_factor),
                "backoff_factor": float(self.backoff_factor),
                "growth_interval": int(self.growth_interval),
            }
            if self.uses_scaler
            else {}
        )
        islands = {"fp32_modules": list(self.fp32_modules)} if self.fp32_modules else {}
        float8 = {"float8": self.float8_block()} if self.float8 else {}
        return {
            "dtype": self.dtype,
            **scaler,
            **float8,
            "clip_norm": None if self.clip_norm is None else float(self.clip_norm),
            **islands,
        }

    def with_clip(self, clip_norm: float | None) -> AmpConfig:
        """This config, clipping at ``clip_norm`` where it does not clip itself.

        The workload's own clipping applies to every run that does not choose another.

        Args:
            clip_norm: The workload's clipping norm; ``None`` leaves the config as it is.

        Returns:
            This config, or a copy clipping at ``clip_norm``.

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig().with_clip(1.0).clip_norm
            1.0
            >>> AmpConfig(clip_norm=5.0).with_clip(1.0).clip_norm
            5.0
        """
        if self.clip_norm is not None or clip_norm is None:
            return self
        return dataclasses.replace(self, clip_norm=float(clip_norm))

    def knobs_changed(self, clip_norm: float | None = None) -> int:
        """How many knobs differ from PyTorch's defaults (and from the workload's clipping).

        Among configs equally fast and stable, fewer is simpler: a tie goes to the simpler config.

        Args:
            clip_norm: The workload's own clipping norm, which counts as unchanged.

        Returns:
            The count; the islands count as one knob, and float8's recipe as its steps from
            torchao's default (``rowwise_with_gw_hp`` is ``rowwise`` with the weight gradient
            in high precision too, and slower again on a GPU).

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig(init_scale=4096.0, clip_norm=1.0).knobs_changed(clip_norm=1.0)
            1
            >>> AmpConfig(dtype="float8", float8_recipe="rowwise_with_gw_hp").knobs_changed()
            3
        """
        changed = int(self.dtype != _DEFAULTS.dtype) + int(self.clip_norm != clip_norm)
        changed += sum(int(getattr(self, k) != getattr(_DEFAULTS, k)) for k in SCALER_KNOBS)
        changed += sum(
            int(getattr(self, k) != getattr(_DEFAULTS, k))
            for k in FLOAT8_KNOBS
            if k != "float8_recipe"
        )
        changed += FLOAT8_RECIPES.index(self.float8_recipe)
        return changed + int(bool(self.fp32_modules))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AmpConfig:
        """Build from a mapping (a YAML's ``config`` block), rejecting unknown keys by name.

        A mapping with an ``fp16`` block (DeepSpeed's, as a DeepSpeed search writes it) is a
        :class:`DeepSpeedFp16Config`.

        Args:
            data: The knobs by name, as :meth:`to_dict` writes them; missing ones take their
                defaults.

        Returns:
            The config (a :class:`DeepSpeedFp16Config` for an ``fp16`` block).

        Raises:
            UsageError: ``data`` is not a mapping, holds an unknown key, or a value out of range.

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig.from_dict({"dtype": "float16", "init_scale": 1024}).init_scale
            1024
            >>> AmpConfig.from_dict({"scale": 1024})
            Traceback (most recent call last):
            ...
            scalertune._errors.UsageError: unknown config key(s) scale: use backoff_factor, ...
        """
        if not isinstance(data, Mapping):
            raise UsageError(f"an AMP config must be a mapping, got {type(data).__name__}")
        if "fp16" in data:
            return DeepSpeedFp16Config.from_dict(data)
        if "float8" in data:
            data = {**{k: v for k, v in data.items() if k != "float8"}, **_float8_knobs(data)}
        known = {f.name for f in dataclasses.fields(AmpConfig)} - set(FLOAT8_KNOBS) | {"float8"}
        if any(k in data for k in FLOAT8_KNOBS):
            known |= set(FLOAT8_KNOBS)
        unknown = sorted(map(str, set(data) - known))  # a key YAML read as a number too
        if unknown:
            raise UsageError(
                f"unknown config key(s) {', '.join(unknown)}: use {', '.join(sorted(known))}"
            )
        try:
            return AmpConfig(**data)
        except TypeError as exc:
            raise UsageError(f"invalid AMP config: {exc}") from None

    def describe(self) -> str:
        """One short line that says the config.

        Returns:
            E.g. ``float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip``.

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig(init_scale=4096.0).describe()
            'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip'
        """
        clip = "no clip" if self.clip_norm is None else f"clip {self.clip_norm:.3g}"
        if self.fp32_modules:
            clip += f", float32: {','.join(self.fp32_modules)}"
        if self.float8:
            rounding = {True: ", scales 2**n", False: ", scales exact", None: ""}
            return (
                f"float8 {self.float8_recipe}{rounding[self.float8_round_scales]} in "
                f"{self.float8_around}, {clip}"
            )
        if not self.uses_scaler:
            return f"{self.dtype}, {clip}"
        return (
            f"float16 scale={self.init_scale:.4g} growth={self.growth_factor:.3g} "
            f"backoff={self.backoff_factor:.3g} every {self.growth_interval}, {clip}"
        )


SCALER_KNOBS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")

_FLOAT8_BLOCK = {
    "recipe": "float8_recipe",
    "around": "float8_around",
    "round_scales_to_power_of_2": "float8_round_scales",
}


def _float8_knobs(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config's ``float8`` block as the flat knobs :class:`AmpConfig` holds."""
    block = data["float8"]
    if data.get("dtype", "float16") != "float8":
        raise UsageError(f"a float8 block belongs to dtype float8, got dtype {data['dtype']!r}")
    if not isinstance(block, Mapping):
        raise UsageError(f"the config's float8 block must be a mapping, got {shown(block)}")
    unknown = sorted(map(str, set(block) - set(_FLOAT8_BLOCK)))
    if unknown:
        raise UsageError(
            f"the float8 block has unknown key(s) {', '.join(unknown)}: use "
            f"{', '.join(_FLOAT8_BLOCK)}"
        )
    return {_FLOAT8_BLOCK[k]: v for k, v in block.items()}


def _check_float8(config: AmpConfig) -> None:
    if not isinstance(config.float8_recipe, str) or config.float8_recipe not in FLOAT8_RECIPES:
        raise UsageError(
            f"float8 recipe must be one of {', '.join(FLOAT8_RECIPES)}, got "
            f"{shown(config.float8_recipe)}"
        )
    if not isinstance(config.float8_around, str) or config.float8_around not in FLOAT8_AROUND:
        raise UsageError(
            f"float8 'around' must be one of {', '.join(FLOAT8_AROUND)}, got "
            f"{shown(config.float8_around)}"
        )
    if config.float8_round_scales not in (None, True, False):
        raise UsageError(
            "float8 round_scales_to_power_of_2 must be true, false or null (the recipe's), got "
            f"{shown(config.float8_round_scales)}"
        )
    if config.float8_recipe == "rowwise_with_gw_hp" and config.float8_around != "float32":
        raise UsageError(
            "float8 recipe rowwise_with_gw_hp computes the weight gradient in float32, which "
            "torchao cannot mix with bfloat16 autocast: use around float32 with it"
        )


def parse_islands(islands: object) -> tuple[str, ...]:
    """``fp32_modules`` as :class:`AmpConfig` holds it: a comma-separated string split into its
    names (``""`` or ``"none"``: none), a list or tuple as a tuple, ``None`` as none."""
    if isinstance(islands, str):
        return _split(islands)
    if not isinstance(islands, (list, tuple)) and islands is not None:
        raise UsageError(f"fp32_modules must be module names, got {islands!r}")
    return tuple(islands or ())


def _check(name: str, value: Any, wanted: str, ok: Callable[[float], bool]) -> None:
    """``value`` must be a real number (not a bool, not a string), finite in float32, where
    the scaler keeps it, and ``ok``."""
    # abs() <= a finite bound is False for NaN and inf, and exact for ints of any size.
    number = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and abs(value) <= FLOAT32_MAX
    )
    if not (number and ok(value)):
        raise UsageError(f"{name} must be {wanted}, got {shown(value)}")


#: PyTorch's own defaults: what a user gets from a bare ``GradScaler()``.
PYTORCH_DEFAULT = _DEFAULTS = AmpConfig()

#: The fix the seed article found by hand: the default with ``init_scale=4096``.
SEED_ARTICLE_FIX = AmpConfig(init_scale=4096.0)

#: The baselines every study runs once, by name.
BASELINES = {"pytorch-default": PYTORCH_DEFAULT, "init-scale-4096": SEED_ARTICLE_FIX}

FLOAT32 = AmpConfig(dtype="float32")

#: torchao's own float8 defaults: ``convert_to_float8_training(model)`` on a float32 model,
#: every Linear layer in float8 with one scale per tensor.
TORCHAO_DEFAULT = AmpConfig(dtype="float8")

#: DeepSpeed's own values for the keys of a config's ``fp16`` block that drive its dynamic
#: loss scaler (``deepspeed/runtime/precision_config.py``): what a block without them gets.
FP16_DEFAULTS = {
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "consecutive_hysteresis": False,
    "min_loss_scale": 1,
}

#: Keys an ``fp16`` block may hold that leave the loss scaler alone (``auto_cast`` casts the
#: inputs, the other keeps master weights in half for DeepSpeed's CPU Adam).
FP16_OTHER_KEYS = ("auto_cast", "fp16_master_weights_and_grads")


@dataclasses.dataclass(frozen=True)
class DeepSpeedFp16Config(AmpConfig):
    """float16 in DeepSpeed's engine, under DeepSpeed's own dynamic loss scaler: the settings
    of a DeepSpeed config's ``fp16`` block, and its ``gradient_clipping``.

    DeepSpeed casts the whole model to float16 (no autocast) and keeps float32 master
    weights in its optimizer. Its scaler (``DynamicLossScaler``) starts at
    ``init_scale = 2**initial_scale_power``. An overflow skips the step; it halves the scale
    only once ``hysteresis`` overflows have come without a growth between (with
    ``consecutive_hysteresis``, without a clean step between), and never below
    ``min_loss_scale``: under ZeRO an overflow *at* ``min_loss_scale`` raises and ends the
    training. It doubles the scale after ``loss_scale_window`` (``growth_interval`` here)
    clean steps counted from the last overflow. It grows by 2 and backs off by 0.5 always.

    Example:
        >>> from scalertune._amp._config import DeepSpeedFp16Config
        >>> config = DeepSpeedFp16Config.from_fp16_block(
        ...     {"enabled": True, "initial_scale_power": 12, "hysteresis": 1})
        >>> config.fp16_block()["initial_scale_power"], config.growth_interval
        (12, 1000)
        >>> AmpConfig.from_dict(config.to_dict()) == config
        True
    """

    # DeepSpeed's defaults (FP16_DEFAULTS): its window is 1000, GradScaler's interval 2000
    growth_interval: int = 1000
    hysteresis: int = 2
    min_loss_scale: int = 1
    consecutive_hysteresis: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype != "float16":
            raise UsageError(
                f"a DeepSpeed fp16 config trains float16, got dtype {self.dtype!r}: bfloat16 "
                "and float32 in DeepSpeed are plain configs of that dtype"
            )
        if self.fp32_modules:
            raise UsageError(
                "DeepSpeed's fp16 mode casts the whole model to float16: it has no float32 "
                "islands (keep those modules' computation in float32 in the model's code)"
            )
        power = math.log2(self.init_scale)
        if power != round(power) or power < 0:
            raise UsageError(
                f"DeepSpeed's initial scale is 2**initial_scale_power, a whole power of two "
                f">= 1: got init_scale {shown(self.init_scale)}"
            )
        if self.growth_factor != 2.0 or self.backoff_factor != 0.5:
            raise UsageError(
                "DeepSpeed's scaler grows by 2 and backs off by 0.5: growth_factor and "
                "backoff_factor cannot change"
            )
        for name, value in (
            ("hysteresis", self.hysteresis),
            ("min_loss_scale", self.min_loss_scale),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**126:
                raise UsageError(f"{name} must be an integer >= 1, got {shown(value)}")
        if not isinstance(self.consecutive_hysteresis, bool):
            raise UsageError(
                "consecutive_hysteresis must be true or false, got "
                f"{shown(self.consecutive_hysteresis)}"
            )

    @property
    def initial_scale_power(self) -> int:
        return round(math.log2(self.init_scale))

    def fp16_block(self) -> dict[str, Any]:
        """The ``fp16`` block of a DeepSpeed config that sets this scaler up (dynamic scaling:
        ``loss_scale`` 0)."""
        return {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": self.initial_scale_power,
            "loss_scale_window": self.growth_interval,
            "hysteresis": self.hysteresis,
            "consecutive_hysteresis": self.consecutive_hysteresis,
            "min_loss_scale": self.min_loss_scale,
        }

    @classmethod
    def from_fp16_block(
        cls, block: Mapping[str, Any], *, clip_norm: float | None = None, name: str = "fp16"
    ) -> DeepSpeedFp16Config:
        """The config a DeepSpeed ``fp16`` block sets up (DeepSpeed's own values where it says
        none); ``name`` is how an error names the block. Only an enabled block with dynamic
        scaling (``loss_scale`` 0) has a scaler to search or predict."""
        if not isinstance(block, Mapping):
            raise UsageError(
                f"{name} must be a mapping (DeepSpeed's fp16 block), got {shown(block)}"
            )
        unknown = sorted(set(block) - {"enabled", "loss_scale", *FP16_DEFAULTS, *FP16_OTHER_KEYS})
        if unknown:
            raise UsageError(
                f"{name} has unknown key(s) {', '.join(map(str, unknown))}: DeepSpeed's "
                f"fp16 block takes enabled, loss_scale, {', '.join(FP16_DEFAULTS)}"
            )
        if block.get("enabled") is not True:
            raise UsageError(
                f'{name} must enable fp16 ("enabled": true; DeepSpeed\'s default is false), got '
                f"{shown(block.get('enabled'))}: without it DeepSpeed trains with no loss scaler"
            )
        if block.get("loss_scale", 0) != 0:
            raise UsageError(
                f"{name} has loss_scale {shown(block['loss_scale'])}, a static scale: set "
                "loss_scale 0 for DeepSpeed's dynamic scaler"
            )
        values = {
            **FP16_DEFAULTS,
            **{k: _as_deepspeed_reads(k, block[k]) for k in FP16_DEFAULTS if k in block},
        }
        if "auto" in values.values():
            raise UsageError(
                f"{name} has 'auto' values, which only Hugging Face's Trainer fills in: give "
                "the numbers"
            )
        power = values["initial_scale_power"]
        if isinstance(power, bool) or not isinstance(power, int) or not 0 <= power <= 127:
            raise UsageError(
                f"{name}['initial_scale_power'] must be an integer from 0 to 127, got "
                f"{shown(power)}"
            )
        return cls(
            init_scale=float(2**power),
            growth_interval=values["loss_scale_window"],
            hysteresis=values["hysteresis"],
            min_loss_scale=values["min_loss_scale"],
            consecutive_hysteresis=values["consecutive_hysteresis"],
            clip_norm=clip_norm,
        )

    def to_dict(self) -> dict[str, Any]:
        """``dtype``, the ``fp16`` block and ``clip_norm`` (DeepSpeed's
        ``gradient_clipping``): what the YAML file and Optuna store."""
        return {
            "dtype": self.dtype,
            "fp16": self.fp16_block(),
            "clip_norm": None if self.clip_norm is None else float(self.clip_norm),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeepSpeedFp16Config:
        unknown = sorted(set(data) - {"dtype", "fp16", "clip_norm"})
        if unknown:
            raise UsageError(
                f"unknown config key(s) {', '.join(map(str, unknown))} beside a DeepSpeed fp16 "
                "block: use dtype, fp16, clip_norm"
            )
        if data.get("dtype", "float16") != "float16":
            raise UsageError(f"a config with an fp16 block is float16, got dtype {data['dtype']!r}")
        clip = data.get("clip_norm")
        return cls.from_fp16_block(data["fp16"], clip_norm=clip, name="the config's fp16")

    def knobs_changed(self, clip_norm: float | None = None) -> int:
        """How many knobs differ from DeepSpeed's defaults (and from the workload's own
        ``clip_norm``)."""
        block = self.fp16_block()
        return int(self.clip_norm != clip_norm) + sum(
            int(block[key] != value) for key, value in FP16_DEFAULTS.items()
        )

    def describe(self) -> str:
        """One short line, e.g. ``float16 DeepSpeed scale=2**16 window 1000 hysteresis 2
        min 1, no clip``."""
        clip = "no clip" if self.clip_norm is None else f"clip {self.clip_norm:.3g}"
        consecutive = " consecutive" if self.consecutive_hysteresis else ""
        return (
            f"float16 DeepSpeed scale=2**{self.initial_scale_power} window "
            f"{self.growth_interval} hysteresis {self.hysteresis}{consecutive} min "
            f"{self.min_loss_scale}, {clip}"
        )


def _as_deepspeed_reads(key: str, value: Any) -> Any:
    """A value of an ``fp16`` block as DeepSpeed's config (pydantic, in its lax mode) reads
    it: a whole-number float is its integer (DeepSpeed's own tests write ``min_loss_scale:
    2.0``), and ``consecutive_hysteresis`` takes 0 and 1 for false and true."""
    if key == "consecutive_hysteresis":
        return bool(value) if value in (0, 1) and not isinstance(value, float) else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: DeepSpeed's own fp16 defaults: what a user gets from ``"fp16": {"enabled": true}``.
DEEPSPEED_DEFAULT = DeepSpeedFp16Config()

#: The baselines a study of a DeepSpeed workload runs once, by name: DeepSpeed's defaults, and
#: the seed article's ``init_scale`` in DeepSpeed's terms (``initial_scale_power`` 12).
DEEPSPEED_BASELINES = {
    "deepspeed-default": DEEPSPEED_DEFAULT,
    "deepspeed-scale-4096": DeepSpeedFp16Config(init_scale=4096.0),
}


def baselines(deepspeed: bool) -> dict[str, AmpConfig]:
    """The float16 baselines of a study, by name: PyTorch's, or DeepSpeed's for a DeepSpeed
    workload; the framework's defaults first, the seed article's scale second."""
    return dict(DEEPSPEED_BASELINES if deepspeed else BASELINES)


#: The baseline of a space that searches float8: torchao's own defaults.
FLOAT8_BASELINES = {"torchao-default": TORCHAO_DEFAULT}

#: The baselines that are a framework's own defaults (PyTorch's GradScaler, DeepSpeed's fp16,
#: torchao's float8 training), in the order the summary prefers them.
DEFAULTS_BASELINES = ("pytorch-default", "deepspeed-default", "torchao-default")


def defaults_words(deepspeed: bool, *, name: str | None = None) -> str:
    """How the summary names the framework's defaults (those of baseline ``name``, where
    given)."""
    if name == "torchao-default":
        return "torchao's float8 defaults"
    return "DeepSpeed's defaults" if deepspeed else "PyTorch's defaults"
