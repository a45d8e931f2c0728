"""A finalist branched from the float32 reference for one window of a phase of the horizon.

The branch loads the reference's checkpoint at the window's first step (weights, optimizer
and scheduler state, data position, random state), so it trains on exactly the batches the
reference trained on from there; a float16 config's scaler starts where the replay of that
config over the reference's gradient trace says it would be by then (not at ``init_scale``,
whose start-up back-offs a real run would long have left behind). Its losses are compared,
step by step, with float32's own over the same window (:func:`~scalertune._judge._phases.
judge_phase`).
"""

from __future__ import annotations

from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._judge._phases import judge_phase
from scalertune._replay._state import scaler_state_at
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord
from scalertune._search._isolate import execute
from scalertune._search._references import References
from scalertune._search._setup import Setup


def run_branch(setup: Setup, references: References, config: AmpConfig, *, seed: int,
               start: int, end: int, on_window: Any = None) -> tuple[RunRecord, dict[str, Any]]:
    """Train ``config`` from the reference's checkpoint at ``start`` to ``end``; the record
    and the phase's judged figures."""
    horizon = references.horizon(seed)
    checkpoint = horizon["checkpoints"][str(start)]
    scaler = (scaler_state_at(references.trace(seed), config, start)
              if config.uses_scaler else None)
    record = execute(setup, config, steps=end, seed=seed, on_window=on_window,
                     plan=Plan(checkpoint=checkpoint, scaler=scaler))
    result = judge_phase(record.losses, horizon["windows"][str(start)], start=start,
                         pruned=record.pruned)
    return record, {
        "phase_start": start, "phase_end": end, "phase_ratio": _finite(result.ratio),
        "phase_z": _finite(result.z), "phase_nonfinite": result.nonfinite,
        "phase_holds": result.holds, "initial_scale": record.initial_scale,
    }


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None
