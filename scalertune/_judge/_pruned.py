"""The pruned runs, counted: how many stopped for each reason, and where float16's forward
pass overflowed when every float16 run stopped there. The review reads them as
:attr:`~scalertune._judge._findings.Findings.pruned_by_kind` and
:attr:`~scalertune._judge._findings.Findings.forward_overflow_modules`.
"""

from __future__ import annotations

from collections.abc import Sequence

from scalertune._judge._outcome import Outcome


def pruned_by_kind(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """The kind of prune -> how many of ``outcomes`` were pruned for it (``"unknown"`` where a
    run's kind was not recorded)."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.state == "pruned":
            kind = outcome.prune_kind or "unknown"
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def forward_overflow_modules(outcomes: Sequence[Outcome]) -> list[str] | None:
    """``None`` unless *every* float16 run of ``outcomes`` was pruned for a forward overflow;
    then where each overflowed (its culprit modules, as patterns), most frequent first (empty
    if none was named)."""
    runs = [o for o in outcomes if o.config.dtype == "float16"]
    if not runs or any(o.prune_kind != "forward" for o in runs):
        return None
    named = [o.overflow_module for o in runs if o.overflow_module]
    return sorted(set(named), key=lambda m: -named.count(m))
