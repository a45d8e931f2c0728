"""Starting a run's processes: one (``--isolate``), or one per rank (``--nproc-per-node``).

With ``--isolate`` a segfault, an abort, a hang or an out-of-memory in the user's code fails
that trial only: the child process dies, the parent records why, and the study moves on. The
child re-imports the factory from its spec (``model.py:make_model``), so nothing unpicklable
crosses the process boundary; the finished :class:`RunRecord` comes back through a pipe.

With ``--nproc-per-node N`` a run is N such processes, started the way
``torch.multiprocessing.spawn`` starts them, each with the environment torchrun gives a
worker: they join one ``torch.distributed`` process group before the factory is called
(:mod:`scalertune._run._ranks`). Rank 0 sends the record; every rank sends its error. A
launcher of our own rather than torch's elastic agent: a rank that fails is not restarted
behind the search's back (the search retries the run, and records why it failed), and the
ranks share the parent-death, time-limit and Ctrl-C rules of ``--isolate``.

Where the platform has it (Linux, macOS), the processes are forked from a server that
imported torch and the run's modules once (``multiprocessing``'s forkserver): a process starts
in a fraction of a second instead of importing torch again (seconds, twice a run on two
ranks). It gets the search's environment as it is when the run starts, as a spawned process
does. Elsewhere they are spawned.

What the user's code prints in a child goes where the search's own ``sys.stdout`` goes when
the run starts: the command line sends it to stderr, so that stdout holds the summary alone.

A child never outlives its parent, even one killed by SIGKILL: it watches a pipe that only
the parent holds open, and on Linux the kernel also kills a spawned child with its parent
(``PR_SET_PDEATHSIG``). A parent that stops waiting
(Ctrl-C, SIGTERM, a time limit, a failed rank) kills every child. The child ignores Ctrl-C,
which a terminal sends to the whole process group: the parent decides what it stops.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeGuard

import torch

from scalertune import _interrupt, _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedCheckpoint, MissingEvidence, UsageError
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord, StopRule
from scalertune._run._timing import StepTimes
from scalertune._search import _policy as _search_policy
from scalertune._storage._outage import Outage


class TrialCrashed(Exception):
    """The run's process died, timed out or ran out of memory, or the run called sys.exit()."""


class RankFailed(TrialCrashed):
    """One rank of a run died or hung: a fault of one process, evidence the run could not
    give, retried (never a verdict on the config)."""


def exited(exc: SystemExit) -> str:
    return f"the workload called sys.exit({exc.code!r}) during the run"


def describe_error(exc: BaseException) -> str:
    """One line for an exception from user code, naming out-of-memory as such."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in first:
        return f"CUDA out of memory: {first}"
    if (
        isinstance(exc, MemoryError)
        or "can't allocate memory" in first
        or ("not enough memory" in first)
    ):
        return f"out of memory: {first or type(exc).__name__}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_isolated(
    spec: str | Callable[[], Any],
    config: AmpConfig,
    *,
    steps: int,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    plan: Plan | None = None,
    stop: StopRule | None = None,
    ranks: int = 1,
) -> RunRecord:
    """``run_config`` in a fresh process (``ranks`` of them, one per rank);
    :class:`TrialCrashed` if one fails. ``plan`` and ``stop`` cross to it as they are (its
    watcher is attached there, and what it recorded comes back in the record; the stop rule
    is asked after each window there, so the run stops where it would in this process: on
    ranks every rank asks it of the same losses, those of the global batch, and all stop
    at the same window)."""
    job = ("run", spec, config.to_dict(), steps, seed, str(device), memory_gb, (plan, stop))
    for kind, payload in _Child(job, timeout_s, ranks):
        if kind == "error":
            raise TrialCrashed(payload)
        if kind == "missing":
            raise MissingEvidence(payload)
        if kind == "damaged":
            raise DamagedCheckpoint(payload)
        if kind == "usage":
            raise UsageError(payload)
        if kind == "outage":
            raise Outage(payload)
        if kind == "record":
            return payload
    raise TrialCrashed("the trial's process ended without a result")


def locate_isolated(
    spec: str | Callable[[], Any],
    config: AmpConfig,
    losses: list[float],
    *,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    ranks: int = 1,
) -> Any:
    """``locate_forward_overflow`` of a pruned run, in a fresh process (one per rank);
    :class:`TrialCrashed` if one fails."""
    job = ("locate", spec, config.to_dict(), list(losses), seed, str(device), memory_gb, None)
    for kind, payload in _Child(job, timeout_s, ranks):
        if kind == "error":
            raise TrialCrashed(payload)
        return payload
    raise TrialCrashed("the process locating the overflow sent nothing")


def time_isolated(
    spec: str | Callable[[], Any],
    dtypes: Sequence[str],
    *,
    clip_norm: float | None,
    seed: int,
    device: torch.device,
    timeout_s: float | None,
    memory_gb: float | None,
    ranks: int = 1,
    log: Callable[[str], None] = lambda _line: None,
) -> StepTimes | None:
    """The step timing (:func:`scalertune._timing.time_dtypes`) in a fresh process, on a
    fresh workload. A rank that dies or hangs is a fault of one process: the timing runs
    again, ``MAX_RETRIES`` times at most. A dtype whose kernels kill the process (an abort,
    a hang past ``timeout_s``, out of memory) is left out and the others are timed again in
    another; ``None`` when even float32 cannot be timed. What is left out, and why, is said
    through ``log``, one line each."""
    left, again = list(dtypes), 0
    while True:
        running = None
        try:
            for kind, payload in _Child(
                ("time", spec, None, 0, seed, str(device), memory_gb, (left, clip_norm)),
                timeout_s,
                ranks,
            ):
                if kind in _FAILURES:
                    log(f"the step timing failed: {payload.splitlines()[0]}: speed not measured")
                    return None
                if kind == "dtype":
                    running = payload
                elif kind == "times":
                    return payload
        except TrialCrashed as exc:
            why = str(exc).splitlines()[0]
            if isinstance(exc, RankFailed) and again < _policy.MAX_RETRIES:
                again += 1
                log(f"the step timing: {why}; run again")
                continue
            if running in (None, "float32"):
                log(f"the step timing failed: {why}: speed not measured")
                return None
            log(f"the step timing of {running}: {why}: {running} left out")
            left = [d for d in left if d != running]


#: What a process sends when its job failed (``peer``: a collective broke under it because
#: another rank failed or hung; ``missing``, ``outage``: evidence it could not get, which is
#: not the run's failure).
_FAILURES = ("error", "usage", "peer", "missing", "outage")


class _Child:
    """The spawned processes running one job (one, or one per rank with ``ranks`` > 1), and
    the messages rank 0 sends back, in order.

    Ranks get the environment torchrun gives its workers (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, a free ``MASTER_PORT``...) and join the process group before the job
    calls the factory. Only rank 0 sends results; every rank sends its error. The first rank
    to fail, die or hang fails the run: after ``RANK_SETTLE_S`` for the others to report, all
    are killed (which tears the group down) and the failure names the rank to blame."""

    def __init__(self, job: tuple[Any, ...], timeout_s: float | None, ranks: int = 1) -> None:
        ctx = _context()
        self._conns: list[Any] = []
        self._lifelines: list[Any] = []
        self._processes: list[Any] = []
        self._finished = False
        try:
            for r, env in enumerate(_rank_envs(ranks)):
                conn, child = ctx.Pipe(duplex=False)
                # the child's end reads as closed when this process ends (_die_with_parent)
                lifeline, held = ctx.Pipe(duplex=False)
                name = _NAMES[0] if ranks == 1 else f"{_NAMES[1]}{r}"
                environ = {**os.environ, **(env or {})}
                process = ctx.Process(
                    target=_child,
                    args=(child, job, lifeline, env, environ, sys.stdout is sys.stderr),
                    name=name,
                    daemon=True,
                )
                self._conns.append(conn)
                self._lifelines.append(held)
                self._processes.append(process)
                try:
                    with _interrupt.interruptible(), _environment(env):
                        process.start()
                finally:
                    child.close()
                    lifeline.close()
        except BaseException:
            self._end()
            raise
        self._live = list(self._conns)
        self._timeout = timeout_s
        self.restart_clock()

    def restart_clock(self) -> None:
        self._deadline = None if self._timeout is None else time.monotonic() + self._timeout

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        try:
            while True:
                message = self._next()
                try:
                    yield message
                except GeneratorExit:  # the caller has what it needs
                    self._finished = True
                    raise
                if message[0] in _FAILURES + ("times", "record", "advice", "checked"):
                    self._finished = True
                    break
        finally:
            self._end()

    def _next(self) -> tuple[str, Any]:
        """Rank 0's next message; the run's failure as an ``error`` message (one rank's
        exception) or :class:`TrialCrashed` (a rank that died or hung)."""
        while True:
            left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            with _interrupt.interruptible():
                ready = multiprocessing.connection.wait(self._live, left)
            if not ready:
                raise (RankFailed if len(self._conns) > 1 else TrialCrashed)(
                    f"timed out: the trial ran past its {self._timeout:g} s "
                    "limit (--trial-timeout) and was killed"
                )
            for conn in ready:
                r, message = self._conns.index(conn), self._receive(conn)
                if message is None or message[0] in _FAILURES:
                    return self._failed({r: message})
                if r == 0 and message[0] != "done":
                    return message
                # a rank past rank 0 that finished its part: it exits now

    def _receive(self, conn: Any) -> tuple[str, Any] | None:
        """The next message on ``conn``; None when its process ended without one."""
        try:
            message: tuple[str, Any] = conn.recv()
        except EOFError:  # the process died: its status is known once it is reaped
            message = None  # type: ignore[assignment]
            self._processes[self._conns.index(conn)].join(timeout=_search_policy.RANK_SETTLE_S)
        if message is None or message[0] == "done" or message[0] in _FAILURES:
            self._live.remove(conn)
        return message

    def _failed(self, failures: dict[int, tuple[str, Any] | None]) -> tuple[str, Any]:
        """Wait ``RANK_SETTLE_S`` for the other ranks' reports (a rank that dies makes its
        peers' collectives fail at once), kill them all, and name the rank to blame."""
        until = time.monotonic() + (_search_policy.RANK_SETTLE_S if len(self._conns) > 1 else 0)
        while self._live and time.monotonic() < until:
            with _interrupt.interruptible():
                ready = multiprocessing.connection.wait(
                    self._live, max(0.0, until - time.monotonic())
                )
            for conn in ready:
                message = self._receive(conn)
                if message is None or message[0] != "done":
                    failures[self._conns.index(conn)] = message
        self._end()
        # Ctrl-C or SIGTERM sent to the whole process group may have killed the processes
        # first: then the run did not fail, the search was stopped.
        _interrupt.checkpoint()
        kind, text = self._blame(failures)
        if kind in ("died", "hung"):
            raise (RankFailed if len(self._conns) > 1 else TrialCrashed)(text)
        return kind, text

    def _blame(self, failures: dict[int, tuple[str, Any] | None]) -> tuple[str, str]:
        """The failure to report: a rank that died, else one whose own code failed, else a
        rank that stayed silent while a peer's collective timed out (it hung), else the
        first collective error."""
        n = len(self._conns)

        def who(r: int) -> str:
            return "" if n == 1 else f"rank {r} of {n}: "

        for r, message in sorted(failures.items()):
            if message is None and self._processes[r].exitcode == REENTERED_STATUS:
                main = sys.modules.get("__main__")
                raise _reentered(os.path.basename(getattr(main, "__file__", None) or "your script"))
            if message is None:
                return "died", who(r) + _death(self._processes[r].exitcode)
        for r, message in sorted(failures.items()):
            if message is not None and message[0] != "peer":
                return message[0], who(r) + message[1]
        first, (_, text) = min(failures.items())  # type: ignore[misc]
        silent = [r for r in range(n) if r not in failures and self._conns[r] in self._live]
        if silent:
            return "hung", (
                f"rank {silent[0]} of {n} hung: rank {first}'s collective gave "
                f"up waiting for it ({text.splitlines()[0]})"
            )
        return "error", who(first) + text

    def _end(self) -> None:
        """Close the pipes; a process that sent its last message is exiting, one still at
        work (Ctrl-C, SIGTERM, a time limit, a failed peer) is killed now."""
        for process in self._processes:
            if process.pid is not None:  # started
                process.join(timeout=5 if self._finished else 0)
                if process.is_alive():
                    process.kill()
                    process.join()
        for conn in self._conns + self._lifelines:
            conn.close()


#: How this module starts processes: ``forkserver`` where the platform has it, else
#: ``spawn`` (``benchmarks/launch_cost.py`` sets it to compare the two).
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

#: What the server imports once, before it forks a run's processes: torch (with the compiler
#: stack that every optimizer's constructor imports) and the modules a job runs. Never the
#: user's code, which each process imports from its spec, nor anything that starts CUDA.
_PRELOAD = [
    "torch",
    "torch._dynamo",
    "scalertune._search._launch",
    "scalertune._run._loop",
    "scalertune._run._ranks",
    "scalertune._run._timing",
    "scalertune._workload._factory",
    "scalertune._workload._loader",
]


def _context() -> Any:
    ctx = multiprocessing.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts (the first run)
    return ctx


def _adopt(environ: dict[str, str]) -> None:
    """The search's environment as it was when this run started (a process forked from the
    server has the server's, from when the server started). torch read OMP_NUM_THREADS when
    the server imported it: the thread count is set again from the run's."""
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    """``env`` in this process's environment while a child starts (a spawned child's
    environment is a copy of it), so that the rank's interpreter starts with it, as under
    torchrun: torch reads OMP_NUM_THREADS when it loads, before any code of ours runs."""
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _rank_envs(ranks: int) -> list[dict[str, str] | None]:
    """What torchrun puts in each worker's environment, for ``ranks`` ranks on this host
    (``None``: one process, no group). OMP_NUM_THREADS is 1 unless set, as torchrun sets it,
    so that N ranks do not each take every core."""
    if ranks == 1:
        return [None]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = {
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    return [{**common, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(ranks)]


#: The status a process this module started exits with when, as it starts, the user's script
#: it imports again (a spawned process imports ``__main__`` anew) calls scalertune again: the
#: script has no ``if __name__ == "__main__":`` guard around that call.
REENTERED_STATUS = 86

#: The names of the processes this module starts (``_Child``).
_NAMES = ("scalertune-trial", "scalertune-rank")


def refuse_reentry() -> None:
    """In a process this module started, a search or diagnosis called again as the user's
    script is imported anew: end the process at once with ``REENTERED_STATUS``, which the
    parent turns into one line saying to guard the call, instead of a nested search (or each
    rank refusing itself as run by a launcher)."""
    if multiprocessing.current_process().name.startswith(_NAMES):
        os._exit(REENTERED_STATUS)


def refuse_unguarded() -> None:
    """Before a search starts processes: a script that calls it from its top-level code
    outside an ``if __name__ == "__main__":`` block would run it again in every process (each
    imports the script anew), so it is refused in one line now, before anything is written.
    Read from where the script's top-level code stands in its source; a script that cannot
    be read (an interactive session, a frozen program) is left to :func:`refuse_reentry`."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if main is None or not path or not str(path).endswith(".py") or spec_name.endswith(".__main__"):
        return  # (``python -m package`` runs package/__main__.py, which a process does not import)
    frame: Any = sys._getframe(1)  # noqa: SLF001 - the standard way to walk the stack
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    guards = [node for node in ast.walk(tree) if _is_main_guard(node)]
    if not any(node.lineno <= line <= (node.end_lineno or line) for node in guards):
        raise _reentered(os.path.basename(path))


def _is_main_guard(node: ast.AST) -> TypeGuard[ast.If]:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {n.id for n in sides if isinstance(n, ast.Name)}
    values = {n.value for n in sides if isinstance(n, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


def _reentered(script: str) -> UsageError:
    return UsageError(
        f'{script} calls scalertune outside an if __name__ == "__main__": block, and each '
        "process the search starts (--isolate, --nproc-per-node) imports the script again "
        "and would run it again: put the call under that block"
    )


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        if name == "SIGKILL":
            return (
                "the trial's process was killed (SIGKILL), most often by the operating "
                "system for running out of memory"
            )
        return f"the trial's process died with {name} (a crash in native code)"
    return f"the trial's process exited with status {exitcode} without a result"


def _die_with_parent(lifeline: Any) -> None:
    """End this process when the search's process ends, however that ends (even SIGKILL): a
    thread waits on ``lifeline``, a pipe only that process holds open, which reads as closed
    the moment it ends. On Linux the kernel also ends the process with its own parent
    (``PR_SET_PDEATHSIG``): the search's process when spawned, the server when forked."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv_bytes()  # nothing is ever sent: this returns when the search ends
        os._exit(1)

    threading.Thread(target=watch, name="scalertune-parent-watch", daemon=True).start()


def _child(
    conn: Any,
    job: tuple[Any, ...],
    lifeline: Any,
    env: dict[str, str] | None,
    environ: dict[str, str],
    stdout_to_stderr: bool = False,
) -> None:
    _die_with_parent(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _adopt(environ)
    if stdout_to_stderr:  # the search's stdout is its summary's: the user's prints go aside
        sys.stdout.flush()
        os.dup2(2, 1)
    kind, spec, config, steps, seed, device, memory_gb, extra = job
    if memory_gb is not None:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = conn
    try:
        from scalertune._run import _ranks

        if env is not None:
            device = str(_ranks.join(device))
            if _ranks.rank() != 0:
                out = _Quiet(conn)
        _job(out, kind, spec, config, steps, seed, device, extra)
        if out is not conn:
            conn.send(("done", None))
    except SystemExit as exc:
        conn.send(("error", exited(exc)))
    except UsageError as exc:
        conn.send(("usage", str(exc)))
    except DamagedCheckpoint as exc:  # the checkpoint the run reads: passed over
        conn.send(("damaged", str(exc)))
    except MissingEvidence as exc:  # a checkpoint the run reads or writes: not its failure
        conn.send(("missing", str(exc)))
    except Outage as exc:
        conn.send(("outage", str(exc)))
    except BaseException as exc:  # everything the user's code can throw goes back as text
        kind = "peer" if _collective_failure(exc) else "error"
        conn.send((kind, describe_error(exc) + "\n" + traceback.format_exc()[-3000:]))
    else:
        _ranks.leave()
        return
    finally:
        conn.close()
    if env is not None:
        # A rank whose job failed leaves its group up (a peer may be gone: tearing it down
        # could wait on it); ending here skips the C++ destructors of gloo's threads, which
        # would abort the interpreter's exit with "terminate called without an active
        # exception". Its report is sent; the parent reads no status from it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that broke because a peer failed first or hung (gloo
    raises a plain RuntimeError from its sources; NCCL's watchdog names itself)."""
    text = str(exc)
    return isinstance(exc, torch.distributed.DistError) or "/gloo/" in text or "NCCL" in text


class _Quiet:
    """A rank past rank 0: what the job reports stays in the rank (rank 0 reports it)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def send(self, message: tuple[str, Any]) -> None:
        pass


def _job(
    conn: Any, kind: str, spec: Any, config: Any, steps: Any, seed: int, device: str, extra: Any
) -> None:
    from scalertune._run._loop import run_config
    from scalertune._run._timing import time_dtypes
    from scalertune._workload._factory import build_workload
    from scalertune._workload._loader import load_factory

    factory, dev = load_factory(spec), torch.device(device)
    if kind == "time":
        dtypes, clip = extra
        workload = build_workload(factory, seed=seed, device=dev)
        conn.send(
            (
                "times",
                time_dtypes(
                    workload,
                    dtypes,
                    device=dev,
                    clip_norm=clip,
                    announce=lambda d: conn.send(("dtype", d)),
                ),
            )
        )
    elif kind == "locate":  # a forward overflow's replay (``steps`` holds the losses)
        from scalertune._diagnose._locate import locate_forward_overflow

        conn.send(
            (
                "advice",
                locate_forward_overflow(
                    factory, AmpConfig.from_dict(config), steps, seed=seed, device=dev
                ),
            )
        )
    elif kind == "preflight":  # ``extra`` holds the islands
        from scalertune._run._preflight import preflight

        conn.send(("checked", preflight(factory, device=dev, seed=seed, islands=extra)))
    else:
        plan, stop = extra
        conn.send(
            (
                "record",
                run_config(
                    factory,
                    AmpConfig.from_dict(config),
                    steps=steps,
                    plan=plan,
                    stop=stop,
                    seed=seed,
                    device=dev,
                ),
            )
        )


def preflight_ranks(
    spec: str | Callable[[], Any],
    *,
    device: torch.device,
    seed: int,
    islands: set[str],
    timeout_s: float | None,
    ranks: int,
) -> Any:
    """``preflight`` (one float32 step) in every rank; :class:`UsageError` as a rank raised
    it, a failure of the factory as :class:`FactoryError`."""
    from scalertune._workload._loader import FactoryError

    job = ("preflight", spec, None, 0, seed, str(device), None, set(islands))
    for kind, payload in _Child(job, timeout_s, ranks):
        if kind == "usage":
            raise UsageError(payload)
        if kind == "error":
            raise FactoryError(payload.splitlines()[0])
        return payload
    raise UsageError("the ranks checking the factory sent nothing")
