"""float32 islands for a forward overflow: the culprit modules, grouped into patterns, checked."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._modules import match_modules
from scalertune._diagnose import _policy as _diagnose_policy
from scalertune._diagnose._patterns import group_patterns
from scalertune._diagnose._report import IslandAdvice
from scalertune._diagnose._runner import _Run, _Runner


def locate_forward_overflow(
    factory: Callable[[], Any],
    config: AmpConfig,
    losses: Sequence[float],
    *,
    seed: int,
    device: torch.device,
) -> IslandAdvice | None:
    """Replay a run that overflowed forward (its per-step ``losses``) up to its first
    non-finite loss, find the modules whose own computation overflowed, and check that
    keeping them in float32 makes that forward finite. ``None`` when the overflow came too
    late to replay (``LOCATE_MAX_STEPS``) or no module is to blame."""
    first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if first_bad is None or first_bad >= _diagnose_policy.LOCATE_MAX_STEPS:
        return None
    run = _Runner(factory, steps=first_bad + 1, seed=seed, device=device, watch_from=first_bad)
    first = run(config)
    if not first.forward_overflow:
        return None
    culprits, current, _ = _find_islands(run, config, first)
    if not any(culprits):
        return None
    islanded = match_modules(current.config.fp32_modules, first.names)
    where = group_patterns([c for c in culprits if c], first.names)
    return IslandAdvice(
        culprits=culprits,
        where=",".join(where + ["(model)"] * ("" in culprits)),
        islands=group_patterns(islanded, first.names),
        fixed=not current.forward_overflow,
    )


def _find_islands(
    run: _Runner, config: AmpConfig, first: _Run
) -> tuple[list[str], _Run, list[_Run]]:
    """Keep the culprits found so far in float32 and rerun, until the forward is finite.

    Each rerun also recomputes any further culprit without submodules in float32 on the spot
    (so the modules after it see what they would see with it islanded) and names it; a rerun
    that had nothing to recompute is a plain run, and it is the check. Returns the culprits,
    the last plain run (``first`` if none was needed) and the plain reruns.
    """
    culprits = list(first.culprits)
    current, plain = first, []
    if not first.forward_overflow:
        return [], first, []
    for _ in range(_policy.DIAGNOSE_ISLAND_ROUNDS):
        islands = tuple(c for c in culprits if c)
        if not islands:
            break
        trial = run(
            dataclasses.replace(config, fp32_modules=config.fp32_modules + islands), repair=True
        )
        new = [c for c in trial.culprits if c not in culprits]
        culprits += new
        if trial.repaired == 0:
            current = trial
            plain.append(trial)
            if not new:
                break
    islands = tuple(c for c in culprits if c)
    if islands and current.config.fp32_modules != config.fp32_modules + islands:
        current = run(dataclasses.replace(config, fp32_modules=config.fp32_modules + islands))
        plain.append(current)
    return culprits, current, plain
