"""The same search in one process, with a process per run (--isolate) and on 2 ranks: what
each trains: python benchmarks/processes.py [--horizon 400] [--rounds 1]

The factory is tests/nanogpt.py:make_model, a GPT in nanoGPT's style with its train.py step
(gradient accumulation over 2 micro-batches, nanoGPT's learning-rate function, clipping at
1.0); on 2 ranks it is wrapped in DistributedDataParallel and each rank takes half of every
micro-batch, so that the global batch and the update are one process's. Each search runs
from an empty study, one at a time, with ``--steps 200`` and the given horizon (400, as a new
user ran it, and 200: no horizon past the trial); the figures are each search's training
steps (over all its runs and the step timing) and its cost in run-equivalents, their ratio to
the search in one process, and the wall time. Runs stop at the float32 target wherever they
train, so the steps agree within what the ranks' rounding changes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FACTORY = os.path.join(ROOT, "tests", "nanogpt.py") + ":make_model"
MODES = {"one process": {}, "--isolate": {"isolate": True}, "2 ranks": {"nproc_per_node": 2}}


def search(mode: dict, horizon: int) -> dict:
    import scalertune

    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the model's greeting, every run
            result = scalertune.search(
                FACTORY,
                storage=os.path.join(folder, "s.db"),
                artifact_dir=os.path.join(folder, "art"),
                steps=200,
                horizon=horizon,
                device="cpu",
                isolation=scalertune.Isolation() if mode.get("isolate") else None,
                nproc_per_node=mode.get("nproc_per_node"),
            )
        return {
            "steps": result.steps_trained,
            "run_equivalents": result.run_equivalents,
            "wall_s": time.perf_counter() - started,
            "answer": result.config.describe(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=int, nargs="*", default=[400, 200])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for horizon in args.horizon:
        print(f"search of tests/nanogpt.py:make_model, --steps 200 --horizon {horizon}:")
        for r in range(args.rounds):
            found = {name: search(mode, horizon) for name, mode in MODES.items()}
            base = found["one process"]
            for name, got in found.items():
                print(
                    f"  round {r + 1} {name:<12} {got['steps']:>5} training steps, "
                    f"{got['run_equivalents']:.2f} run-equivalents "
                    f"({got['steps'] / base['steps']:.3f}x one process's steps), "
                    f"{got['wall_s']:.0f} s; answer {got['answer']}"
                )


if __name__ == "__main__":
    main()
