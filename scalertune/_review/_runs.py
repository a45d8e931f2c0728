"""The real runs that loaded a study's answer and checked themselves as they trained
(``scalertune.load``, ``scalertune.attach``): read from the study, shown beside the search by
``scalertune report`` and in the dashboard's study note."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from scalertune._inrun._account import describe
from scalertune._inrun._run_record import NotARunRecord, RunRecord, UnreadRecord, read_run
from scalertune._storage._names import RUN_PREFIX


def real_runs(attrs: Mapping[str, Any]) -> dict[str, RunRecord | UnreadRecord]:
    """Run name -> its record, oldest first, from a study's user attributes: data from a
    store is read, never trusted (:mod:`scalertune._inrun._run_record`): a value that is no run's
    record is left out, and a damaged record is its run's :class:`UnreadRecord`."""
    runs: dict[str, RunRecord | UnreadRecord] = {}
    for key, value in attrs.items():
        if key.startswith(RUN_PREFIX):
            name = key[len(RUN_PREFIX) :]
            with contextlib.suppress(NotARunRecord):
                runs[name] = read_run(value, f"run {name}")
    return dict(sorted(runs.items(), key=lambda item: item[1].started or ""))


def runs_lines(runs: Mapping[str, RunRecord | UnreadRecord]) -> list[str]:
    """What the summary says of the real runs: a heading, then each run's report."""
    if not runs:
        return []
    lines = [f"Real runs that checked themselves against float32 ({len(runs)}):"]
    for name, run in runs.items():
        lines.append(f"- {name}" + (f", loading {run.yaml}" if run.yaml else ""))
        if isinstance(run, UnreadRecord):
            lines.append("  (its record cannot be read)")
        else:
            lines += ["  " + line for line in describe(run).splitlines()]
    return lines
