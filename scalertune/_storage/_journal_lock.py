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
it points to, by one waiter at a time (Optuna lets two that saw it stale remove it both,
the second the first's fresh lock, and two workers append at once), and a worker waits
between tries. The lock is the same file, made and removed the same way, so workers on
either lock share a journal. A wait a third of the grace long is said in one line, and so is
the take-over: a quiet half-minute looks like a hang.
"""

from __future__ import annotations

import contextlib
import os
import time

from optuna.storages.journal import JournalFileSymlinkLock

from scalertune._storage import _policy as _storage_policy
from scalertune._storage._outage import say_or_print

#: The longest wait between two tries for a held lock (Optuna's own).
_MAX_WAIT_S = 1.0


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two looks at the lock saw the same one, unchanged."""
    return (a.st_ino, a.st_mtime_ns) == (b.st_ino, b.st_mtime_ns)


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
            if seen is None or not _same(now, seen):
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > grace:
                if self._take_over(seen, grace):
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

    def _take_over(self, stale: os.stat_result, grace: float) -> bool:
        """Remove the lock seen unchanged for the grace period, and only that one; whether this
        worker removed it. One waiter at a time decides, holding ``.lock.breaking`` (made
        with ``O_EXCL``): two that saw the same stale lock would otherwise both remove it, the
        second the fresh lock the first made since, and two workers would append at once. A
        mark left by a waiter killed in that instant is removed after the grace period."""
        breaking = self._lock_file + ".breaking"
        try:
            os.close(os.open(breaking, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - os.lstat(breaking).st_mtime > grace:
                    os.unlink(breaking)
            return False
        try:
            now = os.lstat(self._lock_file)
            if not _same(now, stale):
                return False  # released, or a fresh lock since: its holder keeps it
            os.unlink(self._lock_file)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.unlink(breaking)
