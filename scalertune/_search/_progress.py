"""What a search says while it runs: one line per finished run on stderr, or a progress bar.

On a terminal the lines go through a tqdm bar (written above it, so the bar is never torn);
otherwise, or with ``--quiet``, to the log function given (or nowhere).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._judge._horizon import behind_from
from scalertune._judge._judged import Judged, PhaseFigures
from scalertune._run._record import RunRecord


class Progress:
    """The search's lines and its bar (``bar=True``: a tqdm bar on stderr)."""

    def __init__(self, log: Callable[[str], None] | None, *, bar: bool) -> None:
        self._bar = _bar() if bar else None
        # A bar with total 0 is falsy (tqdm defines __len__), hence "is not None".
        if self._bar is not None:
            write = self._bar.write
            self.line = lambda text: write(text, file=sys.stderr)
        else:
            self.line = log or (lambda _: None)

    def grow(self, n: int) -> None:
        """``n`` more runs to come."""
        if self._bar is not None:
            self._bar.total = (self._bar.total or 0) + n
            self._bar.refresh()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def finished(
        self, number: int, who: str, config: AmpConfig, record: RunRecord, judged: Judged
    ) -> None:
        """One line for a run that trained: what it reached, or why it stopped."""
        figures = judged.figures
        steps, ratio = figures.steps_to_target, figures.loss_vs_float32
        if record.pruned:
            what = f"pruned at step {record.steps_run}: {record.prune_reason}"
        elif judged.phase is not None:
            what = _phase_words(judged.phase)
        elif steps is None:
            what = "never reached the target" + (
                f" (loss {ratio:.3g}x float32's at step {figures.loss_vs_float32_step})"
                if ratio is not None
                else ""
            )
        else:
            what = f"reached the target at step {steps}"
        skipped = figures.skipped_steps
        self.line(
            f"#{number} {who + ' ' if who else ''}[{config.describe()}] {what}"
            + (f", {skipped} skipped" if skipped else "")
        )
        self.advance()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _phase_words(phase: PhaseFigures) -> str:
    window = f"steps {phase.start}-{phase.end}"
    if phase.results is not None:
        return f"{window}: {behind_from(list(phase.results))}"
    if phase.nonfinite:
        return f"{window}: non-finite"
    verdict = "holds" if phase.holds else "falls behind"
    ratio = phase.ratio
    return f"{window}: {verdict}" + (f" ({ratio:.3g}x float32's loss)" if ratio else "")


def _bar() -> Any:
    from tqdm.auto import tqdm

    # A bar as wide as the terminal wraps in some (tmux), and the lines written above it
    # then start on the bar's row; 100 columns leaves room.
    return tqdm(total=0, desc="scalertune", unit="run", file=sys.stderr, leave=False, ncols=100)
