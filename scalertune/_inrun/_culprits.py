"""Which module is at fault, found on the step's own batch by the check's passes: the module
whose float32 island brings a failing precision back, the modules whose own computation
overflowed float16, or the one whose outputs come nearest float16's range. Every figure is
agreed over the ranks, so that every rank names the same modules."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scalertune import _policy
from scalertune._amp._runtime import AmpRuntime
from scalertune._inrun._gap import Check, relative
from scalertune._inrun._passes import Passes, over_ranks

#: The island candidates a check tries, largest outputs first: the search's late-phase check
#: found the module at fault among its 3 largest every time; a few more cost a forward each,
#: only when the precision fails.
ISLAND_CANDIDATES = 8

#: An island is kept only if it brings the step's batch within this share of float32's loss:
#: one that only narrows the gap leaves the run to fall further behind in training than its
#: forward shows (measured on a regression near 1000: bfloat16 with its last layer in float32
#: stayed 1.08-1.16x float32's at the same weights, and ended 1.34x float32's loss trained);
#: then the run trains in float32.
ISLAND_CLOSES = 0.05

#: A forward that overflowed on one batch, looked at on the next, may not overflow there (an
#: activation at float16's edge overflows on some batches only): then the module whose
#: float32 outputs come within this factor of float16's 65504 is the one at fault. Four
#: powers of two: an activation of 4,096 and more is rare in a model that trains in float16
#: (layer norms, attention and logits stay in the tens to hundreds); one that grew there is
#: one sharp batch away from the edge.
AT_RISK = 2.0**4


def island_for(amp: AmpRuntime, passes: Passes, check: Check) -> tuple[str, float] | None:
    """The first of the largest-output modules (under float8: the layers float8 costs most)
    whose island brings this batch's loss within ``ISLAND_CLOSES`` of float32's, else the
    one that came closest; with its ratio (``None``: no module to try)."""
    # float8: the layers float8 costs most; else the largest outputs, nearest the range
    peaks = _float8_errors(amp, passes) if amp.config.float8 else _peaks(amp, passes)
    islands = passes.in_float32()
    tried = [n for n in peaks if n not in islands and not passes.whole(n)]
    order = sorted(tried, key=lambda n: (-peaks[n], -n.count(".")))  # a tie: the inner one
    best: tuple[str, float] | None = None
    for name in order[:ISLAND_CANDIDATES]:
        (ours,) = over_ranks([float(passes.islanded([name]))], amp.device)
        with_it = relative(ours, check.float32)
        if best is None or with_it < best[1]:
            best = (name, with_it)
        if with_it <= 1 + ISLAND_CLOSES:
            break
    return best


def overflow_islands(
    amp: AmpRuntime, passes: Passes, *, finite: bool
) -> tuple[list[str] | None, str]:
    """The islands for a forward overflow and why, in words: the culprits, round by round
    until this batch's forward is finite (``[]``: it never is); where this batch does not
    overflow, the module whose outputs come within ``AT_RISK`` of float16's range (``None``:
    none does, so nothing points at the forward)."""
    found: list[str] = []
    for _ in range(_policy.DIAGNOSE_ISLAND_ROUNDS):
        more = [c for c in _culprits(amp, passes, found) if c not in found]
        found += more
        if not found and finite:
            return _at_risk(amp, passes)
        (loss,) = over_ranks([float(passes.islanded(found))], amp.device)
        if math.isfinite(loss):
            return (
                found,
                f"{', '.join(map(repr, found))} turned finite inputs into non-finite outputs",
            )
        if not more:
            break
    return [], "no module kept in float32 makes it finite"


def _at_risk(amp: AmpRuntime, passes: Passes) -> tuple[list[str] | None, str]:
    peaks = _peaks(amp, passes)
    edge = _policy.FLOAT16_OVERFLOW / AT_RISK
    risky = sorted((p, n.count("."), n) for n, p in peaks.items() if p >= edge)
    risky = [r for r in risky if not passes.whole(r[2])]
    if not risky:
        return None, f"no module's output reaches {edge:g} on this batch"
    peak, _, name = risky[-1]  # the largest; of equal ones, the inner one
    return [name], (
        f"the outputs of {name!r} reach {peak:.4g} on this batch, within {AT_RISK:g}x of "
        "float16's 65504"
    )


def _float8_errors(amp: AmpRuntime, passes: Passes) -> dict[str, float]:
    """Each float8 layer's error against float32 on this batch, the mean over the ranks."""
    errors = passes.float8_errors()
    names = [n for n in passes.module_names() if n in errors] if errors else []
    agreed = over_ranks([errors[n] for n in names], amp.device) if names else []
    return dict(zip(names, agreed))


def _peaks(amp: AmpRuntime, passes: Passes) -> dict[str, float]:
    """Each module's largest float32 output, the largest over the ranks' batches (one rank's
    outlier is the one near float16's range), by the models' module names: every rank
    reduces the same list, whichever modules ran on its batch (0 for one that did not)."""
    peaks = passes.outputs()
    names = passes.module_names()
    agreed = (
        over_ranks([peaks.get(n, 0.0) for n in names], amp.device, largest=True) if names else []
    )
    return {n: p for n, p in zip(names, agreed) if n in peaks or p > 0}


def _culprits(amp: AmpRuntime, passes: Passes, islands: Sequence[str]) -> list[str]:
    """The overflowing modules, as every rank saw them (the union)."""
    names = passes.module_names()
    seen = set(passes.overflowing(islands))
    flags = over_ranks([float(n in seen) for n in names], amp.device) if names else []
    return [n for n, f in zip(names, flags) if f > 0]
