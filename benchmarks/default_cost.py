"""The default search's cost and answer on the shipped examples, with the step timing pinned.

    python benchmarks/default_cost.py [--profiles quiet loaded] [--examples classifier ...]

A search's cost depends on how its runs stop, and how they stop depends on the interleaved
step timing: a run is pruned as slower than the best only where the timing's spread says so,
and a shared machine's load widens that spread from one search to the next. To compare two
versions of the stopping rules (this tree against another checkout, run with that checkout
first on ``PYTHONPATH``) on the same judgement of speed, each search here gets the same
step timing instead of measuring its own: the per-round ratios to float32 of a profile below,
times float32's step time measured once per example. Everything else is the real search: the
same factory, the default space, the default 200-step trials, real training on this CPU.

- ``quiet``: the ratios of the interleaved timing of ``examples/codepoints.py`` on this
  team's 2-core CPU with nothing else running (the README's run): float16 1.40-1.61x float32's
  step time, bfloat16 1.15-1.39x.
- ``loaded``: a machine whose load swamps the comparison (seen on the same machine with two
  other test suites running): both half-precision dtypes anywhere from 0.7x to 2x float32's,
  so that no dtype is surely faster than another.

Each row prints the cost (run-equivalents, and training steps), how many sampled trials ran,
why sampling stopped, the answer and the best AMP config.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

import optuna

import scalertune
from scalertune import _policy
from scalertune._run._step_times import StepTimes
from scalertune._search import _references

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = {
    "classifier": "examples/classifier.py:make_model",
    "codepoints": "examples/codepoints.py:make_model",
}
#: Per-round step time over float32's, six rounds each (see the module's docstring).
PROFILES = {
    "quiet": {
        "float16": [1.40, 1.45, 1.50, 1.53, 1.58, 1.61],
        "bfloat16": [1.15, 1.22, 1.33, 1.36, 1.38, 1.39],
    },
    "loaded": {
        "float16": [0.70, 0.72, 1.10, 1.68, 2.07, 2.10],
        "bfloat16": [0.69, 0.71, 1.05, 1.60, 1.98, 2.00],
    },
}


def pinned(profile: dict[str, list[float]], float32_s: float) -> StepTimes:
    """A step timing with ``profile``'s ratios over a float32 step of ``float32_s``, and the
    training steps a real timing of three dtypes runs."""
    rounds = {"float32": [float32_s] * len(profile["float16"])}
    rounds.update({d: [r * float32_s for r in ratios] for d, ratios in profile.items()})
    per_dtype = _policy.TIMING_WARMUP_STEPS + _policy.TIMING_ROUNDS * _policy.READBACK_INTERVAL
    return StepTimes(rounds, steps=len(rounds) * per_dtype)


@contextlib.contextmanager
def timing(times: StepTimes) -> Iterator[None]:
    """Every search in the block gets ``times`` instead of measuring its own."""
    original = _references.time_dtypes
    _references.time_dtypes = lambda *args, **kwargs: times
    try:
        yield
    finally:
        _references.time_dtypes = original


def float32_step(spec: str) -> float:
    """float32's median step time on this machine, from one real interleaved timing."""
    with tempfile.TemporaryDirectory() as folder:
        found: list[StepTimes] = []
        original = _references.time_dtypes

        def keep(*args: Any, **kwargs: Any) -> StepTimes:
            found.append(original(*args, **kwargs))
            return found[-1]

        _references.time_dtypes = keep
        try:
            scalertune.search(spec, storage=f"sqlite:///{folder}/t.db", n_trials=0, device="cpu")
        finally:
            _references.time_dtypes = original
    return statistics.median(found[0].rounds["float32"])


def one_search(spec: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        result = scalertune.search(
            spec,
            storage=f"sqlite:///{folder}/cost.db",
            device="cpu",
            artifact_dir=os.path.join(folder, "artifacts"),
        )
    sampled = [o for o in result.ranking if o.role == "search"]
    best = result.best_amp
    return {
        "run_equivalents": result.run_equivalents,
        "steps": result.steps_trained,
        "sampled": len(sampled) + result.reused,
        "stopped": result.stop_reason or "-",
        "answer": result.config.describe(),
        "best_amp": "-" if best is None else f"{best.label} [{best.config.describe()}]",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"scalertune from {os.path.dirname(scalertune.__file__)}")
    for name in args.examples:
        spec = os.path.join(ROOT, EXAMPLES[name])
        step = float32_step(spec)
        for profile in args.profiles:
            with timing(pinned(PROFILES[profile], step)):
                row = one_search(spec)
            print(
                f"{name:<11} {profile:<7} {row['run_equivalents']:5.1f} run-eq "
                f"({row['steps']} steps), {row['sampled']} sampled; answer "
                f"{row['answer']}; best AMP {row['best_amp']}; stopped: {row['stopped']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
