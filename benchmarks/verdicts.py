"""Repeated searches: does the answer stay put when the machine is busy?

Runs the same default search N times on each shipped example, each in its own storage, and
prints the recommended config, its dtype, the verdict's direction and its interval. With
``--load``, a busy process competes for one core the whole time (the condition under which a
single timing once flipped the verdict between two runs).

    python benchmarks/verdicts.py --repeat 5 --load
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import optuna

import scalertune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ("codepoints", "classifier")


def _burn() -> None:
    x = 0
    while True:
        x = (x * 31 + 7) % 1_000_003


@contextlib.contextmanager
def background_load(on: bool) -> Iterator[None]:
    process = multiprocessing.Process(target=_burn, daemon=True) if on else None
    if process is not None:
        process.start()
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.join()


def direction(result: scalertune.SearchResult) -> str:
    speedup = result.speedup
    if speedup is None:
        return "float32"
    if speedup.low <= 1 <= speedup.high:
        return "same"
    return "faster" if speedup.low > 1 else "slower"


def measure(repeat: int, load: bool, device: str = "cpu") -> list[dict[str, Any]]:
    rows = []
    with background_load(load):
        for _ in range(repeat):
            for name in EXAMPLES:
                with tempfile.TemporaryDirectory() as folder:
                    result = scalertune.search(
                        os.path.join(ROOT, f"examples/{name}.py:make_model"),
                        storage=f"sqlite:///{folder}/v.db",
                        device=device,
                    )
                speedup = result.speedup
                rows.append(
                    {
                        "example": name,
                        "config": result.config.describe(),
                        "dtype": result.config.dtype,
                        "direction": direction(result),
                        "interval": None if speedup is None else (speedup.low, speedup.high),
                        "point": None if speedup is None else speedup.point,
                        "run_equivalents": result.run_equivalents,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = measure(args.repeat, args.load)
    for name in EXAMPLES:
        print(f"{name}:")
        for r in (r for r in rows if r["example"] == name):
            interval = (
                "-"
                if r["interval"] is None
                else f"{r['point']:.2f}x ({r['interval'][0]:.2f}-{r['interval'][1]:.2f}x)"
            )
            print(
                f"  {r['dtype']:<9} {r['direction']:<7} {interval:<22} "
                f"{r['run_equivalents']:5.1f} run-eq  {r['config']}"
            )
        dtypes = {r["dtype"] for r in rows if r["example"] == name}
        directions = {r["direction"] for r in rows if r["example"] == name}
        opposite = {"faster", "slower"} <= directions
        print(
            f"  recommended dtypes {sorted(dtypes)}; verdicts "
            f"{'POINT IN OPPOSITE DIRECTIONS' if opposite else 'never opposite'}"
        )


if __name__ == "__main__":
    main()
