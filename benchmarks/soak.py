"""Soak the fault loops: python benchmarks/soak.py [--rounds 50] [--only journal ...]

Runs each fault loop of ``tests/integration/test_faults.py`` for ``--rounds`` rounds (50 by
default, where CI runs up to 3 in 40 s), one storage at a time, with one seed per loop
(printed: ``SCALERTUNE_FAULT_SEED`` replays a failure), and prints one row per loop: the
rounds, the seconds, the seconds per round, and whether every round held. PostgreSQL's loops
need ``SCALERTUNE_TEST_POSTGRES``; the others start what they need (moto's S3 server, the
ranks on gloo). The numbers in ``docs/benchmarks.md`` come from here.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests", "integration", "test_faults.py")

#: Loop name -> the test that runs it.
LOOPS = {
    "journal": "test_faults_on_a_journal_file",
    "sqlite": "test_faults_on_sqlite_one_worker",
    "postgresql": "test_faults_on_postgresql",
    "horizon": "test_faults_over_a_horizon_with_each_worker_in_its_own_folder",
    "s3": "test_an_s3_artifact_store_down_for_seconds_is_ridden_out_like_a_database",
    "ranks": (
        "test_a_rank_killed_at_random_points_fails_its_run_naming_the_rank_and_the_answer_holds"
    ),
}


def soak(name: str, rounds: int, seed: int) -> tuple[bool, float, str]:
    """One loop for ``rounds`` rounds: whether it held, its seconds, and the last lines."""
    env = {
        **os.environ,
        "SCALERTUNE_FAULT_ROUNDS": str(rounds),
        "SCALERTUNE_FAULT_BUDGET_S": str(10**9),  # the rounds bound it, not the clock
        "SCALERTUNE_FAULT_SEED": str(seed),
    }
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:xdist",
            "-o",
            "addopts=",
            "-q",
            f"{TESTS}::{LOOPS[name]}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    held = proc.returncode == 0 and " skipped" not in proc.stdout
    return held, seconds, "\n".join(proc.stdout.strip().splitlines()[-3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--only", nargs="*", choices=sorted(LOOPS), default=list(LOOPS))
    parser.add_argument("--seed", type=int, default=None, help="one seed for every loop")
    args = parser.parse_args()
    print(f"{'loop':<11} {'rounds':>6} {'seconds':>8} {'s/round':>8}  result (seed)")
    for name in args.only:
        seed = random.randrange(2**31) if args.seed is None else args.seed
        held, seconds, tail = soak(name, args.rounds, seed)
        result = "held" if held else f"FAILED\n{tail}"
        print(
            f"{name:<11} {args.rounds:>6} {seconds:>8.0f} {seconds / args.rounds:>8.1f}  "
            f"{result} ({seed})",
            flush=True,
        )


if __name__ == "__main__":
    main()
