"""The gradient trace the float32 reference records: what float16 would hold, step by step,
without changing the run, from a subset that loses nothing, and resumable."""

import base64
import io
import zipfile
import zlib

import numpy as np
import pytest
import torch
import workloads
from conftest import example
from torch import nn

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence
from scalertune._replay._trace import MAX_TRACE_BYTES, Trace
from scalertune._run import _policy as _run_policy
from scalertune._run._loop import Plan, run_config
from scalertune._run._trace_collector import TraceCollector

CPU = torch.device("cpu")
FLOAT32 = AmpConfig(dtype="float32")
FACTORIES = [workloads.gradient_overflow, example("classifier").make_model]


def _traced(factory, steps, **plan):
    return run_config(
        factory,
        FLOAT32,
        steps=steps,
        seed=0,
        device=CPU,
        plan=Plan(watcher=TraceCollector(steps), **plan),
    )


@pytest.mark.parametrize("factory", FACTORIES, ids=["summed-mse", "classifier"])
def test_the_trace_leaves_the_run_unchanged_and_its_subset_keeps_the_largest(factory, monkeypatch):
    """Between full steps only the tensors that came close to the largest are watched: on
    all but the odd step (a tensor that never came close before) that is the largest, and
    on those close to it."""
    plain = run_config(factory, FLOAT32, steps=240, seed=0, device=CPU)
    traced = _traced(factory, 240)
    assert traced.losses == plain.losses
    monkeypatch.setattr(_run_policy, "TRACE_FULL_EVERY", 1)  # every tensor on every step
    full = _traced(factory, 240)
    ratio = traced.trace.amax / full.trace.amax
    assert np.mean(ratio == 1) >= 0.95 and ratio.min() > 0.9
    assert traced.trace.steps == 240 and np.all(traced.trace.amax > 0)


def _repeated_gradient():
    """Three module outputs that carry one gradient: a dropout at p=0 hands its input the
    gradient it gets, which is the tanh output's, times the tanh's slope (at most 1)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.0), nn.Tanh(), nn.Linear(16, 1))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": workloads._regression(scale_inputs=0.1, scale_targets=10),
    }


def test_the_subset_leaves_out_module_outputs_another_always_matched(monkeypatch, tmp_path):
    collector = TraceCollector(240)
    traced = run_config(
        _repeated_gradient, FLOAT32, steps=240, seed=0, device=CPU, plan=Plan(watcher=collector)
    )
    hooks = collector._hooks
    assert hooks.names == ("0", "1", "2", "3") and hooks.subset.modules == {0, 1, 2, 3}
    # the linear's and the dropout's output gradients are the tanh's at most: not hooked
    assert hooks.subset.hooked_modules() == [2, 3]
    # and so does a reference resumed past the first full steps
    path = str(tmp_path / "at150.pt")
    _traced(_repeated_gradient, 150, save_at={150: path})
    again = TraceCollector(240)
    resumed = run_config(
        _repeated_gradient,
        FLOAT32,
        steps=240,
        seed=0,
        device=CPU,
        plan=Plan(watcher=again, checkpoint=path, resume=True),
    )
    assert np.array_equal(resumed.trace.amax, traced.trace.amax)
    assert np.array_equal(again._hooks.subset.dominance, hooks.subset.dominance)
    monkeypatch.setattr(_run_policy, "TRACE_FULL_EVERY", 1)
    full = _traced(_repeated_gradient, 240)
    assert np.array_equal(traced.trace.amax, full.trace.amax)


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


def _blob(**arrays):
    """A trace's stored text made of ``arrays`` (an npz archive, compressed, base64)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return base64.b64encode(zlib.compress(buffer.getvalue())).decode("ascii")


def _parts(trace):
    return {
        "amax": trace.amax,
        "param_amax": trace.param_amax,
        "block_starts": trace.block_starts,
        "hist": trace.hist,
        "forward": trace.forward,
        "modules": np.array(trace.modules, dtype=str),
    }


def _damaged_traces(tmp_path):
    """A trace's text damaged every way a study's writer could: (text, what is said)."""
    good = _traced(workloads.gradient_overflow, 60).trace
    text = good.encode()
    planted = tmp_path / "ran"
    pickled = np.array([_Runs(str(planted))], dtype=object)  # unpickling it runs a command
    bomb = base64.b64encode(zlib.compress(b"\0" * (MAX_TRACE_BYTES + 2**20), 9)).decode()
    header = io.BytesIO()  # an array whose header claims far more than the file holds
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)}
    )
    huge = io.BytesIO()
    with zipfile.ZipFile(huge, "w") as archive:
        archive.writestr("amax.npy", header.getvalue() + b"\0" * 16)
    return planted, [
        ("not base64!", "not base64 text"),
        (12, "not text but int"),
        (text[: len(text) // 2], "not base64 text"),
        (base64.b64encode(zlib.compress(b"junk")).decode(), "not the archive a trace is"),
        (bomb, f"decompresses to more than {MAX_TRACE_BYTES} bytes"),
        (_blob(**{**_parts(good), "amax": pickled}), "its amax is 1-D object"),
        (base64.b64encode(zlib.compress(huge.getvalue())).decode(), "larger than the bytes"),
        (_blob(**{**_parts(good), "hist": good.hist[:-1]}), "its histograms are not one row"),
        (_blob(**{k: v for k, v in _parts(good).items() if k != "forward"}), "it has no forward"),
    ]


class _Runs:
    """An object whose unpickling would create the file ``path``."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_damaged_trace_is_named_never_decoded_past_its_bounds_and_runs_nothing(tmp_path):
    """A stored trace is data from a study others may write: one that does not decode, that
    would decompress past the largest a trace can be, whose array header claims more than
    its bytes, that holds a pickle, or whose arrays do not fit together, is
    ``DamagedEvidence`` saying so, and nothing in it runs."""
    planted, cases = _damaged_traces(tmp_path)
    for text, said in cases:
        with pytest.raises(DamagedEvidence, match="^the gradient trace is damaged: ") as caught:
            Trace.decode(text)
        assert said in str(caught.value)
    assert not planted.exists()


def test_the_histogram_counts_each_value_in_its_binary_exponents_bin():
    from scalertune._replay._trace import HIST_BINS, HIST_LOW
    from scalertune._run._trace_collector import _as_hist, _exponent_counts

    values = torch.tensor([0.0, 1.0, 2.0, 3.0, -0.5, 2.0**-126, float("inf"), float("nan")])
    hist = _as_hist(_exponent_counts(values).numpy())
    expected = np.zeros(HIST_BINS, np.int64)
    expected[0], expected[1] = 1, 2  # the zero; inf and NaN
    for exponent, count in ((0, 1), (1, 2), (-1, 1), (-126, 1)):
        expected[2 + exponent - HIST_LOW] = count
    assert np.array_equal(hist, expected)


class _Double(nn.Module):
    """A float64 layer inside a float32 model: its output's gradient is float64."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 1).double()

    def forward(self, x):
        return self.linear(x.double()).float()


def _mixed_dtypes():
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), _Double())
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": workloads._regression(),
    }


def test_gradients_of_another_dtype_are_traced_as_float32_would_hold_them(monkeypatch):
    traced = _traced(_mixed_dtypes, 120)
    monkeypatch.setattr(_run_policy, "TRACE_FULL_EVERY", 1)
    full = _traced(_mixed_dtypes, 120)
    assert np.array_equal(traced.trace.amax, full.trace.amax)
    assert np.all(traced.trace.param_amax > 0) and traced.trace.hist.sum() > 0


def _own_step(times: int, clip: float | None = None):
    """A workload whose own step backpropagates the batch ``times`` times, clips the
    gradients itself if asked, then steps."""

    def make():
        parts = workloads.gradient_overflow()
        optimizer, loss_fn = parts["optimizer"], parts.pop("loss_fn")

        def step(model, batch, amp):
            optimizer.zero_grad(set_to_none=True)
            for _ in range(times):
                loss = loss_fn(model(batch[0]), batch[1])
                amp.backward(loss)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            amp.step(optimizer)
            return loss

        return {**parts, "step": step}

    return make


def test_a_step_that_accumulates_or_clips_on_its_own_is_one_row_of_backwards_gradients():
    """The parameters are read as each ``amp.backward`` returns, the last read kept: after
    every backward of the step (what GradScaler checks), before the step's own clipping."""
    once = _traced(_own_step(1), 40).trace
    twice = _traced(_own_step(2), 40).trace
    clipped = _traced(_own_step(1, clip=1e-3), 40).trace
    assert once.steps == twice.steps == clipped.steps == 40
    # step 0: the same weights and batch, the gradients summed over two backward passes
    assert twice.param_amax[0] == pytest.approx(2 * once.param_amax[0], rel=1e-6)
    assert twice.startup[0] == pytest.approx(2 * once.startup[0], rel=1e-6)
    # and as backward left them, not as the step's clip_grad_norm_ (to 1e-3) did
    assert clipped.param_amax[0] == once.param_amax[0] > 1
    assert clipped.startup[0] == once.startup[0]
