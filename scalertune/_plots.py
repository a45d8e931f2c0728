"""Pictures of a run: loss vs step over the float32 reference, and the loss scale vs step.

matplotlib is optional (``pip install 'scalertune[dashboard]'``): it is heavy, and a search
on a training node does not need it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from scalertune._errors import UsageError
from scalertune._judge import smoothed

if TYPE_CHECKING:
    from scalertune._rank import Outcome
    from scalertune._result import SearchResult


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_run(result: "SearchResult", outcome: "Outcome", path: str) -> None:
    """Write a two-panel PNG for ``outcome``: loss (with float32's) and loss scale per step."""
    if not have_matplotlib():
        raise UsageError("plots need matplotlib: pip install 'scalertune[dashboard]'")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scalertune._result import describe_outcome

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    fig.suptitle(f"{outcome.label}: {outcome.config.describe()}\n{describe_outcome(outcome)}",
                 fontsize=9)
    if result.reference:
        ref = result.reference["losses"]
        top.plot(range(len(ref)), ref, color="0.75", lw=1, label="float32 (per step)")
        top.plot(range(len(ref)), smoothed(ref), color="0.35", lw=1.5, label="float32 (smoothed)")
        top.axhline(result.reference["target_loss"], color="0.35", ls="--", lw=1, label="target")
    losses = list(outcome.losses)
    top.plot(range(len(losses)), losses, color="tab:blue", alpha=0.35, lw=1)
    top.plot(range(len(losses)), smoothed(losses), color="tab:blue", lw=1.5,
             label=f"{outcome.config.dtype} (smoothed)")
    reference_positive = not result.reference or _all_positive(result.reference["losses"])
    if _all_positive(losses) and reference_positive:
        top.set_yscale("log")
    top.set_ylabel("loss")
    top.legend(fontsize=8, loc="upper right")
    top.grid(alpha=0.3)

    scales = list(outcome.scales)
    if outcome.config.uses_scaler and scales:
        bottom.step(range(len(scales)), scales, where="post", color="tab:orange", lw=1.5,
                    label="loss scale")
        previous = [outcome.config.init_scale, *scales[:-1]]
        skipped = [i for i, (a, b) in enumerate(zip(previous, scales)) if b < a]
        bottom.scatter(skipped, [scales[i] for i in skipped], color="tab:red", s=12, zorder=3,
                       label=f"skipped step ({len(skipped)})")
        bottom.set_yscale("log", base=2)
        bottom.legend(fontsize=8, loc="upper right")
    else:
        bottom.text(0.5, 0.5, f"{outcome.config.dtype}: no loss scaler", ha="center",
                    va="center", transform=bottom.transAxes)
    bottom.set_ylabel("loss scale")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _all_positive(values: Sequence[float]) -> bool:
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0
