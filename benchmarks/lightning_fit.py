"""A Lightning run through the Trainer's own fit() against the search's step loop:
python benchmarks/lightning_fit.py [--rounds 5] [--steps 30]

A search could run each Lightning run as ``trainer.fit`` under the precision plugin that
``scalertune.attach`` sets (the same adapter as training), or as it does, through its own step
loop over the module's ``training_step`` (``_workload/_lightning.py``). Each round runs the
tests' Lightning factory (``tests/trainers.py:lightning_parts``: a regression module, 2
micro-batches a step, a StepLR schedule) both ways for ``--steps`` optimizer steps in float16,
in turn, so both see the same machine load: the factory's call and the training, each wall
time measured around it. Printed: each side's median seconds per run and per step (the per
step time of ``fit`` from its first batch on, so without its start), and the median of the
per-round ratios (fit / step loop) with their range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def _fit(steps: int) -> tuple[float, float]:
    import lightning.pytorch as pl
    import trainers

    import scalertune

    started = time.perf_counter()
    trainer = trainers.lightning_trainer(max_steps=steps)
    module, loader = trainers.lightning_module(), trainers.lightning_loader()
    scalertune.attach(trainer, scalertune.AmpConfig(), guard=False, watch=False)
    first: list[float] = []

    class First(pl.Callback):
        def on_train_batch_start(self, *args: object) -> None:
            if not first:
                first.append(time.perf_counter())

    trainer.callbacks.append(First())
    trainer.fit(module, loader)
    ended = time.perf_counter()
    return ended - started, (ended - first[0]) / steps


def _step_loop(steps: int) -> tuple[float, float]:
    import torch
    import trainers

    from scalertune._amp._config import AmpConfig
    from scalertune._run._loop import run_config

    started = time.perf_counter()
    record = run_config(
        trainers.lightning_parts, AmpConfig(), steps=steps, seed=0, device=torch.device("cpu")
    )
    ended = time.perf_counter()
    return ended - started, statistics.mean(record.window_step_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    _fit(args.steps), _step_loop(args.steps)  # imports and first calls, untimed
    runs: dict[str, list[tuple[float, float]]] = {"fit": [], "step loop": []}
    for i in range(args.rounds):
        order = [("fit", _fit), ("step loop", _step_loop)]
        for name, run in order if i % 2 == 0 else order[::-1]:
            runs[name].append(run(args.steps))
    print(f"{args.rounds} rounds of {args.steps} float16 steps, {os.cpu_count()} CPUs")
    for name, got in runs.items():
        print(
            f"{name:10} {statistics.median(r for r, _ in got):6.3f} s a run, "
            f"{1e3 * statistics.median(s for _, s in got):6.2f} ms a step"
        )
    for what, index in (("run", 0), ("step", 1)):
        ratios = [a[index] / b[index] for a, b in zip(runs["fit"], runs["step loop"])]
        print(
            f"fit / step loop, a {what}: {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}x)"
        )


if __name__ == "__main__":
    main()
