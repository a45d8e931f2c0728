"""What a diagnosis says: per-module figures, the real GradScaler checks, the verdict."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._modules import match_modules
from scalertune._diagnose._patterns import group_patterns
from scalertune._workload._loader import default_study_name


@dataclasses.dataclass
class TensorStats:
    """What one module produced (or received as a gradient), over calls and steps.

    ``absmax`` is the largest finite magnitude, ``nonfinite`` the inf/NaN values, ``over``
    the finite values above float16's largest (65504: possible only outside float16), of
    ``total`` values.

    Example:
        >>> import torch
        >>> from scalertune import TensorStats
        >>> stats = TensorStats()
        >>> stats.add(torch.tensor([1.0, float("inf"), 7e4]))
        >>> stats
        TensorStats(absmax=70000.0, total=3, nonfinite=1, over=1)
    """

    absmax: float = 0.0
    total: int = 0
    nonfinite: int = 0
    over: int = 0  # finite but above float16's max (only possible outside float16)

    def add(self, t: torch.Tensor) -> None:
        """Count one tensor's values in.

        Args:
            t: A module's output or gradient, of any dtype.

        Example:
            >>> import torch
            >>> from scalertune import TensorStats
            >>> stats = TensorStats()
            >>> stats.add(torch.ones(4))
            >>> stats.total, stats.absmax
            (4, 1.0)
        """
        a = t.detach().float().abs()
        finite = torch.isfinite(a)
        self.total += a.numel()
        self.nonfinite += int((~finite).sum())
        fa = a[finite]
        if fa.numel():
            self.absmax = max(self.absmax, float(fa.max()))
            self.over += int((fa > _policy.FLOAT16_MAX).sum())

    def share(self, count: int) -> float:
        """``count`` as a share of the values seen.

        Args:
            count: One of the counts (``nonfinite``, ``over``).

        Returns:
            The share, 0.0 when nothing was seen.

        Example:
            >>> from scalertune import TensorStats
            >>> TensorStats(total=4, nonfinite=1).share(1)
            0.25
        """
        return count / self.total if self.total else 0.0


@dataclasses.dataclass
class ModuleReport:
    """One module's row of the table: what it did in each dtype.

    ``forward`` is its output; ``backward`` the gradient flowing into that output; ``params``
    its own parameters' gradients (float16: scaled, as the backward left them, before
    ``unscale_``). Each is keyed by dtype. ``flushed`` is the share of its parameters' nonzero
    float32 gradient values that are zero in float16 at the scale judged.

    Example:
        >>> d = scalertune.diagnose("examples/attention.py:make_model")  # doctest: +SKIP
        >>> row = next(m for m in d.modules if m.name == "attn.score")  # doctest: +SKIP
        >>> row.forward["float16"].nonfinite > 0  # doctest: +SKIP
        True
    """

    name: str
    kind: str
    forward: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    backward: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    params: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    flushed: float | None = None


@dataclasses.dataclass(frozen=True)
class ScalerCheck:
    """One run of real GradScaler steps that a claim of the diagnosis rests on.

    Example:
        >>> from scalertune import AmpConfig, ScalerCheck
        >>> check = ScalerCheck(AmpConfig(init_scale=4096.0), steps=3, skipped=0,
        ...                     bad_loss_steps=0, outputs_finite=True, flushed=0.0)
        >>> check.forward_finite
        True
    """

    config: AmpConfig
    steps: int
    skipped: int
    #: steps whose loss was inf/NaN
    bad_loss_steps: int
    #: whether every module's output was finite (``None``: hooks did not look)
    outputs_finite: bool | None
    #: share of float32's nonzero first-step gradient values that were zero here
    flushed: float | None
    #: the config's islands as patterns, for reading
    islands: tuple[str, ...] = ()

    @property
    def forward_finite(self) -> bool:
        """Whether the forward stayed finite: every module's output, and the loss."""
        return self.outputs_finite is not False and not self.bad_loss_steps

    def describe(self) -> str:
        """The check in one line, as the diagnosis prints it.

        Returns:
            The config, the steps skipped, whether the forward and the loss stayed finite, and
            the share of gradient values flushed to zero.

        Example:
            >>> from scalertune import AmpConfig, ScalerCheck
            >>> ScalerCheck(AmpConfig(init_scale=4096.0), steps=3, skipped=0, bad_loss_steps=0,
            ...             outputs_finite=True, flushed=0.0).describe()  # doctest: +ELLIPSIS
            "float16 at init_scale 4096: skipped 0 of 3 steps, every module's output finite, ..."
        """
        islands = f" with {','.join(self.islands)} in float32" if self.islands else ""
        parts = [f"skipped {self.skipped} of {self.steps} steps"]
        if self.outputs_finite is not None:
            parts.append(
                "every module's output finite"
                if self.outputs_finite
                else "a module's output inf/NaN"
            )
        if self.bad_loss_steps:
            parts.append(f"the loss inf/NaN on {self.bad_loss_steps} steps")
        elif self.outputs_finite is None:
            parts.append("the loss finite")
        if self.flushed is not None:
            parts.append(f"{_share(self.flushed)} of gradient values flushed to zero")
        return f"float16 at init_scale {self.config.init_scale:g}{islands}: {', '.join(parts)}"


@dataclasses.dataclass
class Diagnosis:
    """The per-module evidence, the runs that checked it, and the verdict of ``diagnose``.

    ``kind`` is ``forward`` (an activation overflows float16 before any scale applies; the
    fix is ``islands`` in float32, or bfloat16), ``loss`` (the loss itself overflows while
    every module's output is finite), ``gradient-overflow`` (GradScaler skips steps at
    ``init_scale``; ``suggested_init_scale`` is one it was checked not to skip at),
    ``underflow`` (too many gradient values flush to zero; ``suggested_init_scale`` keeps
    them), ``clean``, or ``float32`` (float32 itself goes non-finite: nothing for AMP to fix).
    ``checks`` are the real GradScaler runs behind the verdict.

    Example:
        >>> import scalertune
        >>> d = scalertune.diagnose("examples/attention.py:make_model")  # doctest: +SKIP
        >>> d.kind, d.culprits, d.islands  # doctest: +SKIP
        ('forward', ['attn.score'], ['attn.score'])
    """

    modules: list[ModuleReport]
    init_scale: float
    steps: int
    kind: str
    verdict: str
    culprits: list[str]
    islands: list[str]
    skipped: int
    overflowing_gradients: list[str]
    underflow_share: float | None
    suggested_init_scale: float | None
    bfloat16_finite: bool
    checks: list[ScalerCheck]
    first_forward_nonfinite: str | None
    first_backward_nonfinite: str | None
    grad_absmax: float

    def table(self) -> str:
        """Module by module, in execution order: the forward and gradient figures of each run.

        Returns:
            The table, one line per module.

        Example:
            >>> print(d.table())  # doctest: +SKIP
        """
        s = f"@{self.init_scale:g}"
        rows = [
            (
                "module",
                "type",
                "fp16 max",
                "fp16 inf/nan",
                "bf16 max",
                "bf16 >65504",
                "grad max fp32",
                f"grad inf/nan {s}",
                "param grad max fp32",
                f"param inf/nan {s}",
                f"param flushed {s}",
            )
        ]
        for m in self.modules:
            f16, b16 = m.forward.get("float16"), m.forward.get("bfloat16")
            rows.append(
                (
                    m.name or "(model)",
                    m.kind,
                    _max(f16),
                    _pct(f16, "nonfinite"),
                    _max(b16),
                    _pct(b16, "over"),
                    _max(m.backward.get("float32")),
                    _pct(m.backward.get("float16"), "nonfinite"),
                    _max(m.params.get("float32")),
                    _pct(m.params.get("float16"), "nonfinite"),
                    _share(m.flushed),
                )
            )
        from scalertune._text import format_table

        return "\n".join(format_table(rows))

    def summary(self) -> str:
        """The table, where things first went non-finite, the checks, and the verdict.

        Returns:
            What ``scalertune diagnose`` prints.

        Example:
            >>> print(d.summary())  # doctest: +SKIP
        """
        lines = [self.table(), ""]
        if self.first_forward_nonfinite is not None:
            lines.append(
                f"first non-finite forward output: {self.first_forward_nonfinite or '(model)'}"
            )
        if self.culprits:
            lines.append(
                "turned finite inputs into inf/NaN: "
                + ", ".join(c or "(model's own code)" for c in self.culprits)
            )
        if self.first_backward_nonfinite is not None:
            lines.append(f"first non-finite gradient: {self.first_backward_nonfinite or '(model)'}")
        lines.append(f"checked with real GradScaler steps ({self.steps} per run, same seed):")
        lines += [f"  {c.describe()}" for c in self.checks]
        lines.append(f"Verdict: {self.verdict}")
        return "\n".join(lines)

    def next_command(self, factory: str) -> str | None:
        """The search to run next: with the islands, or at all when something is wrong.

        Args:
            factory: The factory spec to put in the command.

        Returns:
            A ``scalertune search`` command line, or ``None`` when the diagnosis is ``clean`` or
            float32 itself fails.

        Example:
            >>> d.next_command("model.py:make_model").split(" --study-name ")  # doctest: +SKIP
            ['scalertune search model.py:make_model --fp32-modules attn.score',
             'model:make_model+fp32']
        """
        if self.islands:
            # a study of its own: one of the same factory without the islands may exist, and
            # a study refuses another space
            name = shlex.quote(default_study_name(factory) + "+fp32")
            return (
                f"scalertune search {factory} --fp32-modules {shlex.quote(','.join(self.islands))}"
                f" --study-name {name}"
            )
        if self.kind not in ("clean", "float32"):
            return f"scalertune search {factory}"
        return None


@dataclasses.dataclass(frozen=True)
class IslandAdvice:
    """Where a forward overflow comes from, and the float32 islands that were checked to fix
    it: ``culprits`` turned finite inputs into inf/NaN (``where`` says so in one line, grouped
    into glob patterns); ``islands`` (the config's own and the culprits, grouped) is what to
    keep in float32; ``fixed`` says whether the forward was finite with them."""

    culprits: list[str]
    where: str
    islands: list[str]
    fixed: bool


def _list(names: Sequence[str]) -> str:
    shown = [repr(n) if n else "the model's own code" for n in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _share(v: float | None) -> str:
    """A share as a percentage; ``-`` where it was not measured."""
    if v is None:
        return "-"
    return "0%" if v == 0 else f"{v:.1%}"


def _max(stats: TensorStats | None) -> str:
    if stats is None:
        return "-"
    if stats.total and stats.nonfinite == stats.total:
        return "inf/nan"
    return f"{stats.absmax:.3g}"


def _pct(stats: TensorStats | None, field: str) -> str:
    return (
        "-"
        if stats is None
        else ("0" if not getattr(stats, field) else f"{stats.share(getattr(stats, field)):.1%}")
    )


class _Run:
    """What one run of a config did: GradScaler's skips, and what its hooks saw."""

    def __init__(self, config: AmpConfig, steps: int, names: list[str]) -> None:
        self.config, self.steps, self.names = config, steps, names
        self.skipped = 0
        self.bad_loss_steps = 0
        self.repaired = 0
        self.culprits: list[str] = []
        self.watched = False  # hooks looked at every module's output
        self.forward_overflow = False
        self.grads_nonfinite = False
        self.first_forward: str | None = None
        self.first_backward: str | None = None
        #: each parameter's gradient values on the first step (a bounded, strided sample)
        self.first_grads: dict[str, torch.Tensor] = {}
        self.first_grads_finite = True
        #: what went non-finite first, in words ("its loss", "the output of 'attn'", ...)
        self.first_bad: str | None = None
        #: share of float32's nonzero first-step gradient values that are zero here (float16
        #: runs whose first step was finite)
        self.flushed: float | None = None

    @property
    def finite(self) -> bool:
        """Nothing overflowed: no module output, no loss, no parameter gradient."""
        return not (self.forward_overflow or self.bad_loss_steps or self.grads_nonfinite)

    def check(self) -> ScalerCheck:
        islands = group_patterns(match_modules(self.config.fp32_modules, self.names), self.names)
        return ScalerCheck(
            self.config,
            self.steps,
            self.skipped,
            self.bad_loss_steps,
            not self.forward_overflow if self.watched else None,
            self.flushed,
            tuple(islands),
        )
