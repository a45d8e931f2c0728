"""Giving a finished run's memory back before the next run."""

from __future__ import annotations

import ctypes
import gc
from typing import Any

from scalertune._run import _policy as _run_policy


def release_memory(model_bytes: int = 0) -> None:
    """Give the memory of a finished run back to the system before the next one.

    A search builds a fresh workload for every run. Python frees the last one as its
    references go, but glibc's allocator keeps freed pages in its arenas, so without a trim
    the process's resident memory grows run after run to several runs' worth of a large
    model. A full garbage collection (for workloads that hold reference cycles) costs a third
    of a second in a process that has imported torch and optuna: it runs only when the model
    is large enough for that to matter (``RELEASE_COLLECT_BYTES``).
    """
    if model_bytes >= _run_policy.RELEASE_COLLECT_BYTES:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
