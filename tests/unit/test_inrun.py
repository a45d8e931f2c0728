"""The in-run check, piece by piece: its float32 pass is the float32 loss at the step's own
weights and leaves no trace on the training, its judgement is the horizon's rule, its
policy comes from the result file, what it did survives a checkpoint, and its record reaches
the study without holding training up."""

import logging
import math
import os
import re
import warnings

import numpy as np
import optuna
import pytest
import torch
import yaml
from torch import nn

import scalertune
from scalertune import AmpCheckError, AmpCheckWarning, AmpConfig, AmpRuntime, CheckPolicy, _policy
from scalertune._amp._schema import write_result
from scalertune._errors import UsageError
from scalertune._inrun import InRunCheck
from scalertune._inrun._gap import Check, judge
from scalertune._inrun._knobs import choose_knobs
from scalertune._inrun._passes import loss_value
from scalertune._inrun._run_record import VERSION, RunRecord
from scalertune._replay._gradscaler import THRESHOLD
from scalertune._storage._names import RUN_PREFIX

CPU = torch.device("cpu")


class _Noisy(nn.Module):
    """Dropout and BatchNorm: a forward draws random numbers and updates buffers."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1)
        )

    def forward(self, x):
        return self.net(x)


def _batches(n=8):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)) for _ in range(n)]


def _train(amp, steps, *, model=None, seed=0):
    torch.manual_seed(seed)
    model = model or _Noisy()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model = amp.prepare(model)
    batches = _batches()
    losses = [
        float(amp.train_step(model, optimizer, nn.functional.mse_loss, batches[s % 8]))
        for s in range(steps)
    ]
    return losses, model


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_check_leaves_no_trace_on_the_training(dtype):
    """Dropout masks and BatchNorm statistics: a run that checks itself every 5 steps trains
    exactly as one that does not, loss for loss and buffer for buffer."""
    config = AmpConfig(dtype=dtype, init_scale=2.0**10)
    plain, plain_model = _train(AmpRuntime(config, device=CPU), 60)
    amp = AmpRuntime(config, device=CPU, check=InRunCheck(CheckPolicy(every=5)))
    checked, checked_model = _train(amp, 60)
    assert checked == plain
    for ours, theirs in zip(checked_model.buffers(), plain_model.buffers()):
        assert torch.equal(ours, theirs)
    assert [c.step for c in amp.check.checks] == list(range(0, 60, 5))
    assert not amp.check.actions.done


def test_a_check_is_the_float32_loss_of_the_steps_batch_at_its_weights():
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    amp = AmpRuntime(AmpConfig(dtype="bfloat16"), device=CPU, check=InRunCheck())
    model = amp.prepare(model)
    x, y = _batches()[0]
    with torch.no_grad():
        expected = float(nn.functional.mse_loss(model(x), y))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours = float(nn.functional.mse_loss(model(x), y))
    amp.train_step(model, optimizer, nn.functional.mse_loss, (x, y))
    (check,) = amp.check.checks
    assert check.float32 == pytest.approx(expected, rel=1e-6)
    assert check.ours == pytest.approx(ours, rel=1e-6)
    assert check.ours != check.float32  # bfloat16's forward does round


def test_the_judgement_is_the_horizons_rule_over_recent_checks():
    def failing(checks):  # at the default tolerance and z, the horizon's
        return judge(checks).beyond(_policy.PHASE_TOLERANCE, _policy.PHASE_Z)

    assert failing([Check(i, 1.30, 1.0) for i in range(5)])  # 1.3x, no noise
    assert not failing([Check(i, 1.20, 1.0) for i in range(5)])  # within 1.25x
    noisy = [Check(i, ours, 1.0) for i, ours in enumerate([0.8, 2.2, 0.7, 2.3, 0.8])]
    assert judge(noisy).ratio > 1.25 and not failing(noisy)  # within its own noise
    negative = [Check(i, -0.6, -1.0) for i in range(5)]  # a loss below zero, 40% behind
    assert failing(negative)
    assert judge([Check(0, math.inf, 1.0), Check(1, 1.0, 1.0)]) is None


def _precision_floor():
    """A model whose bfloat16 output at ~1000 rounds by 4: the check fails at once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(1000.0)
    x = torch.randn(64, 4)
    with torch.no_grad():
        y = model(x) + 0.01 * torch.randn(64, 1)
    return model, [(x, y)]


@pytest.mark.parametrize("action", ["warn", "stop", "act"])
def test_the_policy_says_what_a_failed_check_does(action):
    model, batches = _precision_floor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    amp = AmpRuntime(
        AmpConfig(dtype="bfloat16"),
        device=CPU,
        check=InRunCheck(CheckPolicy(every=1, action=action, window=3)),
    )
    model = amp.prepare(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if action == "stop":
            with pytest.raises(AmpCheckError, match="bfloat16's loss is .* at the same weights"):
                for _ in range(3):
                    amp.train_step(model, optimizer, nn.functional.mse_loss, batches[0])
            return
        for _ in range(3):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batches[0])
    lines = [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]
    assert len(lines) == 1 and "scalertune check at step 2" in lines[0]
    report = amp.check.report(amp)
    if action == "warn":
        assert "policy 'warn': nothing changed" in lines[0]
        assert amp.config.dtype == "bfloat16"
        # said, nothing done: a warning in the report, no action
        assert "  actions: none\n  warnings: 1\n" in report
    else:  # the output layer's island brings this batch back
        assert "keeping '2' in float32" in lines[0]
        assert amp.config.fp32_modules == ("2",)
        assert [a.kind for a in amp.check.actions.done] == ["island"]
        assert "  actions: 1\n" in report and "warnings" not in report


def test_a_resumed_run_keeps_what_the_check_did(tmp_path):
    model, batches = _precision_floor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    policy = CheckPolicy(every=1, window=3)
    amp = AmpRuntime(AmpConfig(dtype="bfloat16"), device=CPU, check=InRunCheck(policy))
    model = amp.prepare(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpCheckWarning)
        for _ in range(3):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batches[0])
    torch.save(amp.state_dict(), tmp_path / "amp.pt")

    fresh, _ = _precision_floor()
    resumed = AmpRuntime(AmpConfig(dtype="bfloat16"), device=CPU, check=InRunCheck(policy))
    fresh = resumed.prepare(fresh)
    resumed.load_state_dict(torch.load(tmp_path / "amp.pt", weights_only=True))
    assert resumed.config.fp32_modules == ("2",)
    assert [a.line for a in resumed.check.actions.done] == [a.line for a in amp.check.actions.done]
    assert resumed.steps == 3
    from scalertune._amp._islands import is_island

    assert is_island(fresh[2]) and not is_island(fresh[0])


def test_a_run_resumed_while_it_records_its_gradients_goes_on_and_chooses_its_knobs(
    tmp_path, caplog, monkeypatch
):
    """The scaler left the search's prediction, so the check records 100 steps of gradients
    to choose its knobs; a checkpoint in the middle keeps the recording, and the resumed run
    completes it and chooses, where it used to forget it and never choose."""

    def runtime():
        return AmpRuntime(
            AmpConfig(init_scale=2.0**12),
            device=CPU,
            check=InRunCheck(CheckPolicy()),
            guard=scalertune.Guard(check_every=10),
        )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 6), torch.randn(32, 1)
    amp = runtime()
    model = amp.prepare(model)
    amp.check.on_drift(amp, "a test's drift")
    for _ in range(40):
        amp.train_step(model, optimizer, nn.functional.mse_loss, (x, y))
    torch.save(amp.state_dict(), tmp_path / "amp.pt")
    resumed = runtime()
    resumed.prepare(model)
    resumed.load_state_dict(torch.load(tmp_path / "amp.pt", weights_only=True))
    assert resumed.check.recording and resumed.check._knobs.trace.recorded == 40
    # a logging.config.dictConfig elsewhere in the session disables the loggers there are
    monkeypatch.setattr(logging.getLogger("scalertune"), "disabled", False)
    with caplog.at_level(logging.INFO, logger="scalertune"):
        for _ in range(70):
            resumed.train_step(model, optimizer, nn.functional.mse_loss, (x, y))
    assert not resumed.check.recording  # it chose: its own knobs do as well on this run
    assert resumed.check.actions.done == []
    said = [r.getMessage() for r in caplog.records if "a test's drift" in r.getMessage()]
    assert len(said) == 1 and "its knobs from the scale now do as well as any" in said[0]
    assert resumed.readback.state_dict()["since"][0] == 100  # where its 100 steps were full


def test_float32_after_a_fall_back_disables_the_scaler_and_counts_every_step():
    amp = AmpRuntime(AmpConfig(init_scale=2.0**8), device=CPU, check=InRunCheck())
    _train(amp, 5)
    amp.reconfigure(AmpConfig(dtype="float32"))
    losses, _ = _train(amp, 5)
    assert amp.steps == 10 and all(map(math.isfinite, losses))
    assert not amp.scaler.is_enabled()
    assert amp.state_dict()["config"] == {"dtype": "float32", "clip_norm": None}


def test_knobs_chosen_from_a_trace_restart_under_its_overflow_limit():
    """Gradients of 1e-2 after a collapse to 2**-14: the replay restarts the scale just
    under 65504 / 1e-2, and keeps the run's own interval where that skips nothing more."""
    amax = np.full(100, 1e-2)
    config = AmpConfig(init_scale=2.0**16, growth_interval=2000)
    knobs = choose_knobs(amax, config, scale_now=2.0**-14)
    assert knobs.scale == 2.0 ** math.floor(math.log2(THRESHOLD / 1e-2))
    assert knobs.skipped == 0 and knobs.own_skipped == 0
    assert knobs.headroom < 1 < knobs.own_headroom
    assert knobs.config.dtype == "float16"


def test_the_result_file_carries_the_checks_policy(tmp_path):
    path = str(tmp_path / "amp.yaml")
    write_result({"config": AmpConfig(dtype="bfloat16").to_dict(), "evidence": {}}, path)
    with open(path) as f:
        data = yaml.safe_load(f)
    assert data["check"] == {"every": 100, "action": "act", "window": 5}
    assert list(data) == ["scalertune", "config", "check", "evidence"]
    assert scalertune.load(path, device="cpu").check.policy == CheckPolicy()
    data["check"]["action"] = "warn"
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    assert scalertune.load(path, device="cpu").check.policy.action == "warn"
    assert scalertune.load(path, device="cpu", check="stop").check.policy.action == "stop"
    assert scalertune.load(path, device="cpu", check=False).check is None
    data["check"] = {"every": 0}
    with open(path, "w") as f:
        yaml.safe_dump(data, f)
    with pytest.raises(UsageError, match="every must be an integer from 1 to 2147483647, got 0"):
        scalertune.load(path, device="cpu")
    for key, value in (("every", 10**30), ("window", 10**6)):  # nothing a run could reach
        data["check"] = {key: value}
        with open(path, "w") as f:
            yaml.safe_dump(data, f)
        with pytest.raises(UsageError, match=f"the check's {key} must be an integer from"):
            scalertune.load(path, device="cpu")


def test_the_checks_tolerance_and_z_are_the_users_to_set():
    """1.15x float32's loss over five checks, with little noise: within the default rule
    (1.25x), failing at a tolerance of 0.10; and the rule's z is the policy's too."""
    checks = [Check(i, 1.15 + 0.001 * (i % 2), 1.0) for i in range(5)]
    gap = judge(checks)
    default, tight = CheckPolicy(), CheckPolicy(tolerance=0.10)
    assert not gap.beyond(default.tolerance, default.z) and gap.beyond(tight.tolerance, tight.z)
    assert not gap.beyond(tight.tolerance, gap.z + 1)
    assert CheckPolicy.from_dict(tight.to_dict()) == tight
    with pytest.raises(UsageError, match="tolerance must be a number above 0"):
        CheckPolicy(tolerance=-0.1)


def test_a_loss_that_is_not_a_scalar_is_one_line():
    assert float(loss_value((torch.tensor(2.0), "logits"))) == 2.0
    assert float(loss_value({"loss": torch.tensor(3.0)})) == 3.0
    with pytest.raises(UsageError, match=r"returned a Tensor of shape \(4,\): return the scalar"):
        loss_value(torch.ones(4))


def _study(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="s", storage=url)
    return url


def test_the_runs_record_reaches_its_study(tmp_path):
    url = _study(tmp_path)
    path = str(tmp_path / "amp.yaml")
    write_result(
        {
            "config": AmpConfig(dtype="bfloat16").to_dict(),
            "evidence": {"study": "s", "storage": url},
        },
        path,
    )
    amp = scalertune.load(path, device="cpu")
    _train(amp, 12)
    amp.check.sink.close()
    attrs = optuna.load_study(study_name="s", storage=url).user_attrs
    (key,) = [k for k in attrs if k.startswith(RUN_PREFIX)]
    record = attrs[key]
    assert record["steps"] == 12 and record["yaml"] == path
    assert [c[0] for c in record["checks"]] == [0]
    assert record["config"] == {"dtype": "bfloat16", "clip_norm": None}
    read = RunRecord.from_dict(record)
    assert (
        read.version == VERSION and read.device == "cpu" and read.checks == tuple(amp.check.checks)
    )


def test_a_result_file_rewritten_while_it_loads_gives_the_run_one_version(tmp_path, monkeypatch):
    """Workers finishing together rewrite the YAML (atomically, by rename): a load that
    overlaps it takes its config, its check policy and its study from the bytes it read
    first, never half from each version."""
    path = str(tmp_path / "amp.yaml")
    first, second = _study(tmp_path), f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(study_name="t", storage=second)
    version = {
        "config": AmpConfig(dtype="bfloat16").to_dict(),
        "check": {"every": 3},
        "evidence": {"study": "s", "storage": first},
    }
    write_result(version, path)
    rewrite = str(tmp_path / "amp.next.yaml")
    write_result(
        {
            "config": AmpConfig(dtype="float16", init_scale=64.0).to_dict(),
            "check": {"every": 50},
            "evidence": {"study": "t", "storage": second},
        },
        rewrite,
    )
    real_open, opened = os.open, []

    def open_then_rewrite(name, *args, **kwargs):
        fd = real_open(name, *args, **kwargs)
        if os.fspath(name) == path:
            opened.append(fd)
            if len(opened) == 1:
                os.replace(rewrite, path)  # the next reader finds the other version
        return fd

    monkeypatch.setattr(os, "open", open_then_rewrite)
    amp = scalertune.load(path, device="cpu")
    monkeypatch.undo()
    assert len(opened) == 1
    assert amp.config == AmpConfig(dtype="bfloat16") and amp.check.policy.every == 3
    _train(amp, 4)
    amp.check.sink.close()
    assert [k for k in optuna.load_study(study_name="s", storage=first).user_attrs]
    assert not optuna.load_study(study_name="t", storage=second).user_attrs


def test_an_unreachable_study_never_stops_training(tmp_path, caplog, monkeypatch):
    # a logging.config.dictConfig elsewhere in the session (import-linter's) disables the
    # loggers that exist by then, as it would in a program that calls it
    monkeypatch.setattr(logging.getLogger("scalertune"), "disabled", False)
    path = str(tmp_path / "amp.yaml")
    gone = f"sqlite:///{tmp_path / 'nowhere' / 'study.db'}"
    write_result(
        {
            "config": AmpConfig(dtype="bfloat16").to_dict(),
            "evidence": {"study": "s", "storage": gone},
        },
        path,
    )
    amp = scalertune.load(path, device="cpu")
    with caplog.at_level(logging.WARNING, logger="scalertune"):
        losses, _ = _train(amp, 12)
        amp.check.sink.close()
    assert len(losses) == 12 and all(map(math.isfinite, losses))
    said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(said) == 1 and "amp.report()" in said[0]


class _Gain(nn.Module):
    def __init__(self, gain):
        super().__init__()
        self.gain = gain

    def forward(self, x):
        return x * self.gain


def test_a_collapse_the_guard_would_stop_is_looked_at_first_and_an_overflow_kept_in_float32():
    """A forward that overflows float16 from the start collapses the scale under the guard's
    floor by its first read: acting, the check looks at the next forward before the guard
    stops the run, keeps the module in float32, puts the scale back to the config's, and the
    run trains on; without the check the guard stops it at that read."""
    config = AmpConfig(init_scale=2.0**10)
    guard = scalertune.Guard(min_scale=2.0**9, check_every=5)

    def model():
        return nn.Sequential(nn.Linear(6, 32), _Gain(1e5), _Gain(1e-5), nn.ReLU(), nn.Linear(32, 1))

    with pytest.raises(scalertune.AmpGuardError, match="at step 5"):
        _train(AmpRuntime(config, device=CPU, guard=guard), 20, model=model())
    amp = AmpRuntime(config, device=CPU, guard=guard, check=InRunCheck(CheckPolicy()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, _ = _train(amp, 40, model=model())
    lines = [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]
    assert len(lines) == 1 and "keeping it in float32" in lines[0] and "'1'" in lines[0], lines
    assert amp.config.fp32_modules == ("1",) and amp.scale >= 2.0**9
    assert all(math.isfinite(x) for x in losses[10:])


def test_a_collapse_with_nothing_in_the_forward_is_stopped_by_the_guard_one_read_later():
    """The look finds nothing to keep in float32 (the run is healthy; the floor is what is
    wrong): the guard stops the run at its next read, as it would have at the first."""
    config = AmpConfig(init_scale=2.0**10)
    guard = scalertune.Guard(min_scale=2.0**20, check_every=5)
    amp = AmpRuntime(config, device=CPU, guard=guard, check=InRunCheck(CheckPolicy()))
    with pytest.raises(scalertune.AmpGuardError, match="at step 10"):
        _train(amp, 20)
    assert not amp.check.actions.done


def test_a_scale_collapsed_by_a_burst_of_large_gradients_is_set_back_and_the_run_trains_on():
    """A burst of huge losses (40 steps at 1e30 times the loss) overflows float16's gradients
    at every scale and drives the scale under the guard's floor, with the forward finite
    throughout: without the check the guard stops the run (blaming an activation); checked,
    the scale is set back, one line says what was seen, and the run ends with float32's loss."""

    def run(amp):
        torch.manual_seed(0)
        model = amp.prepare(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator, losses = torch.Generator().manual_seed(0), []
        for step in range(300):
            x = torch.randn(32, 16, generator=generator)
            y = 2 * x[:, :1] + 0.1 * torch.randn(32, 1, generator=generator)
            burst = 1e30 if 100 <= step < 140 else 1.0
            optimizer.zero_grad(set_to_none=True)
            loss = amp.loss(lambda x=x, y=y, b=burst: nn.functional.mse_loss(model(x), y) * b)
            amp.backward(loss)
            amp.step(optimizer)
            losses.append(float(loss) / burst)
        return sum(losses[-50:]) / 50

    guard = scalertune.Guard()
    with pytest.raises(scalertune.AmpGuardError, match="at step 140"):
        run(AmpRuntime(AmpConfig(), device=CPU, guard=guard))
    amp = AmpRuntime(AmpConfig(), device=CPU, guard=guard, check=InRunCheck(CheckPolicy()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked = run(amp)
    lines = [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]
    assert len(lines) == 1 and "the gradients, not an activation, were too large" in lines[0]
    assert "set back to 2**16" in lines[0] and amp.steps == 300
    # the run's count so far, said as such (not as the burst's own length)
    assert re.search(r"fell to \S+ \(\d+ steps skipped so far\)", lines[0]), lines[0]
    assert checked <= 1.10 * run(AmpRuntime(AmpConfig(dtype="float32"), device=CPU))


def test_a_negative_loss_reads_the_same_to_the_check_its_islands_and_the_phases():
    """A Gaussian negative log-likelihood may be below 0: a loss of -1 where float32's is -2
    is worse (1.5x, beyond the rule), and reads so to every rule alike."""
    from scalertune._inrun._gap import relative
    from scalertune._judge._phases import judge_phase

    ours = [-1.0 + 0.01 * (i % 3) for i in range(40)]
    float32 = [-2.0 + 0.01 * (i % 2) for i in range(40)]
    gap = judge([Check(i, o, f) for i, (o, f) in enumerate(zip(ours, float32))])
    phase = judge_phase(ours, float32, start=0, pruned=False)
    assert gap.ratio == pytest.approx(phase.ratio, rel=0.05) and gap.ratio > 1.4
    assert gap.beyond(0.25) and phase.behind
    assert relative(-1.0, -2.0) == 1.5 and relative(-3.0, -2.0) == 0.5  # better: under 1
    assert Check(0, -1.0, -2.0).ratio == 1.5


def test_a_long_runs_record_keeps_its_checks_evenly_over_the_run():
    """5,000 checks (a run of 500,000 steps checked every 100): the record keeps at most
    ``KEPT_CHECKS``, as many from the run's first thousand checks as from its third, so that
    where the gap opened is still in the study's record and in ``amp.report()``."""
    from scalertune._inrun._checker import thinned
    from scalertune._inrun._run_record import KEPT_CHECKS

    checks = []
    for i in range(5000):
        checks.append(Check(i * 100, 1.0, 1.0))
        checks = thinned(checks, 100)
        assert len(checks) <= KEPT_CHECKS
    steps = [c.step for c in checks]
    first, third = (sum(a * 100_000 <= s < (a + 1) * 100_000 for s in steps) for a in (0, 2))
    assert first >= 20 and 0.66 < first / third < 1.5, (first, third)
    assert steps[0] == 0 and steps[-1] == 499_900


def test_the_knobs_trace_takes_one_entry_a_step_with_two_optimizers():
    """``scaler.step`` runs once per optimizer: the trace the knobs are replayed over holds one
    entry per step, the largest gradient of both, as GradScaler decides the step on all."""
    from scalertune._inrun._knobs import GradientTrace

    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 1)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (first, second)]
    amp = AmpRuntime(AmpConfig(init_scale=8.0), device="cpu")
    trace = GradientTrace(steps=10)
    for step in range(3):
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        x = torch.randn(8, 4)
        loss = amp.loss(lambda x=x, k=step + 1: second(first(x) * k).square().mean())
        amp.backward(loss)
        scale = amp.scaler.get_scale()
        largest = max(
            float(p.grad.abs().max()) / scale for m in (first, second) for p in m.parameters()
        )
        for o in optimizers:
            trace.record(amp, o)
            amp.scaler.step(o)
        amp.scaler.update()  # the runtime counts the step here
        assert amp.steps == step + 1 and trace.recorded == step + 1
        assert trace.read()[-1] == pytest.approx(largest, rel=1e-6)


def test_after_an_island_the_check_allows_what_the_island_claimed_or_a_stricter_policys_gap():
    from scalertune._inrun._actions import ISLAND_CLOSES, Actions
    from scalertune._inrun._lines import Action

    for tolerance, after in [(0.25, ISLAND_CLOSES), (0.01, 0.01)]:
        actions = Actions(scalertune.CheckPolicy(tolerance=tolerance))
        assert actions.tolerance() == tolerance
        actions.done.append(Action(step=100, kind="island", line="keeping '2' in float32"))
        assert actions.tolerance() == after
