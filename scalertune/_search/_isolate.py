"""Running one trial in its own process, with a time limit and an optional memory limit.

With ``--isolate`` a segfault, an abort, a hang or an out-of-memory in the user's code fails
that trial only: the child process dies, the parent records why, and the study moves on. The
child re-imports the factory from its spec (``model.py:make_model``), so nothing unpicklable
crosses the process boundary; the finished :class:`RunRecord` comes back through a pipe.
Every run of an isolated search goes this way: the float32 references, the step timing, the
trials, and the replay that locates a forward overflow.

A child never outlives its parent: on Linux the kernel kills it when the parent dies, even by
SIGKILL (``PR_SET_PDEATHSIG``); elsewhere it watches its parent. A parent that stops waiting
(Ctrl-C, SIGTERM, a time limit) kills it. The child ignores Ctrl-C, which a terminal sends to
the whole process group: the parent decides what it stops.

Runs in the search's own process go through :func:`run_here`: Ctrl-C stops them anywhere
(``_interrupt``), and a ``sys.exit()`` in the user's code fails the run instead of ending the
search with a trial left running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from scalertune import _interrupt
from scalertune._amp._config import AmpConfig
from scalertune._errors import MissingEvidence
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord
from scalertune._run._timing import StepTimes
from scalertune._search._setup import Setup
from scalertune._storage._outage import Outage

_T = TypeVar("_T")


class TrialCrashed(Exception):
    """The run's process died, timed out or ran out of memory, or the run called sys.exit()."""


def run_here(run: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``run(*args, **kwargs)``, a run of the user's code in this process: Ctrl-C stops it at
    once, and ``sys.exit()`` in it raises :class:`TrialCrashed`."""
    try:
        with _interrupt.interruptible():
            return run(*args, **kwargs)
    except SystemExit as exc:
        raise TrialCrashed(_exited(exc)) from None
    except (KeyboardInterrupt, Exception):
        raise
    except BaseException as exc:  # a class the user's code derived from BaseException
        raise RuntimeError(describe_error(exc)) from exc


def _exited(exc: SystemExit) -> str:
    return f"the workload called sys.exit({exc.code!r}) during the run"


def describe_error(exc: BaseException) -> str:
    """One line for an exception from user code, naming out-of-memory as such."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in first:
        return f"CUDA out of memory: {first}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in first or (
            "not enough memory" in first):
        return f"out of memory: {first or type(exc).__name__}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_isolated(spec: str | Callable[[], Any], config: AmpConfig, *, steps: int, seed: int,
                 device: torch.device, timeout_s: float | None,
                 memory_gb: float | None, plan: Plan | None = None) -> RunRecord:
    """``run_config`` in a fresh process; :class:`TrialCrashed` if that process fails.
    ``plan`` crosses to it as it is (its watcher is attached there, and what it recorded comes
    back in the record)."""
    job = ("run", spec, config.to_dict(), steps, seed, str(device), memory_gb, plan)
    for kind, payload in _Child(job, timeout_s):
        if kind == "error":
            raise TrialCrashed(payload)
        if kind == "missing":
            raise MissingEvidence(payload)
        if kind == "outage":
            raise Outage(payload)
        if kind == "record":
            return payload
    raise TrialCrashed("the trial's process ended without a result")


def locate_isolated(spec: str | Callable[[], Any], config: AmpConfig, losses: list[float], *,
                    seed: int, device: torch.device, timeout_s: float | None,
                    memory_gb: float | None) -> Any:
    """``locate_forward_overflow`` of a pruned run, in a fresh process; :class:`TrialCrashed`
    if that process fails."""
    job = ("locate", spec, config.to_dict(), list(losses), seed, str(device), memory_gb, None)
    for kind, payload in _Child(job, timeout_s):
        if kind == "error":
            raise TrialCrashed(payload)
        return payload
    raise TrialCrashed("the process locating the overflow sent nothing")


def time_isolated(spec: str | Callable[[], Any], dtypes: Sequence[str], *,
                  clip_norm: float | None, seed: int, device: torch.device,
                  timeout_s: float | None, memory_gb: float | None) -> StepTimes | None:
    """The step timing (:func:`scalertune._timing.time_dtypes`) in a fresh process, on a
    fresh workload. A dtype whose kernels kill the process (an abort, a hang past
    ``timeout_s``, out of memory) is left out and the others are timed again in another;
    ``None`` when even float32 cannot be timed."""
    left = list(dtypes)
    while True:
        running = None
        try:
            for kind, payload in _Child(("time", spec, None, 0, seed, str(device), memory_gb,
                                         (left, clip_norm)), timeout_s):
                if kind == "error":
                    return None
                if kind == "dtype":
                    running = payload
                elif kind == "times":
                    return payload
        except TrialCrashed:
            if running in (None, "float32"):
                return None
            left = [d for d in left if d != running]


class _Child:
    """A spawned process running one job, and the messages it sends back, in order."""

    def __init__(self, job: tuple[Any, ...], timeout_s: float | None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_child, args=(child, job, os.getpid()),
                                    name="scalertune-trial", daemon=True)
        self._finished = False
        try:
            with _interrupt.interruptible():
                self._process.start()
        finally:
            child.close()
        self._timeout = timeout_s
        self.restart_clock()

    def restart_clock(self) -> None:
        self._deadline = None if self._timeout is None else time.monotonic() + self._timeout

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        try:
            while True:
                left = (None if self._deadline is None
                        else max(0.0, self._deadline - time.monotonic()))
                with _interrupt.interruptible():
                    ready = self._conn.poll(left)
                if not ready:
                    raise TrialCrashed(f"timed out: the trial ran past its {self._timeout:g} s "
                                       "limit (--trial-timeout) and was killed")
                try:
                    message = self._conn.recv()
                except EOFError:
                    self._process.join()
                    # Ctrl-C or SIGTERM sent to the whole process group may have killed the
                    # child first: then the run did not fail, the search was stopped.
                    _interrupt.checkpoint()
                    raise TrialCrashed(_death(self._process.exitcode)) from None
                try:
                    yield message
                except GeneratorExit:  # the caller has what it needs
                    self._finished = True
                    raise
                if message[0] in ("error", "missing", "outage", "times", "record", "advice"):
                    self._finished = True
                    break
        finally:
            self._conn.close()
            if self._process.pid is not None:  # started
                # A child that sent its last message is exiting; one still at work (Ctrl-C,
                # SIGTERM, a time limit) is killed now.
                self._process.join(timeout=5 if self._finished else 0)
                if self._process.is_alive():
                    self._process.kill()
                    self._process.join()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        if name == "SIGKILL":
            return ("the trial's process was killed (SIGKILL), most often by the operating "
                    "system for running out of memory")
        return f"the trial's process died with {name} (a crash in native code)"
    return f"the trial's process exited with status {exitcode} without a result"


def _die_with_parent(parent_pid: int) -> None:
    """Make this process end when ``parent_pid`` does, however that ends (even SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    else:
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="scalertune-parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _child(conn: Any, job: tuple[Any, ...], parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kind, spec, config, steps, seed, device, memory_gb, extra = job
    if memory_gb is not None:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        from scalertune._run._loop import run_config
        from scalertune._run._timing import time_dtypes
        from scalertune._workload._factory import build_workload
        from scalertune._workload._loader import load_factory

        factory, dev = load_factory(spec), torch.device(device)
        if kind == "time":
            dtypes, clip = extra
            workload = build_workload(factory, seed=seed, device=dev)
            conn.send(("times", time_dtypes(workload, dtypes, device=dev, clip_norm=clip,
                                            announce=lambda d: conn.send(("dtype", d)))))
        elif kind == "locate":  # a forward overflow's replay (``steps`` holds the losses)
            from scalertune._diagnose._locate import locate_forward_overflow

            conn.send(("advice", locate_forward_overflow(
                factory, AmpConfig.from_dict(config), steps, seed=seed, device=dev)))
        else:
            conn.send(("record", run_config(factory, AmpConfig.from_dict(config), steps=steps,
                                            plan=extra,
                                            seed=seed, device=dev)))
    except SystemExit as exc:
        conn.send(("error", _exited(exc)))
    except MissingEvidence as exc:  # a checkpoint the run reads or writes: not its failure
        conn.send(("missing", str(exc)))
    except Outage as exc:
        conn.send(("outage", str(exc)))
    except BaseException as exc:  # everything the user's code can throw goes back as text
        conn.send(("error", describe_error(exc) + "\n" + traceback.format_exc()[-3000:]))
    finally:
        conn.close()


def execute(setup: Setup, config: AmpConfig, *, steps: int, seed: int,
            plan: Plan | None = None, stop: Any = None,
            on_window: Any = None) -> RunRecord:
    """Train ``config`` where the search's runs execute: in this process, or in a fresh one
    with ``--isolate`` (whose record comes back whole, after the run; a stop rule and the
    per-window callback then see only that)."""
    if setup.isolation is not None:
        record = run_isolated(setup.spec, config, steps=steps, seed=seed, device=setup.device,
                              timeout_s=setup.isolation.timeout_s,
                              memory_gb=setup.isolation.memory_gb, plan=plan)
        if on_window is not None:
            on_window(record, 0)
        return record
    from scalertune._run._loop import run_config

    return run_here(run_config, setup.factory, config, steps=steps, seed=seed,
                    device=setup.device, stop=stop, on_window=on_window, plan=plan)
