"""How a job's processes start: forked from a server, or spawned; and the environment
torchrun gives each rank.

Where the platform has it (Linux, macOS), the processes are forked from a server that
imported torch and the job's modules once (``multiprocessing``'s forkserver): a process starts
in a fraction of a second instead of importing torch again (seconds, twice a run on two
ranks). It gets the parent's environment as it is when the job starts, as a spawned process
does (:func:`scalertune._processes._child.adopt`). Elsewhere they are spawned.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
from collections.abc import Iterator, Sequence
from typing import Any

from scalertune._amp._torch_private import PRELOADED_MODULES

#: How this package starts processes: ``forkserver`` where the platform has it, else
#: ``spawn`` (``benchmarks/launch_cost.py`` sets it to compare the two).
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

#: What the server imports once, before it forks a job's processes, besides the job's own
#: modules: torch (with the compiler stack that every optimizer's constructor imports) and
#: a process's life. Never the user's code, which each process imports from its spec, nor
#: anything that starts CUDA.
PRELOAD = ("torch", *PRELOADED_MODULES, "scalertune._processes._child", "scalertune._run._ranks")


def context(preload: Sequence[str]) -> Any:
    """The start method's context; a forkserver's with ``preload`` as well as
    :data:`PRELOAD` (read when the server starts: the first job)."""
    ctx = multiprocessing.get_context(START_METHOD)
    if START_METHOD == "forkserver":
        ctx.set_forkserver_preload([*PRELOAD, *preload])
    return ctx


@contextlib.contextmanager
def environment(env: dict[str, str] | None) -> Iterator[None]:
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


def rank_envs(ranks: int) -> list[dict[str, str] | None]:
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
