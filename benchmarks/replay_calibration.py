"""Calibration of the scaler replay (issue 20): skipped steps predicted from one float32 trace
against real float16 GradScaler runs.

    python benchmarks/replay_calibration.py [--workloads gpt2 bert ...] [--jobs 2] [--cache DIR]
                                            [--real-seed N]

Per workload: one float32 reference of ``STEPS`` steps through scalertune's own loop with its
trace collector (which runs the start-up probe first), then ``CONFIGS`` random float16 configs
drawn from the shipped space's ranges (the same configs for every workload), each predicted
from that one trace and each trained for real through ``run_config`` (no pruning, no early
stop: the whole horizon). A prediction hits when it is within ``max(2, 20%)`` of the real
count (``_policy.SKIP_TOLERANCE_*``); also reported: exact counts, exact start-up streaks,
mean and largest errors, and the worst misses. Three predictors side by side:

- ``predict``: the start-up probe, then the trace read with the run's lag (what a
  :class:`~scalertune._replay._predict.Prediction` says);
- ``many``: ``replay_many`` with the probe, then the trace open loop (what ranks configs);
- ``trace``: the trace alone, open loop (no probe).

Four architectures the team did not write (Hugging Face GPT-2 and BERT from their config
classes, ``nn.TransformerEncoder``, a ResNet-like net of ``tests/third_party.py``'s blocks),
shrunk to stay within a CPU's budget (float16 on a CPU is many times slower than float32,
convolutions most), and two of the project's own (``examples/codepoints.py``,
``tests/workloads.py:gradient_overflow``). Takes about an hour of one core.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "examples")]

import torch  # noqa: E402
from replay import configs as replay_configs  # noqa: E402  (benchmarks/replay.py)
from torch import nn  # noqa: E402

from scalertune import _policy  # noqa: E402
from scalertune._amp._config import AmpConfig  # noqa: E402
from scalertune._judge._rank import skip_tolerance  # noqa: E402
from scalertune._replay._gradscaler import replay, replay_many  # noqa: E402
from scalertune._replay._predict import predict  # noqa: E402
from scalertune._run._loop import Plan, run_config  # noqa: E402
from scalertune._run._trace_collector import TraceCollector  # noqa: E402

STEPS = 2000
CONFIGS = 30
CONFIG_SEED = 12345
CPU = torch.device("cpu")


def configs(n: int = CONFIGS, seed: int = CONFIG_SEED) -> list[AmpConfig]:
    """Random float16 configs over the shipped space's ranges (search_spaces/float16.yaml),
    drawn as ``benchmarks/replay.py`` draws them."""
    return replay_configs(n, seed)


# -- workloads --------------------------------------------------------------------------------


def _tokens(vocab: int, batch: int, length: int, n: int) -> list[torch.Tensor]:
    return [torch.randint(0, vocab, (batch, length)) for _ in range(n)]


def _own_loss_step(optimizer: torch.optim.Optimizer, call: Callable[..., Any]) -> Any:
    def step(model, batch, amp):
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = call(model, batch).loss
        amp.backward(loss)
        amp.step(optimizer)
        return loss

    return step


def gpt2() -> dict[str, Any]:
    """Hugging Face GPT-2 from its config (2 layers, width 32), LM loss, AdamW: third_party's
    gpt2 at a quarter of the width."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=32,
            vocab_size=128,
            n_positions=32,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return {
        "model": model,
        "optimizer": optimizer,
        "batches": _tokens(128, 4, 16, 4),
        "step": _own_loss_step(optimizer, lambda m, b: m(input_ids=b, labels=b)),
    }


def bert() -> dict[str, Any]:
    """Hugging Face BERT for sequence classification from its config (2 layers, width 32)."""
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=128,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
            num_labels=4,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = _tokens(128, 8, 16, 4)
    return {
        "model": model,
        "optimizer": optimizer,
        "batches": [(t, t[:, 0] % 4) for t in tokens],
        "step": _own_loss_step(optimizer, lambda m, b: m(input_ids=b[0], labels=b[1])),
    }


def encoder() -> dict[str, Any]:
    """nn.TransformerEncoder (2 post-norm layers), cross-entropy summed over the batch (so that
    its gradients can overflow float16), Adam."""
    import third_party

    model = third_party._Encoder(ffn_scale=1.0)  # noqa: SLF001 - the tests' model, unscaled
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.CrossEntropyLoss(reduction="sum"),
        "batches": [(t, t.max(dim=1).values) for t in _tokens(64, 16, 12, 4)],
    }


def resnet() -> dict[str, Any]:
    """third_party.resnet's shape at the smallest size: a stem, one basic residual block of 8
    channels (third_party._Block), pooling, a head; 8x8 images, batches of 4; summed
    cross-entropy and SGD with momentum as there."""
    import third_party

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        third_party._Block(8),  # noqa: SLF001
        _MeanPool(),
        nn.Linear(8, 10),
    )
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
        "loss_fn": nn.CrossEntropyLoss(reduction="sum"),
        "batches": [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(2)],
    }


class _MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def codepoints() -> dict[str, Any]:
    import codepoints as example

    return example.make_model()


def gradient_overflow() -> dict[str, Any]:
    import workloads

    return workloads.gradient_overflow()


WORKLOADS = {
    "gpt2": gpt2,
    "bert": bert,
    "encoder": encoder,
    "resnet": resnet,
    "codepoints": codepoints,
    "gradient_overflow": gradient_overflow,
}


# -- one workload -----------------------------------------------------------------------------


def _streak(skipped: Any) -> int:
    return next((i for i, t in enumerate(skipped) if t != i), len(skipped))


def measure(name: str, cache: str | None = None, real_seed: int = 0) -> dict[str, Any]:
    """The trace, the real runs and the three predictions of one workload (real runs cached
    in ``cache``, one file per run, so that an interrupted calibration resumes). The trace is
    recorded with seed 0, the real runs with ``real_seed``: another seed is another run (other
    initial weights, dropout masks and, where the workload draws them, data), as a user's
    training seldom shares the search's seed."""
    torch.set_num_threads(1)
    factory, started = WORKLOADS[name], time.process_time()
    trace = run_config(
        factory,
        AmpConfig(dtype="float32"),
        steps=STEPS,
        seed=0,
        device=CPU,
        plan=Plan(watcher=TraceCollector(STEPS)),
    ).trace
    trace_s = time.process_time() - started
    chosen = configs()
    many = replay_many(trace.amax, chosen, startup=trace.startup)
    rows = []
    for n, config in enumerate(chosen):
        real = _real_run(name, n, config, cache, real_seed)
        rows.append(
            {
                "n": n,
                "config": config.to_dict(),
                "real": real,
                "predict": list(
                    map(int, replay(trace.amax, config, startup=trace.startup).skipped)
                ),
                "many": list(map(int, many.skipped(n))),
                "trace": list(map(int, replay(trace.amax, config).skipped)),
            }
        )
        assert predict(trace, config).skipped_steps == len(rows[-1]["predict"])
    return {
        "workload": name,
        "rows": rows,
        "trace_s": trace_s,
        "params": sum(p.numel() for p in factory()["model"].parameters()),
        "cpu_s": time.process_time() - started,
        "probe_batches": len(trace.startup),
    }


def _real_run(name: str, n: int, config: AmpConfig, cache: str | None, seed: int = 0) -> list[int]:
    tag = f"_seed{seed}" if seed else ""
    path = os.path.join(cache, f"{name}_{n:02d}{tag}.json") if cache else None
    if path and os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved["config"] == config.to_dict():
            return saved["skipped"]
    record = run_config(WORKLOADS[name], config, steps=STEPS, seed=seed, device=CPU, prune=False)
    assert record.steps_run == STEPS, (name, config, record.stopped)
    if path:
        with open(path, "w") as f:
            json.dump({"config": config.to_dict(), "skipped": record.skipped}, f)
    return record.skipped


# -- the table --------------------------------------------------------------------------------


def hit(predicted: int, real: int) -> bool:
    return abs(predicted - real) <= skip_tolerance(real)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    real = [len(r["real"]) for r in rows]
    out = {
        "workload": result["workload"],
        "params": result["params"],
        "real": f"{min(real)}-{max(real)}, median {statistics.median(real):g}, "
        f"{sum(r == 0 for r in real)} with none",
    }
    for key in ("predict", "many", "trace"):
        errors = [abs(len(r[key]) - len(r["real"])) for r in rows]
        out[key] = {
            "hit": sum(hit(len(r[key]), len(r["real"])) for r in rows),
            "exact": errors.count(0),
            "mean": statistics.mean(errors),
            "max": max(errors),
            "startup": sum(_streak(r[key]) == _streak(r["real"]) for r in rows),
        }
    # the misses first, then the largest errors within the tolerance
    worst = sorted(
        rows,
        key=lambda r: (
            hit(len(r["predict"]), len(r["real"])),
            -abs(len(r["predict"]) - len(r["real"])),
        ),
    )[:2]
    out["worst"] = [_miss(r) for r in worst if len(r["predict"]) != len(r["real"])]
    return out


def _miss(row: dict[str, Any]) -> str:
    c = row["config"]
    return (
        f"#{row['n']:02d} init 2**{math.log2(c['init_scale']):.1f} growth "
        f"{c['growth_factor']:.2f} backoff {c['backoff_factor']:.2f} every "
        f"{c['growth_interval']}: real {len(row['real'])} {_first(row['real'])}, "
        f"predicted {len(row['predict'])} {_first(row['predict'])}"
    )


def _first(skipped: list[int], n: int = 14) -> str:
    return "[" + ", ".join(map(str, skipped[:n])) + (", ...]" if len(skipped) > n else "]")


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"\n   hit = within max({_policy.SKIP_TOLERANCE_STEPS}, "
        f"{_policy.SKIP_TOLERANCE_SHARE:.0%}) of the real count, of {CONFIGS}; "
        "exact counts; exact start-up streaks; mean / max |error|"
    )
    print(
        f"   {'workload':<18} {'params':>7}  {'predictor':<8} {'hit':>5} {'exact':>5} "
        f"{'start-up':>8} {'mean':>5} {'max':>4}   real skips (min-max, median)"
    )
    for result in results:
        s = summary(result)
        for i, key in enumerate(("predict", "many", "trace")):
            p = s[key]
            head = f"{s['workload']:<18} {s['params']:>7,}" if i == 0 else " " * 26
            print(
                f"   {head}  {key:<8} {p['hit']:>5} {p['exact']:>5} {p['startup']:>8} "
                f"{p['mean']:>5.2f} {p['max']:>4}" + (f"   {s['real']}" if i == 0 else "")
            )
    print("\n   worst misses of predict (outside the tolerance first):")
    for result in results:
        for line in summary(result)["worst"]:
            print(f"   {result['workload']:<18} {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--jobs", type=int, default=1, help="workloads measured at once")
    parser.add_argument("--cache", help="a folder keeping each real run's skipped steps")
    parser.add_argument(
        "--real-seed",
        type=int,
        default=0,
        help="the real runs' seed (the trace's is 0): 0 replays the run the "
        "trace saw, another seed another run of the same training",
    )
    args = parser.parse_args()
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    started, load = time.perf_counter(), os.getloadavg()[0]
    print(
        f"Replay calibration on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores (load {load:.1f}), torch {torch.__version__}, one thread per "
        f"workload, {args.jobs} at once: {CONFIGS} float16 configs x {STEPS} steps per "
        "workload, predicted from one float32 trace each (seed 0)"
        + (f", the real runs at seed {args.real_seed}" if args.real_seed else ""),
        flush=True,
    )
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        results = pool.starmap(
            measure, [(name, args.cache, args.real_seed) for name in args.workloads]
        )
    for r in results:
        print(
            f"   {r['workload']}: trace {r['trace_s']:.0f} s CPU (probe "
            f"{r['probe_batches']} batches), all {r['cpu_s'] / 60:.1f} min CPU"
        )
    print_table(results)
    print(
        f"\n(calibration: {(time.perf_counter() - started) / 60:.0f} min wall, load "
        f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)"
    )


if __name__ == "__main__":
    main()
