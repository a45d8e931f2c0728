"""The forecast past the horizon against real long float32 runs:
python benchmarks/forecast.py [--only NAME ...] [--reach 10] [--json FILE]

For each model, the float32 reference to the horizon as a search trains it (through
scalertune, with its gradient trace) gives the forecast; the same training in a plain float32
loop (no scalertune code: the factory's own step, or backward, the workload's clipping and
the optimizer's step) runs on to ``--reach`` times the horizon, reading every leaf module's
largest output on every 10th step. For every module whose forward peaks grow significantly
over the horizon's second half, two lines are fitted there, as the forecast fits them:

- a power of the step (``log2 peak`` against ``log2 step``), the forecast's model;
- a straight line in the step (``log2 peak`` against the step), the exponential the forecast
  used before;

and each is compared with the real peak (the median of the 10th-step peaks over the tenth of a
horizon before the point) at 2, 5 and 10 times the horizon: the ratio predicted / real. Every
forecast of float16's 65504 is checked against the real peak where the run reached that step
(or where it ended).

Models: ``nanogpt`` (tests/nanogpt.py: a GPT in nanoGPT's style with nanoGPT's learning rate,
1e-3 warmed up over 100 steps and decayed to 1e-4 over the whole run) and ``nanogpt-fast`` (the
same at 1e-2 over 20 steps), ``growing`` (tests/late_workloads.py:growing_activations, whose
first layer's outputs grow with its weights' norm under Adam), ``growing-slower`` (the same
with smaller inputs, whose outputs pass 65504 after the horizon: what a forecast is for) and
``plateau``
(tests/late_workloads.py:plateau_mlp, outputs climbing toward targets near 500: the regression
MLP on which the exponential forecast raised a false alarm). Takes about 5 minutes on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests")]

import late_workloads  # noqa: E402
import nanogpt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from scalertune import _policy  # noqa: E402
from scalertune._amp._config import AmpConfig  # noqa: E402
from scalertune._replay._forecast import forecast, trends  # noqa: E402
from scalertune._run._loop import Plan, run_config  # noqa: E402
from scalertune._run._trace_collector import TraceCollector  # noqa: E402

#: Every how many steps the plain loop reads the modules' outputs.
EVERY = 10
POINTS = (2, 5, 10)


@dataclasses.dataclass(frozen=True)
class Case:
    factory: Callable[[], Any]
    horizon: int
    #: nanoGPT's learning rate, warm-up and floor (its decay runs over the whole run).
    schedule: tuple[float, int, float] | None = None


def growing_slower() -> dict[str, Any]:
    """growing_activations with inputs 2.2 times smaller: its first layer's outputs start
    further below 65504 and pass it after the horizon (near step 6000), not within it."""
    workload = late_workloads.growing_activations()
    model = late_workloads._RawInputsLayerNorm(input_scale=1000.0)  # noqa: SLF001 - its model
    return {**workload, "model": model, "optimizer": torch.optim.Adam(model.parameters(), 0.2)}


CASES = {
    "nanogpt": Case(nanogpt.make_model, 2000, (1e-3, 100, 1e-4)),
    "nanogpt-fast": Case(nanogpt.make_model, 2000, (1e-2, 20, 1e-3)),
    "growing": Case(late_workloads.growing_activations, 3000),
    "growing-slower": Case(growing_slower, 2000),
    "plateau": Case(late_workloads.plateau_mlp, 1000),
}


class _Float32:
    """What a factory's step calls, as a plain float32 loop: backward, clip, step."""

    def __init__(self, clip: float | None) -> None:
        self.clip = clip

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self.clip is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip)
        optimizer.step()
        return True


def plain_peaks(factory: Callable[[], Any], steps: int) -> tuple[np.ndarray, dict[str, list]]:
    """Each leaf module's largest |output| on every ``EVERY``-th step of a plain float32 loop."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    work = factory()
    model, optimizer = work["model"], work["optimizer"]
    amp, step, loss_fn = _Float32(work.get("clip_norm")), work.get("step"), work.get("loss_fn")
    leaves = [(n or "(model)", m) for n, m in model.named_modules() if not list(m.children())]
    now: dict[str, float] = {}

    def hook(name: str) -> Any:
        def read(_m: Any, _i: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                now[name] = max(now.get(name, 0.0), float(out.detach().abs().max()))

        return read

    peaks: dict[str, list] = {name: [] for name, _ in leaves}
    batches = itertools.cycle(work["batches"])
    for t in range(steps):
        handles = [m.register_forward_hook(hook(n)) for n, m in leaves] if t % EVERY == 0 else []
        now.clear()
        batch = next(batches)
        if step is not None:
            step(model, batch, amp)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(batch[0]), batch[1]).backward()
            amp.step(optimizer)
        for handle in handles:
            handle.remove()
        if handles:
            for name in peaks:
                peaks[name].append(now.get(name, 0.0))
    return np.arange(0, steps, EVERY), peaks


def real_at(at: np.ndarray, values: list, step: float, width: float) -> float:
    window = (at > step - width) & (at <= step)
    return float(np.median(np.asarray(values)[window])) if window.any() else math.nan


def exponential_line(trace: Any, horizon: int, module: str) -> tuple[float, float] | None:
    """The straight line in the step through the module's log2 peaks over the horizon's second
    half (the exponential the forecast fitted before): (slope, intercept)."""
    rows = trace.block_starts >= horizon / 2
    i = trace.modules.index(module)
    peaks = trace.forward[rows, i].astype(np.float64)
    keep = peaks > 0
    if keep.sum() < 3:
        return None
    slope, intercept = np.polyfit(trace.block_starts[rows][keep], np.log2(peaks[keep]), 1)
    return float(slope), float(intercept)


def measure(name: str, reach: int) -> dict[str, Any]:
    case = CASES[name]
    horizon, steps = case.horizon, reach * case.horizon
    if case.schedule is not None:  # nanoGPT's schedule, decayed over the whole run
        nanogpt.LEARNING_RATE, nanogpt.WARMUP_ITERS, nanogpt.MIN_LR = case.schedule
        nanogpt.LR_DECAY_ITERS = steps
    clip = case.factory().get("clip_norm")
    started = time.perf_counter()
    reference = run_config(
        case.factory,
        AmpConfig(dtype="float32", clip_norm=clip),
        steps=horizon,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(watcher=TraceCollector(horizon)),
    )
    trace = reference.trace
    at, peaks = plain_peaks(case.factory, steps)
    width = horizon / 10
    rows = []
    for trend in trends(trace, horizon):
        module, line = trend.module, exponential_line(trace, horizon, trend.module)
        row = {"module": module, "steady": trend.steady, "power": [], "exponential": []}
        row["exponent"] = trend.exponent
        for k in POINTS:
            real = real_at(at, peaks[module], k * horizon, width)
            row["power"].append(trend.at(k * horizon) / real)
            if line is not None:
                row["exponential"].append(2 ** (line[0] * k * horizon + line[1]) / real)
        rows.append(row)
    checked = []
    for f in forecast(trace, horizon):
        when = min(f.step, steps - 1)
        medians = [real_at(at, peaks[f.module], t, width) for t in at]
        crossed = next((t for t, v in zip(at, medians) if v >= _policy.FLOAT16_MAX), None)
        first = next((t for t, v in zip(at, peaks[f.module]) if v >= _policy.FLOAT16_MAX), None)
        checked.append(
            {
                "forecast": f.describe(),
                "real": real_at(at, peaks[f.module], when, width),
                "at": when,
                "median_crossed": None if crossed is None else int(crossed),
                "first_crossed": None if first is None else int(first),
            }
        )
    old = []
    for module in trace.modules:
        line = exponential_line(trace, horizon, module)
        seen = float(trace.forward[:, trace.modules.index(module)].max())
        if line is None or line[0] <= 0 or seen >= _policy.FLOAT16_MAX:
            continue
        reach_step = (math.log2(_policy.FLOAT16_MAX) - line[1]) / line[0]
        if horizon < reach_step < steps:
            old.append(
                {
                    "module": module,
                    "step": reach_step,
                    "real": real_at(at, peaks[module], reach_step, width),
                }
            )
    return {
        "model": name,
        "horizon": horizon,
        "steps": steps,
        "seconds": time.perf_counter() - started,
        "trends": rows,
        "forecasts": checked,
        "exponential_within_run": old,
    }


def report(found: dict[str, Any]) -> None:
    print(
        f"{found['model']}: horizon {found['horizon']}, real run to {found['steps']} "
        f"({found['seconds']:.0f} s)"
    )
    for row in found["trends"]:
        power = " ".join(f"{r:.2f}" for r in row["power"])
        line = " ".join(f"{r:.3g}" for r in row["exponential"])
        tag = "steady" if row["steady"] else "not steady: no forecast"
        print(
            f"  {row['module']:<28} exponent {row['exponent']:.2f}; predicted/real at "
            f"{POINTS}x the horizon: power {power} | "
            f"exponential {line}  ({tag})"
        )
    for f in found["forecasts"]:
        print(
            f"  forecast: {f['forecast']}; real peak at step {f['at']:,.0f}: {f['real']:.3g} "
            f"(the real peaks passed 65504 first at step {f['first_crossed']}, their median "
            f"at {f['median_crossed']})"
        )
    for f in found["exponential_within_run"]:
        print(
            f"  the exponential line said {f['module']} reaches 65504 at step {f['step']:,.0f}; "
            f"real peak there: {f['real']:.3g}"
        )


def summary(results: list[dict[str, Any]]) -> None:
    for k, point in enumerate(POINTS):
        ratios = [r["power"][k] for found in results for r in found["trends"] if r["steady"]]
        if ratios:
            print(
                f"power, steady trends, at {point}x the horizon: predicted/real "
                f"{min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f})"
            )
    for kind in ("power", "exponential"):
        for only_steady in (True, False):
            errors = [
                abs(math.log2(r))
                for found in results
                for row in found["trends"]
                if row["steady"] or not only_steady
                for r in row[kind]
                if r > 0 and math.isfinite(r)
            ]
            if not errors:
                continue
            worst = 2 ** max(errors)
            print(
                f"{kind:<11} {'steady trends' if only_steady else 'all significant':<16} "
                f"{len(errors):>3} points: median error {2 ** statistics.median(errors):.2f}x, "
                f"worst {worst:.3g}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(CASES), default=list(CASES))
    parser.add_argument("--reach", type=int, default=10)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for name in args.only:
        with contextlib.redirect_stdout(io.StringIO()):  # the GPT's greeting, every build
            results.append(measure(name, args.reach))
        report(results[-1])
    summary(results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
