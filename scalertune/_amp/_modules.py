"""Naming modules for float32 islands: ``model.named_modules()`` names or glob patterns."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable

from scalertune._errors import UsageError


def is_pattern(entry: str) -> bool:
    """Whether an ``fp32_modules`` entry is a glob pattern rather than one module's name."""
    return any(c in entry for c in "*?[")


def kept_in_float32(name: str, entries: Iterable[str]) -> bool:
    """Whether module ``name`` runs in float32 under the islands ``entries``: an entry names
    or matches it, or one of the modules it is inside (``0`` keeps ``0.0`` in float32).

    >>> kept_in_float32("layers.1.mlp.down", ["layers.*.mlp"]), kept_in_float32("head", ["0"])
    (True, False)
    """
    parts = name.split(".")
    outer = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatchcase(n, e) if is_pattern(e) else n == e for e in entries for n in outer
    )


def match_modules(entries: Iterable[str], names: Iterable[str]) -> list[str]:
    """The module names (of ``names``, in their order) that ``entries`` select.

    Each entry is a name from ``model.named_modules()`` or a glob pattern over those names
    (``fnmatch`` rules, where ``*`` also crosses dots). The model itself (the empty name) is
    never selected: keeping all of it in float32 is not mixed precision. An entry that selects
    nothing is a :class:`UsageError` naming the closest names, so a typo never silently trains
    without the island it meant.
    """
    names = [n for n in names if n]
    chosen: set[str] = set()
    for entry in entries:
        hits = (
            [n for n in names if fnmatch.fnmatchcase(n, entry)]
            if is_pattern(entry)
            else [entry]
            if entry in names
            else []
        )
        if not hits:
            raise UsageError(_no_match(entry, names))
        chosen.update(hits)
    return [n for n in names if n in chosen]


def _no_match(entry: str, names: list[str]) -> str:
    if is_pattern(entry):
        # Close patterns are suggested from the names' dotted tails (*.DenseReluDense.wo).
        tails = sorted(
            {"*." + ".".join(n.split(".")[i:]) for n in names for i in range(1, n.count(".") + 1)}
        )
        close = difflib.get_close_matches(entry, tails + names, n=3, cutoff=0.75)
        what = f"fp32_modules pattern {entry!r} matches no module of the model"
    else:
        close = difflib.get_close_matches(entry, names, n=3, cutoff=0.75)
        what = f"fp32_modules names {entry!r}, which the model does not have"
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?"
        if close
        else f"use names from model.named_modules(), e.g. {', '.join(repr(n) for n in names[:3])}"
    )
    return f"{what}: {hint}"


def _split(names: str) -> tuple[str, ...]:
    """``"attn.score, ffn"`` -> ``("attn.score", "ffn")``; ``""`` or ``"none"`` -> ``()``."""
    if names.strip().lower() in ("", "none"):
        return ()
    return tuple(n.strip() for n in names.split(",") if n.strip())
