"""AmpConfig: the settings one mixed-precision run uses, and nothing else."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from scalertune._amp._modules import _split
from scalertune._errors import UsageError
from scalertune._limits import FLOAT32_MAX
from scalertune._text import shown

#: What ``dtype`` may name. float32 means "no autocast, no scaler": the reference.
DTYPES = ("float16", "bfloat16", "float32")

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
    """

    dtype: str = "float16"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clip_norm: float | None = None
    fp32_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp32_modules", parse_islands(self.fp32_modules))
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if not all(isinstance(name, str) and name for name in self.fp32_modules):
            raise UsageError(f"fp32_modules must be module names, got {self.fp32_modules!r}")
        _check("init_scale", self.init_scale, "> 0 and finite", lambda v: v > 0)
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

    @property
    def uses_scaler(self) -> bool:
        """Whether a GradScaler is active (float16 only)."""
        return self.dtype == "float16"

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
        return {
            "dtype": self.dtype,
            **scaler,
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
            The count; the islands count as one knob.

        Example:
            >>> from scalertune import AmpConfig
            >>> AmpConfig(init_scale=4096.0, clip_norm=1.0).knobs_changed(clip_norm=1.0)
            1
        """
        changed = int(self.dtype != _DEFAULTS.dtype) + int(self.clip_norm != clip_norm)
        changed += sum(int(getattr(self, k) != getattr(_DEFAULTS, k)) for k in SCALER_KNOBS)
        return changed + int(bool(self.fp32_modules))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AmpConfig:
        """Build from a mapping (a YAML's ``config`` block), rejecting unknown keys by name.

        Args:
            data: The knobs by name, as :meth:`to_dict` writes them; missing ones take their
                defaults.

        Returns:
            The config.

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
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(
                f"unknown config key(s) {', '.join(unknown)}: use {', '.join(sorted(known))}"
            )
        try:
            return cls(**data)
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
        if not self.uses_scaler:
            return f"{self.dtype}, {clip}"
        return (
            f"float16 scale={self.init_scale:.4g} growth={self.growth_factor:.3g} "
            f"backoff={self.backoff_factor:.3g} every {self.growth_interval}, {clip}"
        )


SCALER_KNOBS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


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
