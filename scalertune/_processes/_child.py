"""A job's process, from its start to its last reply.

A child never outlives its parent, even one killed by SIGKILL: it watches a pipe that only
the parent holds open, and on Linux the kernel also kills a spawned child with its parent
(``PR_SET_PDEATHSIG``). The child ignores Ctrl-C, which a terminal sends to the whole process
group: the parent decides what it stops. What the user's code prints in a child goes where
the parent's own ``sys.stdout`` goes when the job starts: the command line sends it to
stderr, so that stdout holds the summary alone.

On ranks, each process joins the ``torch.distributed`` group before the job calls the
user's factory (:mod:`scalertune._run._ranks`). Rank 0 sends the job's replies; every rank
sends its failure, or :class:`~scalertune._processes._protocol.Done` when its part is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from typing import Any

import torch

from scalertune._errors import DamagedCheckpoint, MissingEvidence, UsageError
from scalertune._processes._protocol import (
    Done,
    Failed,
    FailureKind,
    Job,
    Reply,
    describe_error,
    exited,
)
from scalertune._storage._outage import Outage


def child(
    conn: Any,
    job: Job[Any],
    lifeline: Any,
    ranked: bool,
    environ: dict[str, str],
    stdout_to_stderr: bool = False,
) -> None:
    """The process's target: ``job`` done, on a rank of a group when ``ranked``, and what came
    of it sent on ``conn``."""
    _die_with_parent(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    adopt(environ)
    if stdout_to_stderr:  # the parent's stdout is its summary's: the user's prints go aside
        sys.stdout.flush()
        os.dup2(2, 1)
    if job.memory_gb is not None:
        import resource

        limit = int(job.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        from scalertune._run import _ranks

        device, first = job.device, True
        if ranked:
            device = str(_ranks.join(device))
            first = _ranks.rank() == 0
        result = job.perform(conn.send if first else _drop, device)
        conn.send(result if first else Done())
    except BaseException as exc:  # everything the user's code can throw goes back as text
        conn.send(failure(exc))
    else:
        _ranks.leave()
        return
    finally:
        conn.close()
    if ranked:
        # A rank whose job failed leaves its group up (a peer may be gone: tearing it down
        # could wait on it); ending here skips the C++ destructors of gloo's threads, which
        # would abort the interpreter's exit with "terminate called without an active
        # exception". Its report is sent; the parent reads no status from it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _drop(reply: Reply) -> None:
    """A rank past rank 0: what the job reports stays in the rank (rank 0 reports it)."""


#: The failures a job's own errors are sent back as (the first match, in order).
_KINDS: tuple[tuple[type[BaseException], FailureKind], ...] = (
    (UsageError, "usage"),
    (DamagedCheckpoint, "damaged"),  # the checkpoint the run reads: passed over
    (MissingEvidence, "missing"),  # a checkpoint the run reads or writes: not its failure
    (Outage, "outage"),
)


def failure(exc: BaseException) -> Failed:
    """What the parent is told of ``exc``."""
    if isinstance(exc, SystemExit):
        return Failed("error", exited(exc))
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return Failed(kind, str(exc))
    kind = "peer" if _collective_failure(exc) else "error"
    return Failed(kind, describe_error(exc) + "\n" + traceback.format_exc()[-3000:])


def _collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that broke because a peer failed first or hung (gloo
    raises a plain RuntimeError from its sources; NCCL's watchdog names itself)."""
    text = str(exc)
    return isinstance(exc, torch.distributed.DistError) or "/gloo/" in text or "NCCL" in text


def adopt(environ: dict[str, str]) -> None:
    """The parent's environment as it was when this job started (a process forked from the
    server has the server's, from when the server started). torch read OMP_NUM_THREADS when
    the server imported it: the thread count is set again from the job's."""
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def _die_with_parent(lifeline: Any) -> None:
    """End this process when the parent ends, however that ends (even SIGKILL): a thread waits
    on ``lifeline``, a pipe only the parent holds open, which reads as closed the moment it
    ends. On Linux the kernel also ends the process with its own parent
    (``PR_SET_PDEATHSIG``): the job's parent when spawned, the server when forked."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv_bytes()  # nothing is ever sent: this returns when the parent ends
        os._exit(1)

    threading.Thread(target=watch, name="scalertune-parent-watch", daemon=True).start()
