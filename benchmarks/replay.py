"""Replay time: 1,000 random float16 configs over a 100,000-step gradient trace, on one core.

    python benchmarks/replay.py [--repeats 5] [--real-steps 100000]

The goal is under a second of CPU for ranking a search space's configs from the float32
reference's trace. Timed side by side on each trace:

- ``replay_many`` with and without the start-up probe, every config exactly to the end (the
  median of ``--repeats`` runs, with their range);
- as the search ranks them (``_replay_choice.fewest_skips``): PyTorch's defaults replayed
  alone, then the 1,000 configs with each stopped once it skips more than the defaults (it
  can no longer win); checked to pick the same config as the full replay (median of
  ``--repeats``);
- the step-by-step pass over all configs at once (the fallback for growth intervals below 8)
  and the one-config ``replay`` looped over the configs (timed on 20, scaled to 1,000); their
  ratios are against the full ``replay_many``.

All CPU time of this process, one thread. Every implementation is checked to give the same
counts.

Traces: two synthetic ones (independent lognormal magnitudes; a slow trend with AR(1) noise
and rare spikes) and a real one, the float32 reference of ``tests/workloads.py``'s
``gradient_overflow`` recorded by scalertune's collector (``--real-steps 0`` skips it: it
takes a minute or two to train).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scalertune._amp._config import PYTORCH_DEFAULT, AmpConfig  # noqa: E402
from scalertune._replay import _gradscaler  # noqa: E402
from scalertune._replay._gradscaler import limits, replay, replay_many  # noqa: E402
from scalertune._replay._trace import Trace, empty  # noqa: E402
from scalertune._search._replay_choice import fewest_skips, pick  # noqa: E402

CONFIGS = 1000
STEPS = 100_000
LOOPED = 20  # configs the one-config replay is timed on


def configs(n: int = CONFIGS, seed: int = 0) -> list[AmpConfig]:
    """The shipped float16 space's ranges: init_scale 2**U(-4, 24), growth U(1.25, 4),
    backoff U(0.125, 0.75), growth interval log-uniform over 10..5000."""
    rng = np.random.default_rng(seed)
    return [
        AmpConfig(
            init_scale=float(2.0 ** rng.uniform(-4, 24)),
            growth_factor=float(rng.uniform(1.25, 4)),
            backoff_factor=float(rng.uniform(0.125, 0.75)),
            growth_interval=int(round(math.exp(rng.uniform(math.log(10), math.log(5000))))),
        )
        for _ in range(n)
    ]


def traces(steps: int = STEPS, real_steps: int = STEPS, seed: int = 0) -> dict[str, Trace]:
    """name -> trace (the synthetic ones without a magnitude histogram: nothing flushes)."""
    rng = np.random.default_rng(seed)
    amax = {"lognormal iid (sigma 1)": np.exp(rng.normal(0, 1.0, steps)) * 3.0}
    noise, walk = rng.normal(0, 0.3, steps), np.zeros(steps)
    for t in range(1, steps):
        walk[t] = 0.95 * walk[t - 1] + noise[t]
    spikes = np.where(rng.random(steps) < 1e-3, 100.0, 1.0)
    amax["trend + AR(1) + spikes"] = np.exp(np.linspace(2, -1, steps) + walk) * spikes
    out = {
        name: dataclasses.replace(empty(), amax=a, param_amax=a, startup=a[:4])
        for name, a in amax.items()
    }  # a probe of four "batches"
    if real_steps:
        out[f"gradient_overflow, float32 ({real_steps:,} steps)"] = _real_trace(real_steps)
    return out


def _real_trace(steps: int) -> Any:
    import workloads

    from scalertune._run._loop import Plan, run_config
    from scalertune._run._trace_collector import TraceCollector

    return run_config(
        workloads.gradient_overflow,
        AmpConfig(dtype="float32"),
        steps=steps,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(watcher=TraceCollector(steps)),
    ).trace


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def _stepwise(amax: np.ndarray, chosen: list[AmpConfig]) -> np.ndarray:
    """Every config one step at a time: the fallback of ``replay_many``, on all of them."""
    scalers = _gradscaler._Scalers(chosen)  # noqa: SLF001 - the implementation under test
    with np.errstate(over="ignore"):
        _gradscaler._run_stepwise(scalers, limits(amax), 0)  # noqa: SLF001
    return scalers.totals()[0]


def _looped(amax: Any, chosen: list[Any]) -> list[Any]:
    return [replay(amax, c) for c in chosen]


def measure(*, repeats: int = 5, real_steps: int = STEPS) -> list[dict[str, Any]]:
    chosen = configs()
    ranked = [PYTORCH_DEFAULT, *chosen]
    rows = []
    for name, trace in traces(real_steps=real_steps).items():
        amax, probe = trace.amax, trace.startup
        times, ranking = [], []
        for _ in range(repeats):
            seconds, many = _cpu(functools.partial(replay_many, amax, chosen))
            times.append(seconds)
            seconds, picked = _cpu(
                functools.partial(fewest_skips, trace, PYTORCH_DEFAULT, ranked, len(amax), None)
            )
            ranking.append(seconds)
        # what the search would pick from the full replay, with no config stopped
        assert picked is pick(trace, ranked, replay_many(amax, ranked, startup=probe), None)
        probed_s, probed = _cpu(functools.partial(replay_many, amax, chosen, startup=probe))
        stepwise_s, stepwise = _cpu(functools.partial(_stepwise, amax, chosen))
        looped_s, looped = _cpu(functools.partial(_looped, amax, chosen[:LOOPED]))
        assert np.array_equal(many.n_skipped, stepwise)
        assert [len(r.skipped) for r in looped] == many.n_skipped[:LOOPED].tolist()
        assert all(
            np.array_equal(replay(amax, c, startup=probe, lag=False).skipped, probed.skipped(n))
            for n, c in enumerate(chosen[:LOOPED])
        )
        median = statistics.median(times)
        rows.append(
            {
                "trace": name,
                "steps": len(amax),
                "median_s": median,
                "low_s": min(times),
                "high_s": max(times),
                "probed_s": probed_s,
                "ranked_s": statistics.median(ranking),
                "stepwise_s": stepwise_s,
                "looped_s": looped_s * CONFIGS / LOOPED,
                "skips_median": float(np.median(many.n_skipped)),
                "skips_max": int(many.n_skipped.max()),
                "skips_total": int(many.n_skipped.sum()),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--real-steps",
        type=int,
        default=STEPS,
        help="steps of the real float32 trace (0: synthetic traces only)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"Replay time on {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"(load {os.getloadavg()[0]:.1f}), numpy {np.__version__}, one thread: "
        f"{CONFIGS:,} float16 configs (the shipped space's ranges) x {STEPS:,} steps, CPU s"
    )
    print(
        f"   {'trace':<40} {'replay_many':>20} {'with probe':>10} {'ranked':>7} "
        f"{'step by step':>13} {'one at a time':>14}   skips per config (median, max; total)"
    )
    for r in measure(repeats=args.repeats, real_steps=args.real_steps):
        many = f"{r['median_s']:.2f} ({r['low_s']:.2f}-{r['high_s']:.2f})"
        print(
            f"   {r['trace']:<40} {many:>20} {r['probed_s']:>10.2f} {r['ranked_s']:>7.2f} "
            f"{r['stepwise_s']:>6.2f} {r['stepwise_s'] / r['median_s']:>5.1f}x "
            f"{r['looped_s']:>7.1f} {r['looped_s'] / r['median_s']:>5.0f}x   "
            f"{r['skips_median']:g}, {r['skips_max']:,}; {r['skips_total']:,}"
        )


if __name__ == "__main__":
    main()
