"""Run every benchmark and print one table: python benchmarks/run.py [--device cuda]

Claims of speed and cost in the README come from here, measured side by side in one run and
stated as ratios with their spread. Tests never time anything.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(ROOT, "examples")]

import classifier  # noqa: E402
import codepoints  # noqa: E402
import cost  # noqa: E402
import memory  # noqa: E402
import optuna  # noqa: E402
import overhead  # noqa: E402
import pruning  # noqa: E402
import sampler  # noqa: E402
import steps  # noqa: E402
import torch  # noqa: E402
import workers  # noqa: E402

SECTIONS = ("cost", "memory", "overhead", "steps", "pruning", "sampler", "workers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--only",
        nargs="*",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="run only these sections",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    started = time.perf_counter()
    print(f"scalertune benchmarks on {device.type} ({name}), torch {torch.__version__}")
    run = set(args.only)

    if "cost" in run:
        print(
            "\n1. Search cost: one default search (--n-trials 24; 200 steps, 100 for midsize) "
            "per workload, on SQLite and in memory"
        )
        print(
            f"   {'workload':<11} {'run-equiv':>9} {'outside training':>16} "
            f"{'SQLite/memory':>13} {'wall s':>7}  answer"
        )
        for r in cost.measure(
            {
                "codepoints": (os.path.join(ROOT, "examples/codepoints.py:make_model"), 200),
                "classifier": (os.path.join(ROOT, "examples/classifier.py:make_model"), 200),
                "midsize": (os.path.join(HERE, "models.py:midsize"), 100),
            },
            device.type,
        ):
            print(
                f"   {r['workload']:<11} {r['run_equivalents']:>9.1f} {r['outside']:>16.1%} "
                f"{r['sqlite_over_memory']:>12.2f}x {r['wall_s']:>7.0f}  {r['config']}"
            )

    if "memory" in run and device.type == "cpu":
        m = memory.measure()
        print(
            f"\n2. Peak host memory of a search of a 25M-parameter model ({memory.N_TRIALS} "
            f"trials, {memory.STEPS} steps) against one run of it"
        )
        print(
            f"   one run {m['one_run_mib']:.0f} MiB, search {m['search_mib']:.0f} MiB: "
            f"{m['ratio']:.2f}x"
        )

    if "overhead" in run:
        print("\n3. Harness overhead: step time of a scalertune trial vs the hand-written AMP loop")
        print(f"   ({overhead.CONFIG.describe()}; median of 10-step windows, interleaved)")
        print(
            f"   {'model':<20} {'hand ms/step':>12} {'ours ms/step':>12} {'ratio':>7} "
            f"{'control':>8} {'syncs/step hand':>16} {'ours':>6}"
        )
        for r in overhead.measure(device):
            print(
                f"   {r['model']:<20} {r['hand_ms']:>12.3f} {r['ours_ms']:>12.3f} "
                f"{r['ratio']:>7.3f} {r['control_ratio']:>8.3f} {r['hand_syncs']:>16.2f} "
                f"{r['ours_syncs']:>6.2f}"
            )

    if "steps" in run:
        print(
            "\n4. Step time against float32 on the mid-size transformer (3.3M parameters), "
            "interleaved (median ratio, spread)"
        )
        for r in steps.measure(device):
            print(
                f"   {r['dtype']:<9} {r['ms']:>8.2f} ms/step  {r['ratio']:.2f}x "
                f"({r['low']:.2f}-{r['high']:.2f}x)"
            )

    if "pruning" in run:
        print("\n5. Pruning: 10 configs on a model whose float16 forward overflows")
        p = pruning.measure()
        print(
            f"   {p['pruned']} of {p['configs']} pruned; with pruning {p['pruned_s']:.2f} s, "
            f"run to full length {p['full_s']:.2f} s: {p['saving']:.1f}x less time"
        )
        print(
            f"   a non-finite run trains {p['steps_past_first_nonfinite_median']:g} steps "
            f"(median), {p['steps_past_first_nonfinite_max']} at most, past its first "
            "non-finite step"
        )

    if "sampler" in run:
        print(
            f"\n6. Sampler: trials to come within {int((sampler.WITHIN - 1) * 100)}% of the "
            f"grid's best time to target (median of {sampler.SEEDS} seeds; "
            f"{sampler.BUDGET + 1} = not found)"
        )
        print(f"   {'example':<12} {'grid':>5} {'near-best':>10} {'TPE':>6} {'random':>7}")
        for r in sampler.measure(
            {"codepoints": codepoints.make_model, "classifier": classifier.make_model}
        ):
            print(
                f"   {r['example']:<12} {r['grid']:>5} {r['near_best']:>10} "
                f"{r['tpe_median']:>6g} {r['random_median']:>7g}"
            )

    if "workers" in run and device.type == "cpu":
        w = workers.measure()
        print(
            f"\n7. Workers on one journal file: {w['pairs']} interleaved pairs of searches of "
            f"{workers.EXAMPLE} (--n-trials {workers.N_TRIALS}), one torch thread per worker"
        )
        for n in (1, 2):
            rates = ", ".join(f"{x:.0f}" for x in w["steps_per_s"][n])
            cpu = ", ".join(f"{x:.2f}" for x in w["cpu_ms_per_step"][n])
            print(f"   {n} worker(s): {rates} training steps/s; {cpu} CPU ms per step")
        print(
            f"   2 workers / 1 worker, steps per second: median {w['ratio_median']:.2f}x "
            f"(pairs {w['ratio_min']:.2f}-{w['ratio_max']:.2f}x)"
        )
    print(f"\n(all benchmarks: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
