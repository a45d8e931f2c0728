"""Soak the fault loops: python benchmarks/soak.py [--rounds 50] [--budget-s S] [--only journal ...]

Runs each fault loop of ``tests/integration/test_faults.py`` for ``--rounds`` rounds (50 by
default, where CI runs one), one loop at a time; the load test with 8 workers (4 in CI). A
round holds when the study, after its faults and one rerun, holds what one uninterrupted
search would: nothing RUNNING or lost, no evidence missing, nothing trained twice,
``report --json`` equal to the search's YAML, the undisturbed answer.
A round that fails is printed with its seed (``SCALERTUNE_FAULT_SEED`` replays it) and the
loop goes on with another seed, until its rounds are done, ``--failures`` rounds have failed,
or ``--budget-s`` seconds have passed (no round starts after that).

Prints one row per loop: the rounds that held, the rounds that failed, the faults the rounds
that held injected (by kind), and the seconds per round (median, fastest, slowest). PostgreSQL's
loops need ``SCALERTUNE_TEST_POSTGRES``; the others start what they need (moto's S3 server, the
ranks on gloo). The numbers in ``docs/benchmarks.md`` come from here.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests", "integration", "test_faults.py")

#: Loop name -> the test that runs it, and the environment it runs with.
LOOPS = {
    "journal": ("test_faults_on_a_journal_file", {}),
    "sqlite": ("test_faults_on_sqlite_one_worker", {}),
    "postgresql": ("test_faults_on_postgresql", {}),
    "horizon": ("test_faults_over_a_horizon_with_each_worker_in_its_own_folder", {}),
    "s3": ("test_an_s3_artifact_store_down_for_seconds_is_ridden_out_like_a_database", {}),
    "ranks": (
        "test_a_rank_killed_at_random_points_fails_its_run_naming_the_rank_and_the_answer_holds",
        {},
    ),
    "load": (
        "test_many_workers_on_one_postgresql_killed_and_its_server_restarted_lose_nothing",
        {"SCALERTUNE_LOAD_WORKERS": "8"},
    ),
}


@dataclasses.dataclass
class Soaked:
    """What one loop did: the seconds of each round that held and the faults it injected
    (by kind), the failed rounds (seed and last lines), and its seconds in all."""

    rounds: list[float] = dataclasses.field(default_factory=list)
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failed: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def row(self, name: str) -> str:
        times = self.rounds or [0.0]
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items()))
        return (
            f"{name:<11} {len(self.rounds):>5} {len(self.failed):>6} {self.seconds:>8.0f} "
            f"{statistics.median(times):>6.1f} {min(times):>6.1f} {max(times):>6.1f}  {kinds}"
            + "".join(f"  failed: SCALERTUNE_FAULT_SEED={seed}" for seed, _ in self.failed)
        )


def run_once(name: str, rounds: int, seed: int, budget_s: float) -> tuple[list[dict], bool, str]:
    """One pytest run of the loop ``name``, starting no round after ``budget_s``: each round
    that held (its faults and seconds), whether the run passed, and its last lines."""
    test, extra = LOOPS[name]
    with tempfile.TemporaryDirectory(prefix="scalertune-soak-") as folder:
        log = os.path.join(folder, "faults.jsonl")
        env = {
            **os.environ,
            **extra,
            "SCALERTUNE_FAULT_ROUNDS": str(rounds),
            "SCALERTUNE_FAULT_BUDGET_S": str(budget_s),
            "SCALERTUNE_FAULT_SEED": str(seed),
            "SCALERTUNE_FAULT_LOG": log,
        }
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:xdist", "-o", "addopts=", "-q"]
            + [f"{TESTS}::{test}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        held = []
        if os.path.exists(log):
            with open(log, encoding="utf-8") as f:
                held = [json.loads(line) for line in f]
    passed = proc.returncode == 0 and " skipped" not in proc.stdout
    return held, passed, "\n".join(proc.stdout.strip().splitlines()[-25:])


def soak(name: str, rounds: int, *, failures: int, budget_s: float) -> Soaked:
    """``rounds`` rounds of the loop ``name`` that held or failed, in one pytest run while
    they hold, another (with another seed) after each failure."""
    out, started = Soaked(), time.monotonic()
    while (
        len(out.rounds) + len(out.failed) < rounds
        and len(out.failed) < failures
        and time.monotonic() - started < budget_s
    ):
        seed = random.randrange(2**31)
        left = rounds - len(out.rounds) - len(out.failed)
        held, passed, tail = run_once(
            name, left, seed, min(10.0**9, budget_s - (time.monotonic() - started))
        )
        for each in held:
            out.rounds.append(each["seconds"])
            out.faults.update(each["faults"])
        if not passed:
            out.failed.append((seed, tail))
            print(f"{name}: a round failed (SCALERTUNE_FAULT_SEED={seed}):\n{tail}", flush=True)
    out.seconds = time.monotonic() - started
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--only", nargs="*", choices=sorted(LOOPS), default=list(LOOPS))
    parser.add_argument("--failures", type=int, default=3, help="stop a loop after this many")
    parser.add_argument(
        "--budget-s", type=float, default=float("inf"), help="per loop: no round starts after"
    )
    args = parser.parse_args()
    print(
        f"{'loop':<11} {'held':>5} {'failed':>6} {'seconds':>8} "
        f"{'median':>6} {'min':>6} {'max':>6}  faults injected (rounds that held)",
        flush=True,
    )
    for name in args.only:
        done = soak(name, args.rounds, failures=args.failures, budget_s=args.budget_s)
        print(done.row(name), flush=True)


if __name__ == "__main__":
    main()
