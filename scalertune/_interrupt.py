"""Ctrl-C and SIGTERM: stop at a safe point, never inside a storage write.

Python turns SIGINT into a ``KeyboardInterrupt`` raised between any two bytecodes. Inside a
storage write that tears a transaction in half: SQLAlchemy's session is left mid-commit, the
next write fails with an unrelated error, and a trial can stay RUNNING with nobody to finish
it. So while a search works on its study, a signal only *marks* that an interrupt is pending,
and the ``KeyboardInterrupt`` is raised where nothing is half-written:

- at once, inside :func:`interruptible` code (training runs, waits): what those do is thrown
  away when they are interrupted, so stopping them anywhere is safe;
- otherwise when the storage work in progress is done and the next interruptible code starts
  (:func:`interruptible` raises on entry when one is pending), or when the search ends;
- and never inside an import (:func:`imports`: torch's, the user's factory module): one cut
  while an extension's C++ runs Python code aborts the process.

Training code never writes to the study itself (a run's curve goes from a background thread,
and only the main thread handles signals). SIGTERM is handled exactly like Ctrl-C. A second
signal while the first is being honoured changes nothing; a third exits at once (status 130):
the study stays consistent, as after any killed worker, and the next run recovers the trial
that was running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

#: Exit status of a command stopped by Ctrl-C or SIGTERM (the shell's 128 + SIGINT).
EXIT_INTERRUPTED = 130
#: Signals handled as Ctrl-C.
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The signal that stops waiting for a safe point.
_FORCE_AT = 3


class _State:
    def __init__(self) -> None:
        self.received = 0  # signals since handling began
        self.pending = False  # the first one arrived and has not been raised yet
        self.deferring = 0  # depth of deferred() scopes
        self.open = 0  # depth of interruptible() scopes inside them
        self.settled = False  # the process has its exit status and is leaving


_state = _State()


def _handler(signum: int, frame: Any) -> None:
    _state.received += 1
    if _state.settled:
        return
    if _state.received >= _FORCE_AT:
        os.write(
            2,
            b"scalertune: interrupted again: exiting now; rerun the same command to "
            b"resume (it recovers the trial that was running)\n",
        )
        os._exit(EXIT_INTERRUPTED)
    if _state.received > 1:  # the first one is stopping the work already
        return
    if _state.deferring == 0 or _state.open > 0:
        raise KeyboardInterrupt
    _state.pending = True


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Handle Ctrl-C and SIGTERM in this scope (main thread only; elsewhere, and for a signal
    the process was started to ignore, nothing changes): the first one raises
    ``KeyboardInterrupt`` (at a safe point inside :func:`deferred`), a second one is ignored
    while the first is honoured, a third exits at once."""
    if threading.current_thread() is not threading.main_thread() or any(
        signal.getsignal(s) is _handler for s in SIGNALS
    ):  # an outer scope handles them
        yield
        return
    previous = {}
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN:  # e.g. `nohup`, or a background job in a script
            previous[signum] = current
            signal.signal(signum, _handler)
    _state.received, _state.pending = 0, False
    try:
        yield
    finally:
        if not _state.settled:
            for signum, current in previous.items():
                signal.signal(signum, current)


def settle() -> None:
    """The command has its exit status and the process is about to exit with it: from now on
    Ctrl-C and SIGTERM are ignored. (Python's finalisation puts back the default action of a
    signal it handled, so a late one would kill the process and change its status; an
    ignored signal stays ignored.)"""
    _state.settled = True
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            if signal.getsignal(signum) is _handler:
                signal.signal(signum, signal.SIG_IGN)
    _forget_unhandled_interrupt()


def _forget_unhandled_interrupt() -> None:
    """Keep the exit status the command chose. Under ``python -m``, CPython ends the process
    with SIGINT (status -2, not 130) when any code it evaluated from C (``PyRun_String``:
    pybind11's ``exec``, for one) ended in a ``KeyboardInterrupt``, even one that scalertune
    then caught and turned into status 130; an evaluation that ends well clears that mark."""
    if sys.implementation.name == "cpython":
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")


def received() -> bool:
    """Whether Ctrl-C or SIGTERM arrived since :func:`handled` began."""
    return _state.received > 0


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """In this scope a signal waits for a safe point (see the module's docstring)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1


def checkpoint() -> None:
    """A safe point: raise the ``KeyboardInterrupt`` of a signal still pending."""
    _raise_if_pending()


@contextlib.contextmanager
def imports() -> Iterator[None]:
    """Imports in this scope are not cut by Ctrl-C or SIGTERM: a signal waits for their end
    and is raised then (unless the code around handles it later still). A ``KeyboardInterrupt``
    raised while an extension module's C++ runs Python code (torch's pybind11 modules, while
    ``import torch`` runs) ends the process with ``std::terminate`` (SIGABRT, status -6)."""
    with deferred():
        yield
    if _state.deferring == 0 or _state.open > 0:
        _raise_if_pending()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Code that may be stopped anywhere: a pending interrupt is raised on entry, a new one
    at once."""
    _state.open += 1
    try:
        _raise_if_pending()
        yield
    finally:
        _state.open -= 1


def sleep(seconds: float) -> None:
    """``time.sleep`` that Ctrl-C ends at once."""
    with interruptible():
        time.sleep(seconds)


def _raise_if_pending() -> None:
    if _state.pending:
        _state.pending = False
        raise KeyboardInterrupt
