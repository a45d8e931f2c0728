"""How fast the command line answers, and what it imports:
python benchmarks/cli_startup.py [--rounds 7]

Each round runs, in fresh interpreters and in turn (so that every command line sees the same
machine load), ``python -X importtime -m scalertune ARGS`` for each command line below and
``python -X importtime -c "import torch"``, the import the command line leaves out. Printed
for each: the median wall time of the process, the median of its imports' time as
``-X importtime`` counts it (the top-level modules' cumulative times), whether torch was
imported, and the median of the per-round ratios of its wall time to ``import torch``'s,
with their range. ``report`` reads the study of ``tests/data/study_v1.journal`` (a copy).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: The command lines timed: the ones that must answer before torch loads.
COMMANDS = {
    "scalertune --help": ["--help"],
    "scalertune search --help": ["search", "--help"],
    "scalertune export --help": ["export", "--help"],
    "scalertune report --help": ["report", "--help"],
    "scalertune dashboard --help": ["dashboard", "--help"],
    "scalertune diagnose --help": ["diagnose", "--help"],
    "scalertune report (a study)": ["report", "--storage", "{journal}", "--study-name", "short"],
}
IMPORT_TORCH = "python -c 'import torch'"

#: One line of ``-X importtime``: self and cumulative microseconds, then the module's name
#: (indented by its depth: a top-level import has none).
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)")


def _run(argv: list[str]) -> tuple[float, float, bool]:
    """Wall seconds, import seconds (``-X importtime``) and whether torch was imported."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    lines = [m for m in map(_LINE.match, done.stderr.splitlines()) if m is not None]
    top = sum(int(m.group(2)) for m in lines if not m.group(3))
    torch = any(m.group(4) == "torch" for m in lines)
    return wall, top / 1e6, torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="scalertune-cli-startup-")
    journal = os.path.join(folder, "study.journal")
    shutil.copy(os.path.join(ROOT, "tests", "data", "study_v1.journal"), journal)
    cases = {
        name: ["-m", "scalertune", *(a.format(journal=journal) for a in argv)]
        for name, argv in COMMANDS.items()
    }
    cases[IMPORT_TORCH] = ["-c", "import torch"]
    results: dict[str, list[tuple[float, float, bool]]] = {name: [] for name in cases}
    try:
        for _ in range(args.rounds):
            for name, argv in cases.items():
                results[name].append(_run(argv))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    torch_walls = [wall for wall, _, _ in results[IMPORT_TORCH]]
    print(f"{args.rounds} rounds, {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'command line':32} {'wall s':>7} {'imports s':>9} {'torch':>5}  wall / import torch")
    for name, runs in results.items():
        walls = [wall for wall, _, _ in runs]
        ratios = [wall / base for wall, base in zip(walls, torch_walls)]
        print(
            f"{name:32} {statistics.median(walls):7.3f} "
            f"{statistics.median(s for _, s, _ in runs):9.3f} "
            f"{'yes' if any(t for _, _, t in runs) else 'no':>5}  "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"
        )


if __name__ == "__main__":
    main()
