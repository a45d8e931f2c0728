"""What GradScaler really does on a workload: the yardstick every diagnosis is checked with."""

import math

import pytest
import torch

from scalertune import AmpConfig, _policy
from scalertune._run._loop import run_config


def gradscaler(factory, config, steps=_policy.DIAGNOSE_STEPS):
    """A plain run of the search's own loop (no hooks, no diagnose code) under ``config``:
    the steps GradScaler skipped, read from the loss-scale history, and whether every loss
    was finite. The workload's own ``clip_norm`` applies, as it does in diagnose."""
    clip = factory().get("clip_norm")
    if clip is not None and config.clip_norm is None:
        config = AmpConfig(**{**config.to_dict(), "clip_norm": clip})
    record = run_config(
        factory, config, steps=steps, seed=0, device=torch.device("cpu"), prune=False
    )
    return len(record.skipped), all(math.isfinite(v) for v in record.losses)


@pytest.fixture(autouse=True)
def one_thread():
    """Autouse where imported: float16 on a shared 2-core CPU runs several times faster on
    one thread than on two that contend for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
