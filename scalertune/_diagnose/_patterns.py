"""Module names as glob patterns: every block's DenseReluDense.wo as one *.DenseReluDense.wo."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence


def group_patterns(chosen: Sequence[str], names: Sequence[str]) -> list[str]:
    """``chosen`` module names as glob patterns over ``names`` that select exactly them.

    Modules that repeat (every block's ``DenseReluDense.wo``) share a pattern: the dotted
    tail they have in common (``*.DenseReluDense.wo``), or their shared name with the parts
    that differ as ``*`` (``encoder.block.*.layer.1.DenseReluDense.wo``). A pattern is used
    only if it selects no other module of the model; the one covering most names wins, then
    the one with the fewest wildcards, then the longest. What no pattern groups stays a name.
    """
    names = [n for n in names if n]
    allowed = set(chosen)
    left = [n for n in names if n in allowed]
    out: list[str] = []
    while left:
        best: tuple[tuple[int, int, int], str, set[str]] | None = None
        for pattern in _candidate_patterns(left):
            hits = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
            covered = hits & set(left)
            if len(covered) < 2 or not hits <= allowed:
                continue
            key = (len(covered), -pattern.count("*"), len(pattern))
            if best is None or key > best[0]:
                best = (key, pattern, covered)
        if best is None:
            out += left
            break
        out.append(best[1])
        left = [n for n in left if n not in best[2]]
    return out


def _candidate_patterns(names: list[str]) -> Iterator[str]:
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts)):
            yield "*." + ".".join(parts[k:])
    head = names[0].split(".")
    for other in names[1:]:
        parts = other.split(".")
        if len(parts) == len(head):
            yield ".".join(a if a == b else "*" for a, b in zip(head, parts))
