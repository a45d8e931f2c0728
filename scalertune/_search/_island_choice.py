"""Where one module's precision limits a late phase: the float32 island that fixes it.

A finalist that falls behind float32 (or goes non-finite) in a phase of the horizon is
checked at float32's checkpoint of the horizon's last window (where float32 has fitted the
most, so where a precision floor shows most, whichever window the finalist failed in): the
trace names the modules whose forward outputs were largest from there, and each, largest
first, is kept in float32 while the checkpoint's weights are evaluated under the finalist's
autocast
(:func:`~scalertune._run._forward.forward_ratio`). The first island that brings the loss back
within the phase tolerance of float32's is proposed: the same config with that module in
float32, trained from the start and branched at every phase like the finalists, and
recommended if it holds. A config that falls behind for another reason (a clip that hurts
late) is not helped by an island, and none is proposed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._outcome import Outcome
from scalertune._review._result import SearchResult
from scalertune._run._forward import forward_ratio
from scalertune._search import _policy as _search_policy
from scalertune._search._branch import latest_start
from scalertune._search._isolate import run_here
from scalertune._search._references import References
from scalertune._search._setup import Setup


def island_for(
    result: SearchResult, finalist: Outcome, setup: Setup, references: References
) -> AmpConfig | None:
    """The config with one module in float32 that the late-phase check says fixes where
    ``finalist`` stopped holding; ``None`` when it held, or no island helps."""
    failed = [p for p in result.phases.get(finalist.number, []) if not p.holds]
    if not failed or finalist.config.fp32_modules or finalist.config.dtype == "float32":
        return None
    reference = references.reference(setup.seed)
    start = latest_start(reference)
    checkpoint = references.checkpoint(setup.seed, start)  # where the precision floor shows most
    if _ratio(setup, finalist.config, checkpoint) <= 1 + _policy.PHASE_TOLERANCE:
        return None  # the forward is as good as float32's: the precision is not what fails
    for module in _largest_outputs(references, setup.seed, start):
        island = dataclasses.replace(finalist.config, fp32_modules=(module,))
        if _ratio(setup, island, checkpoint) <= 1 + _policy.PHASE_TOLERANCE:
            return island
    return None


def _ratio(setup: Setup, config: AmpConfig, checkpoint: str) -> float:
    return run_here(
        forward_ratio, setup.factory, config, checkpoint, seed=setup.seed, device=setup.device
    )


def _largest_outputs(references: References, seed: int, start: int) -> list[str]:
    """The modules whose forward outputs the trace saw largest from ``start`` on."""
    trace = references.trace(seed)
    rows = trace.block_starts >= start
    if not rows.any() or not trace.modules:
        return []
    peaks = trace.forward[rows].max(axis=0)
    order = np.argsort(-peaks)[: _search_policy.ISLAND_CANDIDATES]
    return [trace.modules[i] for i in order if peaks[i] > 0 and trace.modules[i] != "(model)"]
