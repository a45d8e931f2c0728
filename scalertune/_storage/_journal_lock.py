"""The journal file's lock: Optuna's symlink lock, taken over from a dead holder in every case.

Optuna's ``JournalFileSymlinkLock`` is a symbolic link ``study.log.lock`` to the journal; a
worker killed while it appends leaves the link behind, and the others take it over once it
has not changed for a grace period, which Optuna reads with ``os.stat``: through the link.
The link points at the journal's path as the worker was given it, and a relative path with a
folder (``runs/study.log``, ``../study.log``) resolves beside the link, to nothing. There
``os.stat`` fails and Optuna tries again at once, without sleeping: every other worker spins
at full CPU for ever, and so does every worker when someone plants a link to nowhere.

Here the link is made to the journal's absolute path (a plain Optuna process waiting beside
scalertune's workers follows it), and the lock's age is read from the link itself
(``os.lstat``): a lock left unchanged for ``JOURNAL_LOCK_GRACE_S`` is taken over whatever
it points to, and a worker waits between tries. The lock is the same file, made and removed
the same way, so workers on either lock share a journal. A wait a third of the grace long is
said in one line, and so is the take-over: a quiet half-minute looks like a hang.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid

from optuna.storages.journal import JournalFileSymlinkLock

from scalertune._storage import _policy as _storage_policy
from scalertune._storage._outage import say_or_print

#: The longest wait between two tries for a held lock (Optuna's own).
_MAX_WAIT_S = 1.0


class JournalLock(JournalFileSymlinkLock):
    """Optuna's symlink lock on the journal at ``path``, as the module's docstring says."""

    def __init__(self, path: str) -> None:
        super().__init__(os.path.abspath(path), grace_period=None)
        self.path = path

    def acquire(self) -> bool:
        wait, seen, since, said = 0.001, None, time.monotonic(), False
        grace = _storage_policy.JOURNAL_LOCK_GRACE_S
        while True:
            try:
                os.symlink(self._lock_target_file, self._lock_file)
                return True
            except FileExistsError:
                pass
            try:
                now = os.lstat(self._lock_file)
            except FileNotFoundError:
                continue  # released this moment: try again at once
            if seen is None or (now.st_ino, now.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > grace:
                self._take_over(seen)
                say_or_print(
                    f"journal file {self.path}: its lock {self._lock_file}, unchanged for "
                    f"{grace:g} s (as a worker killed while appending leaves it), taken over"
                )
                seen, wait, said = None, 0.001, False
                continue
            elif not said and time.monotonic() - since > grace / 3:
                say_or_print(
                    f"journal file {self.path}: its lock {self._lock_file} is held; "
                    f"waiting for it (a lock left unchanged for {grace:g} s is taken over)"
                )
                said = True
            time.sleep(wait)
            wait = min(wait * 2, _MAX_WAIT_S)

    def _take_over(self, stale: os.stat_result) -> None:
        """Remove the lock seen unchanged for the grace period, and only that one: a waiter
        that took it over first and then made a fresh lock keeps its own."""
        aside = f"{self._lock_file}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self._lock_file, aside)
        except FileNotFoundError:
            return  # taken over or released already
        moved = os.lstat(aside)
        if (moved.st_ino, moved.st_mtime_ns) != (stale.st_ino, stale.st_mtime_ns):
            with contextlib.suppress(FileExistsError):  # a fresh lock: back where it was
                os.link(aside, self._lock_file, follow_symlinks=False)
        os.unlink(aside)
