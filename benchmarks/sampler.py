"""Sampler efficiency: trials the default sampler (TPE) needs to come within 5% of the best
time to target an exhaustive grid finds, against random search.

The grid is a discretised version of the default space (dtype, init_scale, clipping; the
other knobs at PyTorch's defaults). Every grid point is trained once for real; the samplers
then search the same grid, reading each trial's outcome from that table, so that dozens of
sampler seeds cost no training and every sampler sees identical numbers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from typing import Any

import optuna
import torch

from scalertune import AmpConfig
from scalertune._judge._target import Target
from scalertune._run._loop import run_config

STEPS = 200
SCALES = [2.0**k for k in (-8, -4, 0, 4, 8, 12, 16, 20, 24)]
CLIPS = [None, 0.3, 1.0, 3.0, 10.0]
WITHIN = 1.05
SEEDS = 15
BUDGET = 40


def grid() -> list[AmpConfig]:
    fp16 = [AmpConfig(init_scale=s, clip_norm=c) for s, c in itertools.product(SCALES, CLIPS)]
    return fp16 + [AmpConfig(dtype="bfloat16", clip_norm=c) for c in CLIPS]


def table(factory: Callable[[], Any]) -> dict[AmpConfig, float]:
    """Time to target of every grid point (inf where it never reaches it or is pruned)."""
    cpu = torch.device("cpu")
    ref = run_config(factory, AmpConfig(dtype="float32"), steps=STEPS, seed=0, device=cpu)
    target = Target.from_reference(ref.losses)
    out = {}
    for config in grid():
        record = run_config(factory, config, steps=STEPS, seed=0, device=cpu)
        steps = None if record.pruned else target.steps_to_target(record.losses)
        out[config] = math.inf if steps is None else steps * record.median_step_time
    return out


def trials_to_near_best(
    values: dict[AmpConfig, float], sampler: optuna.samplers.BaseSampler
) -> int:
    best = min(values.values())
    study = optuna.create_study(sampler=sampler)
    for n in range(1, BUDGET + 1):
        trial = study.ask()
        dtype = trial.suggest_categorical("dtype", ["float16", "bfloat16"])
        clip = trial.suggest_categorical("clip_norm", [str(c) for c in CLIPS])
        clip_norm = None if clip == "None" else float(clip)
        if dtype == "float16":
            scale = trial.suggest_categorical("init_scale", SCALES)
            config = AmpConfig(init_scale=scale, clip_norm=clip_norm)
        else:
            config = AmpConfig(dtype="bfloat16", clip_norm=clip_norm)
        value = values[config]
        study.tell(trial, value if math.isfinite(value) else 1e9)
        if value <= best * WITHIN:
            return n
    return BUDGET + 1


def measure(examples: dict[str, Callable[[], Any]]) -> list[dict[str, Any]]:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = []
    for name, factory in examples.items():
        values = table(factory)
        tpe = [
            trials_to_near_best(values, optuna.samplers.TPESampler(seed=s)) for s in range(SEEDS)
        ]
        rnd = [
            trials_to_near_best(values, optuna.samplers.RandomSampler(seed=s)) for s in range(SEEDS)
        ]
        rows.append(
            {
                "example": name,
                "grid": len(values),
                "near_best": sum(v <= min(values.values()) * WITHIN for v in values.values()),
                "tpe_median": statistics.median(tpe),
                "random_median": statistics.median(rnd),
            }
        )
    return rows
