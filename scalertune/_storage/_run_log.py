"""The real run's record, written to the study its result file came from.

A run that loads a search's answer (``scalertune.load``, ``scalertune.attach``) checks itself
as it trains (``scalertune._inrun``); its record (the checks, the actions, the scaler's story)
goes to the study as one study attribute per run (a
:class:`~scalertune._inrun._run_record.RunRecord`, with who ran it), so that ``scalertune
report`` and optuna-dashboard show the real run beside the search. Training never waits for it: the
record is handed to a background thread, which writes the latest one it has, and a storage
that cannot be reached is said once, in the log, and tried again at the next record. At the
end of the program the last record is written, for a few seconds at most.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import itertools
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from scalertune._inrun._lines import LOGGER
from scalertune._inrun._run_record import RunRecord
from scalertune._storage._names import RUN_PREFIX
from scalertune._storage._outage import Outage
from scalertune._storage._redact import HIDDEN, redact

#: A run's key as :class:`RunLog` makes it: the prefix, then host, process and start time.
_RUN_KEY = re.compile(re.escape(RUN_PREFIX) + r"[\w.\-]{1,200}")

#: Run logs this process made: the second on is told apart in its key by its number.
_MADE = itertools.count()

#: How long the end of the program waits for the last record to be written.
CLOSE_TIMEOUT_S = 5.0


class RunLog:
    """Writes a run's records to ``study_name`` in ``url``, in the background (see the
    module's docstring); call it with each record. Each goes with who ran it: this host,
    when the log started, and the run's result file (``yaml``) and ``device``."""

    def __init__(
        self, url: str, study_name: str, *, yaml: str | None = None, device: str | None = None
    ) -> None:
        self.url, self.study_name = url, study_name
        started = datetime.datetime.now().astimezone()
        self.key = f"{RUN_PREFIX}{socket.gethostname()}-{os.getpid()}-{started:%Y%m%dT%H%M%S}"
        made = next(_MADE)  # two runs one process loads in the same second: two records
        self.key += f"-{made}" if made else ""
        self.host, self.started = socket.gethostname(), started.isoformat()
        self.yaml, self.device = yaml, device
        self._pending: RunRecord | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._study: Any = None
        self._said = False
        #: What the run's record is at its end (``None``: the run is gone).
        self.final: Callable[[], RunRecord | None] | None = None
        self._thread = threading.Thread(target=self._work, name="scalertune-run-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __call__(self, record: RunRecord) -> None:
        if _rank() != 0:  # on N ranks the record is one run's: rank 0 writes it
            return
        if not (record.steps or record.checks or record.actions):
            return  # loaded, never trained: no run to show beside the search
        with self._lock:
            self._pending = dataclasses.replace(
                record, host=self.host, started=self.started, yaml=self.yaml, device=self.device
            )
        self._wake.set()

    def adopt(self, run: Any) -> None:
        """Go on writing the record of the run a checkpoint came from (``run``: what
        :meth:`of_run` gave it), so that a resumed run keeps one record in the study, not
        one per process. Anything else (a checkpoint of a run with no record, or a damaged
        one) leaves this log's own."""
        if not isinstance(run, Mapping):
            return
        key, started = run.get("key"), run.get("started")
        if not (isinstance(key, str) and _RUN_KEY.fullmatch(key)):
            return
        with self._lock:
            self.key = key
            if isinstance(started, str) and len(started) <= 64:
                self.started = started

    def of_run(self) -> dict[str, str]:
        """Which record this log writes, for a checkpoint (:meth:`adopt` takes it back)."""
        return {"key": self.key, "started": self.started}

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write the last record (:attr:`final`'s, where set: the run as it ends), waiting
        ``timeout`` seconds at most, then stop."""
        if self.final is not None and not self._closing:
            last = self.final()
            if last is not None:
                self(last)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:  # the latest record, and any that came while it was written
                with self._lock:
                    record, self._pending = self._pending, None
                if record is None:
                    break
                self._write(record)
            if self._closing:
                return

    def _write(self, record: RunRecord) -> None:
        try:
            if self._study is None:
                self._study = _open(self.url, self.study_name)
            self._study.set_user_attr(self.key, record.to_dict())
        except (Exception, Outage) as exc:  # any storage failure: training goes on without it
            self._study = None
            if not self._said:
                self._said = True
                LOGGER.warning(
                    "scalertune: the run's record cannot be written to study %r in %s (%s): "
                    "it stays in amp.report(), and is tried again at the next check",
                    self.study_name,
                    redact(self.url),
                    redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, self.url),
                )


def _rank() -> int:
    """This process's rank: the process group's, else the launcher's (torchrun's ``RANK``,
    srun's ``SLURM_PROCID``): a rank's last record, written as the program ends after its
    process group is gone, is still not rank 0's."""
    torch = sys.modules.get("torch")  # no import at the program's end: none, no group
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    launched = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    return int(launched) if launched.isdigit() else 0


def _open(url: str, study_name: str) -> Any:
    from scalertune._storage._open import load_existing_study

    return load_existing_study(url, study_name)


def study_of(result: Mapping[str, Any], path: str, storage: str | None) -> tuple[str, str] | None:
    """Where a result file's study lives: ``storage`` if given, else the file's own
    ``evidence.storage`` (a relative SQLite path or journal file found beside the file, or
    where the program runs); ``None`` when the file names none, or only with its password
    hidden (give ``storage=`` with it)."""
    evidence = result.get("evidence")
    if not isinstance(evidence, Mapping) or not isinstance(evidence.get("study"), str):
        return None
    url = storage if storage is not None else evidence.get("storage")
    if not isinstance(url, str) or (storage is None and HIDDEN in url):
        return None
    return _beside(url, os.path.dirname(os.path.abspath(path))), evidence["study"]


def _beside(url: str, folder: str) -> str:
    """A relative SQLite or journal path as the search saw it, found beside the result file
    when it is there (the search writes the file where it runs)."""
    prefix = "sqlite:///" if url.startswith("sqlite:///") else ""
    path = url[len(prefix) :]
    if "://" in url and not prefix or os.path.isabs(path) or not path:
        return url
    there = os.path.join(folder, path)
    return prefix + there if os.path.exists(there) else url
