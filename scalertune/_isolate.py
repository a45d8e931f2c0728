"""Running one trial in its own process, with a time limit and an optional memory limit.

With ``--isolate`` a segfault, an abort, a hang or an out-of-memory in the user's code fails
that trial only: the child process dies, the parent records why, and the study moves on. The
child re-imports the factory from its spec (``model.py:make_model``), so nothing unpicklable
crosses the process boundary; the finished :class:`RunRecord` comes back through a pipe.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from typing import Any

import torch

from scalertune._config import AmpConfig
from scalertune._run import RunRecord


class TrialCrashed(Exception):
    """The isolated trial's process died, timed out or ran out of memory."""


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


def run_isolated(spec: str, config: AmpConfig, *, steps: int, seed: int, device: torch.device,
                 timeout_s: float | None, memory_gb: float | None) -> RunRecord:
    """``run_config`` in a fresh process; :class:`TrialCrashed` if that process fails."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_child,
        args=(child, spec, config.to_dict(), steps, seed, str(device), memory_gb),
        name="scalertune-trial", daemon=True,
    )
    process.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            process.kill()
            process.join()
            raise TrialCrashed(f"timed out: the trial ran past its {timeout_s:g} s limit "
                               "(--trial-timeout) and was killed")
        try:
            status, payload = parent.recv()
        except EOFError:
            process.join()
            raise TrialCrashed(_death(process.exitcode)) from None
    finally:
        parent.close()
    process.join()
    if status == "error":
        raise TrialCrashed(payload)
    return payload


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        if name == "SIGKILL":
            return ("the trial's process was killed (SIGKILL), most often by the operating "
                    "system for running out of memory")
        return f"the trial's process died with {name} (a crash in native code)"
    return f"the trial's process exited with status {exitcode} without a result"


def _child(conn: Any, spec: str, config: dict[str, Any], steps: int, seed: int, device: str,
           memory_gb: float | None) -> None:
    if memory_gb is not None:
        import resource

        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        from scalertune._run import run_config
        from scalertune._workload import load_factory

        record = run_config(load_factory(spec), AmpConfig.from_dict(config), steps=steps,
                            seed=seed, device=torch.device(device))
        conn.send(("ok", record))
    except BaseException as exc:  # everything the user's code can throw goes back as text
        conn.send(("error", describe_error(exc) + "\n" + traceback.format_exc()[-3000:]))
    finally:
        conn.close()
