"""The real runs that loaded a study's answer and checked themselves as they trained
(``scalertune.load``, ``scalertune.attach``): read from the study, shown beside the search by
``scalertune report`` and in the dashboard's study note."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scalertune._inrun._account import describe
from scalertune._storage._names import RUN_PREFIX


def real_runs(attrs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Run name -> its record, oldest first, from a study's user attributes (a record that is
    not what a run writes is left out: data from a store is read, never trusted)."""
    runs = {
        key[len(RUN_PREFIX) :]: value
        for key, value in attrs.items()
        if key.startswith(RUN_PREFIX) and _is_record(value)
    }
    return dict(sorted(runs.items(), key=lambda item: str(item[1].get("started", ""))))


def _is_record(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("policy"), dict)
        and isinstance(value.get("config"), dict)
        and isinstance(value.get("steps"), int)
        and isinstance(value.get("checks", []), list)
        and isinstance(value.get("actions", []), list)
    )


def runs_lines(runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the summary says of the real runs: a heading, then each run's report."""
    if not runs:
        return []
    lines = [f"Real runs that checked themselves against float32 ({len(runs)}):"]
    for name, record in runs.items():
        where = record.get("yaml", "")
        lines.append(f"- {name}" + (f", loading {where}" if where else ""))
        try:
            lines += ["  " + line for line in describe(record).splitlines()]
        except (KeyError, TypeError, ValueError):
            lines.append("  (its record cannot be read)")
    return lines
