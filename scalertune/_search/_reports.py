"""A run's curve, written to the study while it trains, from a background thread."""

from __future__ import annotations

import math
import queue
import threading
import time

import optuna

from scalertune import _policy
from scalertune._judge._target import Target, smoothed
from scalertune._run._record import RunRecord
from scalertune._search import _policy as _search_policy
from scalertune._storage._optuna import write_points


class Reports:
    """Writes a run's curve to the study from a background thread, one point per read-back
    window: log10 of the smoothed loss over the float32 target (0 = reached), so that runs of
    any loss scale compare on one axis in the dashboard. The points are written together at
    most every ``CURVE_FLUSH_S`` (one transaction, :func:`write_points`), so that the thread
    costs the trial little however short its windows are; the dashboard's view of a running
    trial is that much behind. A branch's points sit at the steps of the training it is part
    of. A pruned run's curve ends with one NaN point: Optuna takes a pruned trial's last point
    for its objective value, which would put a loss ratio on the time-to-target axis of the
    History plot; with NaN it leaves the value empty."""

    def __init__(self, trial: optuna.Trial, target: Target) -> None:
        self._trial, self._target = trial, target
        self._queue: queue.SimpleQueue[tuple[float, int] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="scalertune-reports", daemon=True)
        self._thread.start()

    def window(self, record: RunRecord, start: int, last: int | None = None) -> None:
        """Queue the points of the windows that ended since ``start`` (up to ``last``)."""
        curve = smoothed(record.losses[max(0, start - _policy.SMOOTHING_STEPS) :])
        offset = max(0, start - _policy.SMOOTHING_STEPS)
        end = record.steps_run if last is None else last
        for step in range(start, end):
            if (step + 1) % _policy.READBACK_INTERVAL and step + 1 < end:
                continue
            value = self._target.relative(curve[step - offset])
            if math.isfinite(value):
                self._queue.put((value, record.start + step))

    def _write(self) -> None:
        pending: list[tuple[float, int]] = []
        due = 0.0
        item: tuple[float, int] | tuple[()] | None
        while True:
            try:
                item = self._queue.get(
                    timeout=max(0.0, due - time.monotonic()) if pending else None
                )
            except queue.Empty:
                item = ()  # the flush is due
            if item:
                if not pending:
                    due = time.monotonic() + _search_policy.CURVE_FLUSH_S
                pending.append(item)
                continue
            if self._error is None:
                try:
                    write_points(self._trial, pending)
                except BaseException as exc:  # noqa: BLE001 - raised again in close()
                    self._error = exc
            pending = []
            if item is None:
                return

    def close(self, pruned: RunRecord | None = None) -> None:
        """Wait until every point is written (a trial is finished only after its curve);
        ``pruned``: the run was pruned, and its curve is closed (see the class docstring)."""
        if pruned is not None:
            self._queue.put((math.nan, pruned.start + pruned.steps_run))
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
