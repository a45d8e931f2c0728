"""Run every benchmark and print one table: python benchmarks/run.py

Claims of speed in the README come from here, measured side by side in one run and stated as
ratios. Tests never time anything.
"""

from __future__ import annotations

import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "examples")]

import torch  # noqa: E402

import classifier  # noqa: E402
import codepoints  # noqa: E402
import overhead  # noqa: E402
import pruning  # noqa: E402
import sampler  # noqa: E402
import workers  # noqa: E402


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    started = time.perf_counter()
    print(f"scalertune benchmarks on {device.type} ({name}), torch {torch.__version__}\n")

    print("1. Harness overhead: step time of a scalertune trial vs the hand-written AMP loop")
    print(f"   (float16, init_scale 4096; median of 10-step windows; {overhead.CONFIG.describe()})")
    print(f"   {'model':<20} {'hand ms/step':>12} {'ours ms/step':>12} {'ratio':>7} "
          f"{'syncs/step hand':>16} {'ours':>6}")
    for r in overhead.measure(device):
        print(f"   {r['model']:<20} {r['hand_ms']:>12.3f} {r['ours_ms']:>12.3f} {r['ratio']:>7.3f} "
              f"{r['hand_syncs']:>16.2f} {r['ours_syncs']:>6.2f}")

    print("\n2. Pruning: 10 configs on a model whose float16 forward overflows")
    p = pruning.measure()
    print(f"   {p['pruned']} of {p['configs']} pruned; with pruning {p['pruned_s']:.2f} s, "
          f"run to full length {p['full_s']:.2f} s: {p['saving']:.1f}x less time")
    print(f"   a non-finite run trains {p['steps_past_first_nonfinite_median']:g} steps (median), "
          f"{p['steps_past_first_nonfinite_max']} at most, past its first non-finite step")

    print(f"\n3. Sampler: trials to come within {int((sampler.WITHIN - 1) * 100)}% of the grid's "
          f"best time to target (median of {sampler.SEEDS} seeds; {sampler.BUDGET + 1} = not found)")
    print(f"   {'example':<12} {'grid':>5} {'near-best':>10} {'TPE':>6} {'random':>7}")
    for r in sampler.measure({"codepoints": codepoints.make_model,
                              "classifier": classifier.make_model}):
        print(f"   {r['example']:<12} {r['grid']:>5} {r['near_best']:>10} {r['tpe_median']:>6g} "
              f"{r['random_median']:>7g}")

    print(f"\n4. Workers on one journal file ({workers.N_TRIALS} sampled trials of "
          f"{workers.EXAMPLE}, one torch thread per worker)")
    rows = workers.measure()
    for r in rows:
        print(f"   {r['workers']} worker(s): {r['seconds']:.1f} s, "
              f"{r['trials_per_minute']:.1f} trials/min")
    print(f"   2 workers / 1 worker: {rows[1]['trials_per_minute'] / rows[0]['trials_per_minute']:.2f}x")
    print(f"\n(all benchmarks: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
