"""The parent's side of a job in processes of its own: start them, receive the replies, and
end them.

With ``--isolate`` a segfault, an abort, a hang or an out-of-memory in the user's code fails
that job only: the child process dies, the parent records why, and the study moves on. The
child re-imports the factory from its spec (``model.py:make_model``), so nothing unpicklable
crosses the process boundary; the job's result comes back through a pipe.

With ``--nproc-per-node N`` a job is done by N such processes, started the way
``torch.multiprocessing.spawn`` starts them, each with the environment torchrun gives a
worker. A launcher of our own rather than torch's elastic agent: a rank that fails is not
restarted behind the search's back (the search retries the run, and records why it failed),
and the ranks share the parent-death, time-limit and Ctrl-C rules of ``--isolate``.

A parent that stops waiting (Ctrl-C, SIGTERM, a time limit, a failed rank) kills every
child.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from scalertune import _interrupt
from scalertune._processes import _policy, _start
from scalertune._processes._blame import Fault, blame
from scalertune._processes._child import child
from scalertune._processes._main_guard import NAMES
from scalertune._processes._protocol import (
    Done,
    Failed,
    Final,
    Job,
    RankFailed,
    Reply,
    TrialCrashed,
)

F = TypeVar("F", bound=Final)

#: Where the search runs under the user's launcher, its crew (``_hosts.Crew`` on rank 0):
#: every job is then run by every rank of it, each in a process of its own host.
_crew: Any = None


def leading() -> bool:
    """Whether this process leads the ranks of the user's launcher (see :func:`lead`)."""
    return _crew is not None


def lead(crew: Any) -> None:
    """Send every later job to ``crew``'s ranks (``None``: this host's own processes)."""
    global _crew
    _crew = crew


def launch(
    job: Job[F],
    *,
    timeout_s: float | None,
    ranks: int = 1,
    progress: Callable[[Reply], None] = lambda _reply: None,
) -> F:
    """``job`` done in a fresh process (``ranks`` of them, one per rank): its result, rank
    0's progress handed to ``progress`` on the way. A failed job raises what its
    :class:`Failed` reply names; a process that died, hung or ran past ``timeout_s`` raises
    :class:`TrialCrashed` (:class:`RankFailed` on ranks)."""
    if _crew is not None:  # the ranks of the user's launcher, across hosts
        return _crew.launch(job, timeout_s, progress)
    for reply in Launch(job, timeout_s, ranks):
        if isinstance(reply, Failed):
            raise reply.exception()
        if isinstance(reply, Final):
            return reply  # type: ignore[return-value]  # a Job[F] returns its F
        progress(reply)
    raise TrialCrashed("the job's processes ended without a result")


#: How a run killed at its time limit is said (every rank of it runs past the limit at once,
#: so no one rank is blamed for it).
TIMED_OUT = "timed out: "


class Launch:
    """The processes doing one job (one, or one per rank with ``ranks`` > 1), and the replies
    rank 0 sends back, in order, up to its result or the run's failure.

    Ranks get the environment torchrun gives its workers (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, a free ``MASTER_PORT``...) and join the process group before the job
    calls the factory. Only rank 0 sends results; every rank sends its failure. The first rank
    to fail, die or hang fails the run: after ``RANK_SETTLE_S`` for the others to report, all
    are killed (which tears the group down) and the failure names the rank to blame
    (:mod:`scalertune._processes._blame`)."""

    def __init__(
        self,
        job: Job[Any],
        timeout_s: float | None,
        ranks: int = 1,
        envs: list[dict[str, str]] | None = None,
    ) -> None:
        """``envs``: each process's rank environment, where another launcher's ranks hold the
        rest of the group (:mod:`scalertune._processes._hosts`); else ``ranks`` of this
        host's own."""
        ctx = _start.context(job.preload)
        self._conns: list[Any] = []
        self._lifelines: list[Any] = []
        self._processes: list[Any] = []
        self._finished = False
        #: Set once the job is over (its processes ended, or being ended).
        self.over = threading.Event()
        #: Whether :meth:`kill` ended the job.
        self.killed = False
        try:
            rank_envs: list[dict[str, str] | None] = (
                list(envs) if envs is not None else _start.rank_envs(ranks)
            )
            for r, env in enumerate(rank_envs):
                conn, end = ctx.Pipe(duplex=False)
                # the child's end reads as closed when this process ends (its lifeline)
                lifeline, held = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=child,
                    args=(end, job, lifeline, env is not None, {**os.environ, **(env or {})}),
                    kwargs={"stdout_to_stderr": sys.stdout is sys.stderr},
                    name=NAMES[0] if env is None else f"{NAMES[1]}{(env or {}).get('RANK', r)}",
                    daemon=True,
                )
                self._conns.append(conn)
                self._lifelines.append(held)
                self._processes.append(process)
                try:
                    with _interrupt.interruptible(), _start.environment(env):
                        process.start()
                finally:
                    end.close()
                    lifeline.close()
        except BaseException:
            self._end()
            raise
        self._live = list(self._conns)
        self._timeout = timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def __iter__(self) -> Iterator[Reply]:
        try:
            while True:
                reply = self._next()
                try:
                    yield reply
                except GeneratorExit:  # the caller has what it needs
                    self._finished = True
                    raise
                if isinstance(reply, (Failed, Final, Done)):
                    self._finished = True
                    break
        finally:
            self._end()

    def _crashed(self, text: str) -> TrialCrashed:
        return (RankFailed if len(self._conns) > 1 else TrialCrashed)(text)

    def _next(self) -> Reply:
        """Rank 0's next reply; the run's failure as a :class:`Failed` reply (one rank's
        exception) or :class:`TrialCrashed` (a rank that died or hung)."""
        while True:
            left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            with _interrupt.interruptible():
                ready = multiprocessing.connection.wait(self._live, left)
            if not ready:
                raise self._crashed(
                    f"{TIMED_OUT}the trial ran past its {self._timeout:g} s "
                    "limit (--trial-timeout) and was killed"
                )
            for conn in ready:
                r, reply = self._conns.index(conn), self._receive(conn)
                if reply is None or isinstance(reply, Failed):
                    return self._failed({r: reply})
                if r == 0 and not isinstance(reply, Done):
                    return reply
                if not self._live:  # every process here finished its part: rank 0 is elsewhere
                    return reply
                # a rank past rank 0 that finished its part: it exits now

    def _receive(self, conn: Any) -> Reply | None:
        """The next reply on ``conn``; None when its process ended without one."""
        try:
            reply: Reply | None = conn.recv()
        except EOFError:  # the process died: its status is known once it is reaped
            reply = None
            self._processes[self._conns.index(conn)].join(timeout=_policy.RANK_SETTLE_S)
        if not isinstance(reply, Reply) or isinstance(reply, (Done, Final, Failed)):
            self._live.remove(conn)
        return reply

    def _failed(self, failures: dict[int, Failed | None]) -> Failed:
        """Wait ``RANK_SETTLE_S`` for the other ranks' reports (a rank that dies makes its
        peers' collectives fail at once), kill them all, and name the rank to blame."""
        until = time.monotonic() + (_policy.RANK_SETTLE_S if len(self._conns) > 1 else 0)
        while self._live and time.monotonic() < until:
            with _interrupt.interruptible():
                ready = multiprocessing.connection.wait(
                    self._live, max(0.0, until - time.monotonic())
                )
            for conn in ready:
                reply = self._receive(conn)
                if reply is None or isinstance(reply, Failed):
                    failures[self._conns.index(conn)] = reply
        self._end()
        # Ctrl-C or SIGTERM sent to the whole process group may have killed the processes
        # first: then the run did not fail, the search was stopped.
        _interrupt.checkpoint()
        silent = [r for r, c in enumerate(self._conns) if r not in failures and c in self._live]
        blamed = blame(failures, [p.exitcode for p in self._processes], silent)
        if isinstance(blamed, Fault):
            raise self._crashed(blamed.text)
        return blamed

    def kill(self) -> None:
        """End the job's processes now, from any thread (a peer on another host failed):
        the thread that iterates gets their deaths as a failure."""
        self.killed = True
        for process in self._processes:
            if process.pid is not None and process.is_alive():
                process.kill()

    def _end(self) -> None:
        """Close the pipes; a process that sent its last reply is exiting, one still at work
        (Ctrl-C, SIGTERM, a time limit, a failed peer) is killed now."""
        for process in self._processes:
            if process.pid is not None:  # started
                process.join(timeout=5 if self._finished else 0)
                if process.is_alive():
                    process.kill()
                    process.join()
        for conn in self._conns + self._lifelines:
            conn.close()
