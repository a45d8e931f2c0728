"""The gradient trace the float32 reference records: what float16 would hold, step by step,
without changing the run, from a subset that loses nothing, and resumable."""

import numpy as np
import pytest
import torch
import workloads
from conftest import example

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._replay._trace import Trace
from scalertune._run._loop import Plan, run_config
from scalertune._run._trace import TraceCollector

CPU = torch.device("cpu")
FLOAT32 = AmpConfig(dtype="float32")
FACTORIES = [workloads.gradient_overflow, example("classifier").make_model]


def _traced(factory, steps, **plan):
    return run_config(factory, FLOAT32, steps=steps, seed=0, device=CPU,
                      plan=Plan(watcher=TraceCollector(steps), **plan))


@pytest.mark.parametrize("factory", FACTORIES, ids=["summed-mse", "classifier"])
def test_the_trace_leaves_the_run_unchanged_and_its_subset_keeps_the_largest(factory,
                                                                              monkeypatch):
    """Between full steps only the tensors that came close to the largest are watched: on
    all but the odd step (a tensor that never came close before) that is the largest."""
    plain = run_config(factory, FLOAT32, steps=240, seed=0, device=CPU)
    traced = _traced(factory, 240)
    assert traced.losses == plain.losses
    monkeypatch.setattr(_policy, "TRACE_FULL_EVERY", 1)  # every tensor on every step
    full = _traced(factory, 240)
    ratio = traced.trace.amax / full.trace.amax
    assert np.mean(ratio == 1) >= 0.99 and ratio.min() > 0.5
    assert traced.trace.steps == 240 and np.all(traced.trace.amax > 0)


def test_the_largest_gradient_is_the_largest_of_what_float16_would_hold():
    """On the summed loss the parameter gradients lead; the trace's largest is at least the
    largest parameter gradient, read before any optimizer step."""
    record = _traced(workloads.gradient_overflow, 20)
    assert np.all(record.trace.amax >= record.trace.param_amax)
    assert record.trace.amax[0] > 100  # sums over the batch: far above a mean loss's


def test_the_startup_probe_holds_the_first_batches_at_the_initial_weights():
    record = _traced(workloads.gradient_overflow, 20)
    startup = record.trace.startup
    assert len(startup) == len(workloads.gradient_overflow()["batches"])  # 4, under the cap
    assert startup[0] == record.trace.amax[0]  # step 0 is the initial weights on batch 0


def test_a_resumed_reference_continues_its_trace(tmp_path):
    whole = _traced(workloads.gradient_overflow, 120)
    path = str(tmp_path / "at60.pt")
    _traced(workloads.gradient_overflow, 60, save_at={60: path})
    resumed = _traced(workloads.gradient_overflow, 120, checkpoint=path, resume=True)
    assert resumed.losses == whole.losses
    assert np.array_equal(resumed.trace.amax, whole.trace.amax)
    assert np.array_equal(resumed.trace.startup, whole.trace.startup)


def test_the_trace_is_compact_and_survives_the_study():
    record = _traced(example("classifier").make_model, 200)
    text = record.trace.encode()
    again = Trace.decode(text)
    assert np.array_equal(again.amax, record.trace.amax)
    assert np.array_equal(again.hist, record.trace.hist) and again.modules == record.trace.modules
    assert len(text) < 40 * 200  # bytes per step, histograms and forward peaks included


def test_the_histogram_counts_each_value_in_its_binary_exponents_bin():
    from scalertune._replay._trace import HIST_BINS, HIST_LOW
    from scalertune._run._trace import _as_hist, _exponent_counts

    values = torch.tensor([0.0, 1.0, 2.0, 3.0, -0.5, 2.0**-126, float("inf"), float("nan")])
    hist = _as_hist(_exponent_counts(values).numpy())
    expected = np.zeros(HIST_BINS, np.int64)
    expected[0], expected[1] = 1, 2  # the zero; inf and NaN
    for exponent, count in ((0, 1), (1, 2), (-1, 1), (-126, 1)):
        expected[2 + exponent - HIST_LOW] = count
    assert np.array_equal(hist, expected)
