"""AmpConfig: the settings one mixed-precision run uses, and nothing else."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from typing import Any, Callable, Iterable, Mapping

from scalertune import _policy
from scalertune._errors import UsageError

#: What ``dtype`` may name. float32 means "no autocast, no scaler": the reference.
DTYPES = ("float16", "bfloat16", "float32")

#: GradScaler counts finite steps towards ``growth_interval`` in an int32 tensor.
MAX_GROWTH_INTERVAL = 2**31 - 1
#: The loss scale lives in a float32 tensor: a larger number would be inf there.
_FLOAT32_MAX = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True)
class AmpConfig:
    """The knobs of one AMP configuration, with PyTorch's defaults.

    ``dtype`` is the autocast dtype. Only float16 needs a loss scaler: its largest finite
    value is 65504 and its smallest subnormal is about 6e-8, so gradients are multiplied by
    ``scale`` before backward (keeping small ones from flushing to zero) and divided again
    before the optimizer sees them. bfloat16 has float32's exponent range and runs unscaled;
    float32 runs without autocast at all.

    The scaler starts at ``init_scale``. Each step whose gradients contain inf or NaN is
    skipped and multiplies the scale by ``backoff_factor``; after ``growth_interval``
    consecutive finite steps the scale is multiplied by ``growth_factor``. ``clip_norm``
    (``None`` for no clipping) bounds the global gradient norm *after* unscaling.

    ``fp32_modules`` names modules (as ``model.named_modules()`` does) that run with autocast
    off and their inputs cast to float32: *float32 islands*, for activations that exceed
    float16's range in the forward pass, where no loss scale can help. An entry may be a glob
    pattern over those names (``*.DenseReluDense.wo``: every T5 feed-forward output layer).

    Example:
        >>> from scalertune import AmpConfig
        >>> AmpConfig(dtype="float16", init_scale=4096.0).uses_scaler
        True
        >>> AmpConfig(dtype="bfloat16").uses_scaler
        False
    """

    dtype: str = "float16"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    clip_norm: float | None = None
    fp32_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        islands = self.fp32_modules
        if isinstance(islands, str):
            islands = _split(islands)
        elif not isinstance(islands, (list, tuple)) and islands is not None:
            raise UsageError(f"fp32_modules must be module names, got {islands!r}")
        object.__setattr__(self, "fp32_modules", tuple(islands or ()))
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if not all(isinstance(name, str) and name for name in self.fp32_modules):
            raise UsageError(f"fp32_modules must be module names, got {self.fp32_modules!r}")
        _check("init_scale", self.init_scale, "> 0 and finite", lambda v: v > 0)
        _check("growth_factor", self.growth_factor, "> 1 and finite", lambda v: v > 1)
        _check("backoff_factor", self.backoff_factor, "in (0, 1)", lambda v: 0 < v < 1)
        _check("growth_interval", self.growth_interval,
               f"an integer >= 1 (at most {MAX_GROWTH_INTERVAL})",
               lambda v: v % 1 == 0 and 1 <= v <= MAX_GROWTH_INTERVAL)
        object.__setattr__(self, "growth_interval", int(self.growth_interval))
        if self.clip_norm is not None:
            _check("clip_norm", self.clip_norm, "> 0 and finite, or null", lambda v: v > 0)
        if not self.uses_scaler:
            # Without a scaler the four knobs mean nothing; normalised, two configs that train
            # alike compare equal (a study never trains the same config twice).
            for knob in _SCALER_KNOBS:
                object.__setattr__(self, knob, getattr(_DEFAULTS, knob))

    @property
    def uses_scaler(self) -> bool:
        """Whether a GradScaler is active (float16 only)."""
        return self.dtype == "float16"

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, in a stable key order: what the YAML file and Optuna store.

        Only the knobs the config uses: the scaler's four for float16 alone.
        """
        scaler = {
            "init_scale": float(self.init_scale),
            "growth_factor": float(self.growth_factor),
            "backoff_factor": float(self.backoff_factor),
            "growth_interval": int(self.growth_interval),
        } if self.uses_scaler else {}
        islands = {"fp32_modules": list(self.fp32_modules)} if self.fp32_modules else {}
        return {
            "dtype": self.dtype,
            **scaler,
            "clip_norm": None if self.clip_norm is None else float(self.clip_norm),
            **islands,
        }

    def with_clip(self, clip_norm: float | None) -> "AmpConfig":
        """This config, clipping at ``clip_norm`` where it does not clip itself: the
        workload's own clipping applies to every run that does not choose another."""
        if self.clip_norm is not None or clip_norm is None:
            return self
        return dataclasses.replace(self, clip_norm=float(clip_norm))

    def knobs_changed(self, clip_norm: float | None = None) -> int:
        """How many knobs differ from PyTorch's defaults (and from the workload's own
        ``clip_norm``): among configs equally fast and stable, fewer is simpler."""
        changed = int(self.dtype != _DEFAULTS.dtype) + int(self.clip_norm != clip_norm)
        changed += sum(getattr(self, k) != getattr(_DEFAULTS, k) for k in _SCALER_KNOBS)
        return changed + int(bool(self.fp32_modules))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AmpConfig":
        """Build from a mapping, rejecting unknown keys by name."""
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
        """One short line, e.g. ``float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip``."""
        clip = "no clip" if self.clip_norm is None else f"clip {self.clip_norm:.3g}"
        if self.fp32_modules:
            clip += f", float32: {','.join(self.fp32_modules)}"
        if not self.uses_scaler:
            return f"{self.dtype}, {clip}"
        return (
            f"float16 scale={self.init_scale:.4g} growth={self.growth_factor:.3g} "
            f"backoff={self.backoff_factor:.3g} every {self.growth_interval}, {clip}"
        )


@dataclasses.dataclass(frozen=True)
class Guard:
    """Stop training when the loss scale collapses, instead of training on silently.

    What DeepSpeed's ``raise_error_at_min_scale`` and fairseq's minimum-scale error do: every
    ``check_every`` steps (one host read of two numbers) the runtime checks that the scale is
    at least ``min_scale`` and that fewer than ``max_consecutive_skips`` steps in a row were
    skipped, and raises :class:`AmpGuardError` otherwise. The YAML a search writes carries
    defaults taken from the search's evidence.
    """

    min_scale: float = _policy.SCALE_FLOOR
    max_consecutive_skips: int = _policy.MAX_CONSECUTIVE_SKIPS
    check_every: int = _policy.READBACK_INTERVAL

    def __post_init__(self) -> None:
        # A floor of 0 (or below, or NaN) never trips, and a limit of 0 skips trips at once:
        # either would make the guard a lie.
        scale = self.min_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
                0 < scale <= _FLOAT32_MAX):
            raise UsageError(f"the guard's min_scale must be a finite number > 0, got "
                             f"{shown(scale)}")
        for name in ("max_consecutive_skips", "check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"the guard's {name} must be an integer >= 1, got "
                                 f"{shown(value)}")


_SCALER_KNOBS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _check(name: str, value: Any, wanted: str, ok: Callable[[float], bool]) -> None:
    """``value`` must be a real number (not a bool, not a string), finite in float32, where
    the scaler keeps it, and ``ok``."""
    # abs() <= a finite bound is False for NaN and inf, and exact for ints of any size.
    number = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and abs(value) <= _FLOAT32_MAX)
    if not (number and ok(value)):
        raise UsageError(f"{name} must be {wanted}, got {shown(value)}")


def check_search_numbers(*, n_trials: Any, steps: Any, seed: Any) -> None:
    """A search's counts, as :func:`scalertune.search` takes them; :class:`UsageError` names
    the first that is out of range."""
    for name, value, low, high in (
            ("n_trials", n_trials, 0, None),
            ("steps", steps, 2 * _policy.READBACK_INTERVAL, _policy.MAX_STEPS),
            ("seed", seed, 0, _policy.MAX_SEED)):
        integer = isinstance(value, int) and not isinstance(value, bool)
        if not integer or value < low or (high is not None and value > high):
            flag = "--" + name.replace("_", "-")
            upper = "" if high is None else f" and <= {high}"
            raise UsageError(f"expected an integer {flag} >= {low}{upper}, got {shown(value)}")


def shown(value: Any) -> str:
    """``repr(value)``, cut short: a bad value in a one-line error, not a page of digits."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _split(names: str) -> tuple[str, ...]:
    """``"attn.score, ffn"`` -> ``("attn.score", "ffn")``; ``""`` or ``"none"`` -> ``()``."""
    if names.strip().lower() in ("", "none"):
        return ()
    return tuple(n.strip() for n in names.split(",") if n.strip())


def is_pattern(entry: str) -> bool:
    """Whether an ``fp32_modules`` entry is a glob pattern rather than one module's name."""
    return any(c in entry for c in "*?[")


def match_modules(entries: Iterable[str], names: Iterable[str]) -> list[str]:
    """The module names (of ``names``, in their order) that ``entries`` select.

    Each entry is a name from ``model.named_modules()`` or a glob pattern over those names
    (``fnmatch`` rules, where ``*`` also crosses dots). The model itself (the empty name) is
    never selected: keeping all of it in float32 is not mixed precision. An entry that selects
    nothing is a :class:`UsageError` naming the closest names, so a typo never silently trains
    without the island it meant.
    """
    names = [n for n in names if n]
    chosen: set[str] = set()
    for entry in entries:
        hits = ([n for n in names if fnmatch.fnmatchcase(n, entry)] if is_pattern(entry)
                else [entry] if entry in names else [])
        if not hits:
            raise UsageError(_no_match(entry, names))
        chosen.update(hits)
    return [n for n in names if n in chosen]


def _no_match(entry: str, names: list[str]) -> str:
    if is_pattern(entry):
        # Close patterns are suggested from the names' dotted tails (*.DenseReluDense.wo).
        tails = sorted({"*." + ".".join(n.split(".")[i:]) for n in names
                        for i in range(1, n.count(".") + 1)})
        close = difflib.get_close_matches(entry, tails + names, n=3, cutoff=0.75)
        what = f"fp32_modules pattern {entry!r} matches no module of the model"
    else:
        close = difflib.get_close_matches(entry, names, n=3, cutoff=0.75)
        what = f"fp32_modules names {entry!r}, which the model does not have"
    hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
            else f"use names from model.named_modules(), e.g. "
                 f"{', '.join(repr(n) for n in names[:3])}")
    return f"{what}: {hint}"


#: PyTorch's own defaults: what a user gets from a bare ``GradScaler()``.
PYTORCH_DEFAULT = _DEFAULTS = AmpConfig()

#: The fix the seed article found by hand: the default with ``init_scale=4096``.
SEED_ARTICLE_FIX = AmpConfig(init_scale=4096.0)

#: The baselines every study runs once, by name.
BASELINES = {"pytorch-default": PYTORCH_DEFAULT, "init-scale-4096": SEED_ARTICLE_FIX}

FLOAT32 = AmpConfig(dtype="float32")
