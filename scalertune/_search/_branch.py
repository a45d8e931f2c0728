"""A finalist branched from the float32 reference for one window of a phase of the horizon,
or the search's leading config trained from step 0 to the horizon.

The branch loads the reference's checkpoint at the window's first step (weights, optimizer
and scheduler state, data position, random state), so it trains on exactly the batches the
reference trained on from there; a float16 config's scaler starts where the replay of that
config over the reference's gradient trace says it would be by then (not at ``init_scale``,
whose start-up back-offs a real run would long have left behind). Its losses are compared,
step by step, with float32's own over the same window (:func:`~scalertune._judge._phases.
judge_phase`).

The leading config (the one the search would answer with) is not branched: it trains from
step 0 with its own scaler from ``init_scale``, as the user's run will, and is judged at the
same windows against the reference's losses there (:func:`~scalertune._judge._phases.
judge_from_start`); it stops at the first window it does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedCheckpoint, MissingEvidence
from scalertune._judge._judged import PhaseFigures
from scalertune._judge._phases import (
    judge_from_start,
    judge_phase,
    judged_end,
)
from scalertune._replay._state import scaler_state_at
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord
from scalertune._search._isolate import execute, forward
from scalertune._search._reference_checkpoints import Checkpoints
from scalertune._search._references import References
from scalertune._search._setup import Setup


def run_branch(
    setup: Setup,
    references: References,
    config: AmpConfig,
    *,
    seed: int,
    start: int,
    end: int,
    on_window: Any = None,
) -> tuple[RunRecord, PhaseFigures]:
    """Train ``config`` from the reference's checkpoint at ``start`` to ``end``; the record
    and the phase's verdict."""
    reference = references.reference(seed)
    scaler = scaler_state_at(references.trace(seed), config, start) if config.uses_scaler else None
    record = references.checkpoints.branching(
        lambda: references.checkpoint(seed, start),
        lambda checkpoint: execute(
            setup,
            config,
            steps=end,
            seed=seed,
            on_window=on_window,
            plan=Plan(checkpoint=checkpoint, scaler=scaler),
        ),
    )
    result = judge_phase(record.losses, reference.windows[start], start=start, pruned=record.pruned)
    behind = result.behind and not result.nonfinite
    return record, PhaseFigures(
        start=start,
        end=end,
        ratio=_finite(result.ratio),
        z=_finite(result.z),
        nonfinite=result.nonfinite,
        holds=result.holds,
        forward=_finite(_forward(setup, references, config, seed)) if behind else None,
        forward_at=reference.latest_start,
    )


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def run_from_start(
    setup: Setup,
    references: References,
    config: AmpConfig,
    *,
    seed: int,
    end: int,
    on_window: Any = None,
    save: str | None = None,
    continues: str | None = None,
    resumed_at: int = 0,
    log: Callable[[str], None],
) -> tuple[RunRecord, PhaseFigures, int | None]:
    """Train ``config`` from step 0 to ``end`` (the horizon, or as far as the search can
    afford), judged at every phase window up to there; the record, its verdict at each
    window it got to, and the steps it trained itself where it continued another run.
    ``save``: the name its state at ``end`` is kept under (in the study's artifact store),
    for a later run to continue from (``continues``: that state, saved at step
    ``resumed_at``, the run then going on to ``end`` as one run). A state to continue from
    that is missing or damaged is said in one line (``log``), and the run trains from step
    0 instead: the same run, only longer (:func:`_continuing`)."""
    reference = references.reference(seed)
    spans = [w for w in setup.windows if judged_end(*w) <= end]
    stop = _BehindStop(reference.windows, spans, end)

    def train(checkpoint: str | None) -> RunRecord:
        plan = Plan(
            save_at={end: references.checkpoints.stored(save)} if save else {},
            checkpoint=checkpoint,
            resume=bool(checkpoint),
        )
        return execute(
            setup, config, steps=end, seed=seed, on_window=on_window, stop=stop, plan=plan
        )

    record, continued = _continuing(references.checkpoints, continues, train, log)
    results = judge_from_start(
        record.losses,
        reference.windows,
        spans,
        pruned=record.pruned,
        first_nonfinite=record.steps_run if record.pruned else None,
    )
    behind = next((p for p in results if p.behind and not p.nonfinite), None)
    last = results[-1] if results else None  # the verdict's window, as a branch shows one
    verdict = PhaseFigures(
        start=0,
        end=end,
        results=tuple(results),
        ratio=None if last is None else _finite(last.ratio),
        z=None if last is None else _finite(last.z),
        nonfinite=bool(last and last.nonfinite),
        holds=all(p.holds for p in results),
        forward=None if behind is None else _finite(_forward(setup, references, config, seed)),
        forward_at=reference.latest_start,
    )
    # a continuation's record holds the run it continues: count its own steps
    return record, verdict, record.steps_run - resumed_at if continued else None


def _continuing(
    checkpoints: Checkpoints,
    name: str | None,
    run: Callable[[str | None], RunRecord],
    log: Callable[[str], None],
) -> tuple[RunRecord, bool]:
    """``run`` from the state saved as ``name`` (a finalist's own), or from step 0
    (``run(None)``) where there is none, or it is missing or damaged (said in one line),
    found so as the run loads it included; and whether it continued."""
    path = None
    if name:
        try:
            path = checkpoints.fetch(checkpoints.stored(name))
        except MissingEvidence as exc:
            log(f"{exc}: training it from step 0 instead")
    if path is None:
        return run(None), False
    try:
        return run(path), True
    except DamagedCheckpoint as exc:  # nothing ran yet: the run stopped as it loaded
        checkpoints.refuse(path, f"{exc}: training it from step 0 instead", log)
        return run(None), False


def _forward(setup: Setup, references: References, config: AmpConfig, seed: int) -> float:
    """``config``'s forward loss over float32's at float32's own weights, at the horizon's
    latest checkpoint (where float32 has fitted the most, so where a precision floor shows
    most). Within the phase tolerance, a run of it that fell behind did so on its way (a
    plateau of its own), and a branch of its dtype from float32's weights shows nothing about
    getting there; beyond it, the precision itself is what fails, for every config that
    shares it."""
    start = references.reference(seed).latest_start
    return references.checkpoints.branching(
        lambda: references.checkpoint(seed, start),
        lambda checkpoint: forward(setup, config, checkpoint, seed=seed),
    )


class _BehindStop:
    """Stops a run from step 0 after the first window it does not hold (what comes after
    cannot change the verdict)."""

    def __init__(
        self, windows: Mapping[int, Sequence[float]], spans: list[tuple[int, int]], run_end: int
    ) -> None:
        self.windows, self.pending, self.run_end = windows, list(spans), run_end

    def _need(self, span: tuple[int, int]) -> int:
        """When a window can be judged: at its end if the run gets there, else at the end
        of its first half (see :func:`~scalertune._judge._phases.judge_from_start`)."""
        return span[1] if span[1] <= self.run_end else judged_end(*span)

    def __call__(self, record: RunRecord) -> bool:
        while self.pending and self._need(self.pending[0]) <= record.steps_run:
            span = self.pending.pop(0)
            if not all(
                p.holds for p in judge_from_start(record.losses, self.windows, [span], pruned=False)
            ):
                record.stopped = "behind"
                return True
        return False
