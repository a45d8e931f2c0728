"""What a search costs next to the training it protects.

For each workload, one default search (``--n-trials 24``, the workload's steps) in this
process, on a SQLite file and again on Optuna's in-memory storage, side by side:

- **run-equivalents**: the training steps of all its runs and of the step timing, over the
  steps of one run (what ``SearchResult.run_equivalents`` reports);
- **outside training**: the share of the search's wall time not spent inside training loops
  (storage, sampling, model building, analysis), measured by timing every call of the
  training loop (``scalertune._run.train``) and the step timing;
- **SQLite / memory**: the search's wall time on SQLite over the same search in memory.

The recommendation of each search is printed too: a cheaper search must not answer worse.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import optuna
import torch

import scalertune
from scalertune._run import _loop
from scalertune._search import _api as _search
from scalertune._search import _references


@contextlib.contextmanager
def _timed(module: Any, name: str, into: list[float]) -> Iterator[None]:
    """Add the wall time of every call of ``module.name`` to ``into[0]``."""
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[0] += time.perf_counter() - started

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def _in_memory() -> Iterator[None]:
    original = _search.open_storage
    _search.open_storage = lambda url, **_: optuna.storages.InMemoryStorage()
    try:
        yield
    finally:
        _search.open_storage = original


def one_search(factory: str, *, steps: int, device: str, memory: bool) -> dict[str, Any]:
    training = [0.0]
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as stack:
        stack.enter_context(_timed(_loop, "train", training))
        stack.enter_context(_timed(_references, "time_dtypes", training))
        if memory:
            stack.enter_context(_in_memory())
        started = time.perf_counter()
        result = scalertune.search(
            factory, storage=f"sqlite:///{folder}/bench.db", steps=steps, device=device
        )
        wall = time.perf_counter() - started
    return {
        "run_equivalents": result.run_equivalents,
        "wall_s": wall,
        "outside": 1 - training[0] / wall,
        "dtype": result.config.dtype,
        "config": result.config.describe(),
        "verdict": result.verdict,
    }


def measure(workloads: dict[str, tuple[str, int]], device: str) -> Iterator[dict[str, Any]]:
    """``workloads``: name -> (factory spec, steps); one row per workload, as it is measured.
    SQLite and memory searches alternate. The two searches of a workload may train different
    numbers of steps (their stopping rules read their own timings), so the SQLite/memory ratio
    is of wall time per run-equivalent."""
    for name, (factory, steps) in workloads.items():
        sqlite = one_search(factory, steps=steps, device=device, memory=False)
        memory = one_search(factory, steps=steps, device=device, memory=True)
        per_run = [r["wall_s"] / r["run_equivalents"] for r in (sqlite, memory)]
        yield {
            "workload": name,
            "steps": steps,
            **sqlite,
            "sqlite_over_memory": per_run[0] / per_run[1],
            "memory_run_equivalents": memory["run_equivalents"],
        }


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for row in measure(
        {
            "codepoints": (os.path.join(root, "examples/codepoints.py:make_model"), 200),
            "classifier": (os.path.join(root, "examples/classifier.py:make_model"), 200),
            "midsize": (os.path.join(here, "models.py:midsize"), 200),
        },
        device,
    ):
        print(row)
