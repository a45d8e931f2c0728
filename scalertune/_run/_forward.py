"""The late-phase check of a float32 island: a config's loss at a float32 checkpoint's
weights, forward only, against float32's on the same batches.

Where bfloat16 (or float16) falls behind float32 late in the horizon because one module's
outputs are too large for its significant bits (the last layer of a regression to readings
near 1000: bfloat16's spacing there is 4), evaluating the checkpoint's weights under the
config's autocast already shows it, without a step of training; keeping that module in
float32 brings the loss back. This measures both, so that only an island that helps is
branched and trained.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

from scalertune._amp._config import FLOAT8_KNOBS, AmpConfig
from scalertune._inrun._gap import relative
from scalertune._run import _policy as _run_policy
from scalertune._run._checkpoint import BatchCursor, load_checkpoint
from scalertune._run._loop import step_function
from scalertune._run._memory import release_memory
from scalertune._run._probe import NoStep
from scalertune._workload._contract import to_device
from scalertune._workload._factory import build_workload


def forward_ratio(
    factory: Callable[[], Any],
    config: AmpConfig,
    checkpoint: str,
    *,
    seed: int,
    device: torch.device,
) -> float:
    """``config``'s mean loss over float32's on the ``ISLAND_PROBE_BATCHES`` batches after the
    checkpoint, at its weights (``inf`` when ``config``'s is not finite)."""
    ours = _mean_loss(factory, config, checkpoint, seed=seed, device=device)
    theirs = _mean_loss(factory, AmpConfig(dtype="float32"), checkpoint, seed=seed, device=device)
    return relative(ours, theirs) if math.isfinite(theirs) else math.inf


def _mean_loss(
    factory: Callable[[], Any],
    config: AmpConfig,
    checkpoint: str,
    *,
    seed: int,
    device: torch.device,
) -> float:
    workload = build_workload(factory, seed=seed, device=device)
    try:
        cursor = BatchCursor(workload.batches, saves=False)
        load_checkpoint(checkpoint, workload, cursor)
        amp = NoStep(precision_of(config), device=device)
        amp.prepare(workload.model)
        step = step_function(workload)
        losses = [
            float(step(workload, to_device(batch, device), amp).detach())
            for batch in itertools.islice(cursor, _run_policy.ISLAND_PROBE_BATCHES)
        ]
    finally:
        del workload
        release_memory()
    return sum(losses) / len(losses) if all(map(math.isfinite, losses)) else math.inf


def precision_of(config: AmpConfig) -> AmpConfig:
    """``config``'s precision alone, nothing that steps: its dtype, its float32 modules and,
    for float8, its recipe, the precision around it and its scale rounding (float8's recipe
    changes the forward as much as a dtype: a per-tensor scale that one massive row sets
    flushes the tensor's ordinary values, a per-row scale only its own row's)."""
    float8 = {k: getattr(config, k) for k in FLOAT8_KNOBS} if config.float8 else {}
    return AmpConfig(dtype=config.dtype, fp32_modules=config.fp32_modules, **float8)
