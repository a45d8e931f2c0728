"""The horizon's picture: each finalist's loss over float32's at the same step, from step 0 to
the horizon.

A horizon longer than a trial is covered in stretches: the short trial (steps 0 to ``steps``,
from the initial weights) and, for each phase window, a branch from the float32 reference's
checkpoint at its first step (:mod:`scalertune._judge._phases`). Each stretch is drawn as
the run's smoothed loss over float32's smoothed loss at the same step: float32's first
``steps`` per-step losses for the short trial, its own continuation over the window for a
branch, so 1.0 is float32 wherever the run is. Between the stretches nothing was trained and
nothing is drawn. The window's last half, which the phase verdict judges, carries the judged
ratio as a thick segment; above ``1 + PHASE_TOLERANCE`` a branch falls behind (when the
excess is also beyond the noise).

The file is ``STEM.horizon.png`` beside the YAML, uploaded as a study artifact like the other
pictures and shown in the study note.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from optuna.trial import TrialState

from scalertune import _policy
from scalertune._errors import DamagedEvidence, UsageError
from scalertune._judge._findings import Findings
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult, judged_end
from scalertune._judge._target import smoothed
from scalertune._review._describe import unjudged
from scalertune._review._plots import DPI, FIGURE_INCHES, have_matplotlib, save_figure, wrap
from scalertune._storage._names import LOSSES_ATTR, ROLE_PHASE
from scalertune._storage._trial_record import Job, role_of

_SUFFIX = ".horizon.png"


def horizon_picture_path(stem: str) -> str:
    """Where the horizon's picture goes beside ``stem``.yaml."""
    return stem + _SUFFIX


def is_horizon_picture(filename: str) -> bool:
    return filename.endswith(_SUFFIX)


@dataclasses.dataclass(frozen=True)
class Stretch:
    """Part of a run over the horizon: its smoothed loss over float32's, step by step from
    ``start``; ``phase``, for a branch, is how the verdict judged it."""

    start: int
    ratios: list[float]
    phase: PhaseResult | None = None


def branched_runs(result: Findings) -> list[Outcome]:
    """The runs of the horizon's evidence, as the summary lists them: the finalists, the
    islands, float32 at the best AMP config's clip, then any other run that was branched (a
    finalist before later trials of the study changed the finalists)."""
    runs = [
        *result.finalists,
        *result.islands,
        *([result.float32_clip] if result.float32_clip else []),
    ]
    return runs + [o for o in result.ranking if o.number in result.phases and o not in runs]


def stretches(
    result: Findings, run: Outcome, branches: dict[tuple[int, int], list[float]]
) -> list[Stretch]:
    """``run``'s short trial and each branch of it that finished, as ratios to float32
    (``branches``: (run number, window start) -> the branch's per-step losses)."""
    ref = result.reference
    windows = {} if ref is None else ref.windows
    judged = {p.start: p for p in result.phases.get(run.number, [])}
    out = [Stretch(0, _ratio(run.losses, () if ref is None else ref.losses))]
    for start, _ in result.windows:
        losses = branches.get((run.number, start))
        if losses is not None and start in windows:
            out.append(Stretch(start, _ratio(losses, windows[start]), judged.get(start)))
    return out


def branch_losses(result: Findings) -> dict[tuple[int, int], list[float]]:
    """(run number, window start) -> the per-step losses of its finished branch (the last
    one, where a branch was retried)."""
    found: dict[tuple[int, int], list[float]] = {}
    study = result.study
    for trial in (
        []
        if study is None
        else study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    ):
        if (
            role_of(trial) != ROLE_PHASE
            or LOSSES_ATTR not in trial.system_attrs
            or trial.number in result.damaged
        ):
            continue
        try:
            job = Job.of_trial(trial)
        except DamagedEvidence:  # damaged where the judgement does not look: left out too
            continue
        if job.of is None:
            continue
        losses = list(trial.system_attrs[LOSSES_ATTR])
        if job.from_start:  # a run from step 0: its stretch over each window it reached
            for start, end in result.windows:
                if len(losses) >= judged_end(start, end):
                    found[job.of, start] = losses[start:end]
        elif job.start is not None:
            found[job.of, job.start] = losses
    return found


def _ratio(losses: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Smoothed loss over float32's smoothed loss at the same step (NaN where either is not
    finite or float32's is not positive)."""
    ours, theirs = smoothed(losses), smoothed(reference)
    return [
        a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan
        for a, b in zip(ours, theirs)
    ]


def horizon_picture(result: Findings, path: str) -> None:
    """Write the horizon's PNG (see the module's docstring)."""
    save_figure(horizon_figure(result), path)


def write_horizon_picture(result: Findings, stem: str) -> dict[int, str]:
    """``STEM.horizon.png`` when the horizon is longer than a trial and matplotlib is
    installed, as ``{the float32 reference's trial: path}`` (the run every stretch is drawn
    against), the form of :func:`~scalertune._review._pictures.write_pictures`; else ``{}``."""
    ref = result.reference
    if not result.long or not have_matplotlib() or not ref or not ref.horizon:
        return {}
    path = horizon_picture_path(stem)
    horizon_picture(result, path)
    return {ref.trial: path}


def horizon_figure(result: Findings) -> Any:
    """The matplotlib figure :func:`horizon_picture` saves (close it with ``plt.close``)."""
    if not have_matplotlib():
        raise UsageError("plots need matplotlib: pip install 'scalertune[dashboard]'")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=FIGURE_INCHES, dpi=DPI, layout="constrained")
    ax = fig.subplots(1, 1)
    steps = result.settings.steps
    fig.suptitle(
        wrap(f"Loss over float32's at the same step, across the horizon of {result.horizon} steps"),
        fontsize=12,
        fontweight="bold",
    )
    starts = ", ".join(str(a) for a, _ in result.windows)
    ax.set_title(
        wrap(
            f"each finalist's trial from step 0 (to {steps}) and its branches from "
            f"float32's checkpoints at steps {starts}; thick: the window's last "
            "half, which the phase verdict judges"
        ),
        fontsize=10,
    )
    _shade_windows(ax, result.windows)
    branches = branch_losses(result)
    runs = branched_runs(result)
    drawn = [stretches(result, run, branches) for run in runs]
    ratios = [v for parts in drawn for s in parts for v in s.ratios if math.isfinite(v)]
    for color, (run, parts) in enumerate(zip(runs, drawn)):
        _draw_run(ax, result, run, parts, f"C{color % 10}")
    ax.axhline(1.0, color="black", ls="--", lw=1, label="float32 (1.0)")
    ax.axhline(
        1 + _policy.PHASE_TOLERANCE,
        color="tab:red",
        ls=":",
        lw=1.5,
        label=f"phase tolerance ({1 + _policy.PHASE_TOLERANCE:g}x: above it, falls behind)",
    )
    ax.set_xlim(0, result.horizon)
    if ratios and min(ratios) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss / float32's at the same step (1.0 = float32)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=1)
    ax.grid(alpha=0.3)
    return fig


def _shade_windows(ax: Any, windows: Sequence[tuple[int, int]]) -> None:
    # x in steps, y in the axes' height: the labels stay at the foot, below the curves of
    # runs that fall behind (they hold at 1.0 or climb)
    where = ax.get_xaxis_transform()
    for start, end in windows:
        ax.axvspan(start, end, color="0.92", zorder=0)
        ax.text(
            (start + end) / 2,
            0.02,
            f"window\n{start}-{end}",
            transform=where,
            ha="center",
            va="bottom",
            fontsize=8,
            color="0.35",
        )


def _draw_run(ax: Any, result: Findings, run: Outcome, parts: list[Stretch], color: str) -> None:
    verdict = {True: "holds", False: "does not hold", None: unjudged(result)}[result.holds(run)]
    # the judged figures go in the legend: written beside the windows they overlap the curves
    judged = ", ".join(p.phase.describe() for p in parts if p.phase is not None)
    label = f"{run.label} [{run.config.describe()}]: {judged + ': ' if judged else ''}{verdict}"
    for stretch in parts:
        xs = range(stretch.start, stretch.start + len(stretch.ratios))
        if any(math.isfinite(v) for v in stretch.ratios):
            ax.plot(xs, stretch.ratios, color=color, lw=1.2, label=label)
            label = "_"  # one legend entry per run, however many stretches it has
        phase = stretch.phase
        if phase is None:
            continue
        if phase.nonfinite:
            ax.scatter([phase.start], [1.0], marker="x", s=60, color=color, label="_")
            continue
        half = phase.start + (phase.end - phase.start) // 2
        ax.plot(
            [half, phase.end],
            [phase.ratio, phase.ratio],
            color=color,
            lw=4,
            alpha=0.6,
            solid_capstyle="butt",
            label="_",
        )
