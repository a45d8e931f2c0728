"""The random number generators a workload draws from: seeded, saved, put back."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import torch


def seed_everything(seed: int) -> None:
    """Seed every RNG a factory or a DataLoader may draw from."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG a workload draws from: Python's, NumPy's, torch's (and CUDA's, if in use),
    as tensors and plain data (NumPy's key as a list of ints), what a checkpoint holds."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        return state
    name, key, position, has_gauss, gauss = numpy.random.get_state(legacy=True)
    keys = numpy.asarray(key).tolist()
    state["numpy"] = (str(name), keys, int(position), int(has_gauss), float(gauss))
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Whatever runs inside leaves every RNG as it found it."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
