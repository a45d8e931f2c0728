"""Pictures of a run: its loss relative to the float32 target, and its loss scale, per step.

The loss is drawn as a multiple of the float32 target (the reference's final smoothed loss
plus the tolerance), on a log axis: 1.0 is the target whatever the loss's magnitude, as 0 is
in the dashboard's intermediate values (log10 of the same ratio), so a picture and the curves
tell one story.

The PNGs are 4:3, the shape of optuna-dashboard's artifact preview (a 200 x 150 box that
keeps the aspect), and wide enough (``FIGURE_INCHES`` x ``DPI``) to be read at full size where
the notes embed them. matplotlib is optional (``pip install 'scalertune[dashboard]'``): it is
heavy, and a search on a training node does not need it.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from scalertune._amp._schema import create_temporary
from scalertune._errors import UsageError
from scalertune._judge._findings import Findings
from scalertune._judge._outcome import Outcome
from scalertune._judge._target import smoothed
from scalertune._review._describe import describe_outcome

#: 4:3 like the dashboard's preview box; 1080 x 810 pixels, which a note shows unscaled on a
#: laptop screen and a browser scales down, still legible, on a narrower one.
FIGURE_INCHES = (9.0, 6.75)
DPI = 120
#: Title lines are wrapped here, so that a long prune reason is shown whole.
_TITLE_CHARS = 100

_PICTURE = re.compile(r"\.trial-(\d+)\.png$")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def picture_path(stem: str, name: str, number: int) -> str:
    """Where the picture of trial ``number`` (shown as ``name``) goes beside ``stem``.yaml."""
    return f"{stem}.{name}.trial-{number}.png"


def picture_trial(filename: str) -> int | None:
    """The trial number a picture written by :func:`picture_path` shows, or ``None``."""
    match = _PICTURE.search(filename)
    return int(match.group(1)) if match else None


def named_run(result: Findings, name: str) -> Outcome:
    """The run called ``name``: ``recommended`` (the answer, or the best AMP config where
    float32 is the answer), a baseline's name, or ``#N``; ``KeyError`` when there is none."""
    if name == "recommended":
        chosen = result.recommended or result.best_amp
        if chosen is None:
            raise KeyError("no AMP config held")
        return chosen
    if name.startswith("#"):
        found = next((o for o in result.ranking if o.number == int(name[1:])), None)
        if found is None:
            raise KeyError(f"no finished run {name}")
        return found
    return result.baselines[name]


def plot(result: Findings, path: str, *, run: str = "recommended") -> None:
    """Write a PNG of the run called ``run`` (see :func:`named_run`) at ``path``."""
    plot_run(result, named_run(result, run), path)


def plot_run(result: Findings, outcome: Outcome, path: str) -> None:
    """Write a PNG of ``outcome``: its loss over the float32 target, and for float16 its loss
    scale with the skipped steps marked."""
    save_figure(run_figure(result, outcome), path)


def save_figure(fig: Any, path: str) -> None:
    """Write ``fig`` as a PNG at ``path``, whole or not at all (a picture written before is
    kept when this one cannot be: a full disk, a read-only folder), and close it. A failed
    write raises ``OSError`` naming ``path``."""
    import matplotlib.pyplot as plt

    tmp = None
    try:
        fd, tmp = create_temporary(path)
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, dpi=DPI, format="png")
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), path) from None
    finally:
        plt.close(fig)
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def run_figure(result: Findings, outcome: Outcome) -> Any:
    """The matplotlib figure :func:`plot_run` saves (close it with ``plt.close``)."""
    if not have_matplotlib():
        raise UsageError("plots need matplotlib: pip install 'scalertune[dashboard]'")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scales = list(outcome.scales) if outcome.config.uses_scaler else []
    fig = plt.figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    if scales:
        top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    else:
        top, bottom = fig.subplots(1, 1), None
    outcome_line = describe_outcome(outcome)
    if not outcome.config.uses_scaler:
        outcome_line += f"; no loss scaler ({outcome.config.dtype} needs none)"
    fig.suptitle(
        wrap(f"{outcome.label}: {outcome.config.describe()}"), fontsize=12, fontweight="bold"
    )
    top.set_title(wrap(outcome_line), fontsize=10)

    _plot_loss(top, result, outcome)
    if bottom is not None:
        _plot_scale(bottom, outcome, scales)
    (bottom or top).set_xlabel("step")
    return fig


def _plot_loss(ax: Any, result: Findings, outcome: Outcome) -> None:
    target = result.target
    losses = list(outcome.losses)
    reference = list(result.reference.losses) if result.reference else []
    relative = (
        target is not None
        and target.loss > 0
        and all(_all_positive(c) for c in (losses, reference) if _finite(c))
    )
    unit = target.loss if target is not None and relative else 1.0

    def draw(curve: Sequence[float], color: str, name: str, faint: str) -> None:
        if not _finite(curve):
            return  # a line with no finite point would be a legend entry for nothing
        steps = range(len(curve))
        ax.plot(steps, [v / unit for v in curve], color=faint, lw=0.8, label=f"{name} (per step)")
        ax.plot(
            steps,
            [v / unit for v in smoothed(curve)],
            color=color,
            lw=2,
            label=f"{name} (smoothed)",
        )

    draw(reference, "0.3", "float32 reference", "0.8")
    draw(losses, "tab:blue", outcome.config.dtype, "#a6c8e8")
    if target is not None:
        ax.axhline(
            1.0 if relative else target.loss,
            color="black",
            ls="--",
            lw=1,
            label="float32 target" + (" (1.0)" if relative else ""),
        )
    _mark_events(ax, outcome, losses)
    if relative:
        ax.set_yscale("log")
        ax.set_ylabel("loss / float32 target (1.0 = target)")
    else:
        ax.set_ylabel("loss")
    ax.legend(fontsize=9, loc="best")
    ax.grid(alpha=0.3)


def _mark_events(ax: Any, outcome: Outcome, losses: list[float]) -> None:
    """Where the run reached the target, first went non-finite, or was pruned."""
    reached = outcome.steps_to_target
    if outcome.reached and reached:
        ax.axvline(
            reached - 1,
            color="tab:green",
            ls=":",
            lw=1.5,
            label=f"reached the target (step {reached})",
        )
    bad_loss = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if bad_loss is not None:
        # Skipped steps (non-finite gradients) are marked on the scale panel; this is the
        # loss itself, after which the run has no curve.
        ax.axvline(
            bad_loss,
            color="tab:red",
            ls="-",
            lw=1.5,
            alpha=0.8,
            label=f"first non-finite loss (step {bad_loss})",
        )
    if outcome.state == "pruned" and losses:
        ax.axvline(
            len(losses) - 1,
            color="tab:purple",
            ls="--",
            lw=1.2,
            label=f"pruned after {len(losses)} steps ({outcome.prune_kind})",
        )


def _plot_scale(ax: Any, outcome: Outcome, scales: list[float]) -> None:
    ax.step(
        range(len(scales)), scales, where="post", color="tab:orange", lw=1.5, label="loss scale"
    )
    previous = [outcome.config.init_scale, *scales[:-1]]
    skipped = [i for i, (a, b) in enumerate(zip(previous, scales)) if b < a]
    if skipped:
        ax.scatter(
            skipped,
            [scales[i] for i in skipped],
            color="tab:red",
            s=14,
            zorder=3,
            label=f"skipped step ({len(skipped)})",
        )
    ax.set_yscale("log", base=2)
    ax.set_ylabel("loss scale")
    ax.legend(fontsize=9, loc="best")
    ax.grid(alpha=0.3)


def wrap(text: str) -> str:
    """``text`` in lines of at most ``_TITLE_CHARS``, for a title shown whole."""
    return "\n".join(textwrap.wrap(text, _TITLE_CHARS))


def _finite(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) for v in values)


def _all_positive(values: Sequence[float]) -> bool:
    return min(v for v in values if math.isfinite(v)) > 0
