"""AmpRuntime: the canonical AMP step that trials and training code share."""

import os
import warnings

import pytest
import torch
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpRuntime
from scalertune._inrun import InRunCheck
from scalertune._run._record import skipped_steps


def _model_and_batch(target_scale=1.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(32, 8)
    return model, (x, x.sum(1, keepdim=True) * target_scale)


def test_canonical_step_trains_without_skipping_when_gradients_fit():
    model, batch = _model_and_batch()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    amp = AmpRuntime(AmpConfig(init_scale=256.0), device="cpu")
    losses = [float(amp.train_step(model, opt, nn.functional.mse_loss, batch)) for _ in range(30)]
    assert amp.steps == 30 and amp.skipped_steps == 0
    assert losses[-1] < 0.5 * losses[0]


def test_overflowing_step_is_skipped_counted_and_backs_off_the_scale():
    model, batch = _model_and_batch(target_scale=1e3)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = AmpRuntime(AmpConfig(init_scale=2.0**24), device="cpu")
    amp.train_step(model, opt, lambda o, y: nn.functional.mse_loss(o, y, reduction="sum"), batch)
    assert amp.skipped_steps == 1
    assert float(amp.scale) == 2.0**23
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_clipping_acts_on_unscaled_gradients():
    # With SGD(lr=1) one clipped step moves the weights by exactly clip_norm. Clipping the
    # still-scaled gradients would move them by clip_norm / scale instead.
    model, batch = _model_and_batch(target_scale=10.0)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    amp = AmpRuntime(AmpConfig(init_scale=1024.0, clip_norm=0.5), device="cpu")
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert amp.skipped_steps == 0
    assert float((after - before).norm()) == pytest.approx(0.5, rel=1e-2)


def test_the_gradient_norm_of_the_last_step_is_the_unscaled_one_clipping_saw():
    """What nanoGPT prints each step: ``clip_grad_norm_``'s return, of the unscaled
    gradients, as a plain float32 loop computes it on the same step."""
    model, batch = _model_and_batch(target_scale=10.0)
    theirs = [p.detach().clone().requires_grad_() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    amp = AmpRuntime(AmpConfig(dtype="float32", clip_norm=0.5), device="cpu")
    assert amp.grad_norm is None
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    plain = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    for p, q in zip(plain.parameters(), theirs):
        p.data.copy_(q)
    nn.functional.mse_loss(plain(batch[0]), batch[1]).backward()
    assert float(amp.grad_norm) == float(nn.utils.clip_grad_norm_(plain.parameters(), 0.5))
    scaled = AmpRuntime(AmpConfig(init_scale=1024.0, clip_norm=0.5), device="cpu")
    scaled.train_step(
        plain, torch.optim.SGD(plain.parameters(), lr=0.0), nn.functional.mse_loss, batch
    )
    assert float(scaled.grad_norm) == pytest.approx(float(amp.grad_norm), rel=1e-2)
    assert AmpRuntime(AmpConfig(), device="cpu").grad_norm is None  # no clipping


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_bfloat16_and_float32_run_without_a_scaler(dtype):
    model, batch = _model_and_batch()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    amp = AmpRuntime(AmpConfig(dtype=dtype), device="cpu")
    assert not amp.scaler.is_enabled()
    with amp.autocast():
        out = model(batch[0])
    assert out.dtype == getattr(torch, dtype)
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    assert float(amp.scale) == 1.0 and amp.skipped_steps == 0


def test_state_dict_round_trip_keeps_scale_and_counters():
    model, batch = _model_and_batch(target_scale=1e3)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    amp = AmpRuntime(AmpConfig(init_scale=2.0**24), device="cpu")
    summed = lambda o, y: nn.functional.mse_loss(o, y, reduction="sum")  # noqa: E731
    for _ in range(3):
        amp.train_step(model, opt, summed, batch)
    restored = AmpRuntime(AmpConfig(init_scale=2.0**24), device="cpu")
    restored.load_state_dict(amp.state_dict())
    assert (restored.steps, restored.skipped_steps) == (amp.steps, amp.skipped_steps)
    assert restored.scaler.get_scale() == amp.scaler.get_scale()


def test_unknown_or_missing_device_is_a_usage_error():
    with pytest.raises(scalertune.UsageError, match="unknown device"):
        AmpRuntime(AmpConfig(), device="tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(scalertune.UsageError, match="no CUDA"):
            AmpRuntime(AmpConfig(), device="cuda")


def _optimizers():
    class Unhooked(torch.optim.SGD):
        """Steps without running the optimizer's step hooks (a wrapper that bypasses them)."""

        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)
            # SGD's step under its no_grad wrapper, without the hook wrapper that the first
            # SGD built puts around it (none may have been built yet in this process)
            raw = torch.optim.SGD.step
            raw = raw.__wrapped__ if getattr(raw, "hooked", False) else raw
            self.step = lambda *args, **kw: raw(self, *args, **kw)

    return {
        "sgd": lambda p: torch.optim.SGD(p, lr=1e-4),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
        "fused-adam": lambda p: torch.optim.Adam(p, lr=1e-3, fused=True),
        "hooks-bypassed": lambda p: Unhooked(p, lr=1e-4),
    }


@pytest.mark.parametrize("kind", list(_optimizers()))
def test_skipped_steps_are_the_steps_whose_scale_backed_off_for_every_optimizer(kind, monkeypatch):
    # Gradients of about 1e3 at 2**24 back off for a start-up, then the scale grows every 5
    # steps and overflows again: skips early and late, counted on the host where GradScaler
    # decides there (SGD, Adam), on the device for fused Adam, which skips in its kernel.
    model, batch = _model_and_batch(target_scale=1e3)
    opt = _optimizers()[kind](model.parameters())
    amp = AmpRuntime(
        AmpConfig(init_scale=2.0**24, growth_interval=5),
        device="cpu",
        guard=scalertune.Guard(max_consecutive_skips=100),
    )
    scales = []
    for _ in range(60):
        amp.train_step(
            model, opt, lambda o, y: nn.functional.mse_loss(o, y, reduction="sum"), batch
        )
        scales.append(float(amp.scale))
    skipped = skipped_steps(scales, 2.0**24)
    assert amp.skipped_steps == len(skipped) > 20 and skipped[-1] > 30
    with monkeypatch.context() as patched:  # the count the device holds is not read from it
        patched.setattr(torch.Tensor, "item", lambda self: pytest.fail("a host read"))
        on_device = amp.skipped_on_device
    assert on_device.dtype == torch.int64 and int(on_device) == amp.skipped_steps
    restored = AmpRuntime(AmpConfig(init_scale=2.0**24, growth_interval=5), device="cpu")
    restored.load_state_dict(amp.state_dict())
    assert restored.skipped_steps == amp.skipped_steps


@pytest.mark.parametrize("kind", list(_optimizers()))
def test_step_says_whether_the_optimizer_really_stepped(kind):
    # True exactly on the steps whose weights moved (GradScaler applied the update); for fused
    # Adam, which skips inside its kernel, bool() of the answer reads the device.
    model, batch = _model_and_batch(target_scale=1e3)
    opt = _optimizers()[kind](model.parameters())
    amp = AmpRuntime(AmpConfig(init_scale=2.0**24, growth_interval=5), device="cpu")
    summed = lambda o, y: nn.functional.mse_loss(o, y, reduction="sum")  # noqa: E731
    said, moved = [], []
    for _ in range(40):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = summed(model(batch[0]), batch[1])
        amp.backward(loss)
        said.append(bool(amp.step(opt)))
        moved.append(any(not torch.equal(a, b) for a, b in zip(before, model.parameters())))
    assert said == moved and said.count(False) == amp.skipped_steps > 10


def test_a_step_function_steps_its_schedule_only_after_real_steps_without_a_warning():
    # PyTorch warns "Detected call of lr_scheduler.step() before optimizer.step()" when a
    # schedule is stepped after a skipped first step; stepped on amp.step's answer it is not
    model, batch = _model_and_batch(target_scale=1e3)
    made = []

    def factory():
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
        made.append(schedule)

        def step(model, batch, amp):
            optimizer.zero_grad(set_to_none=True)
            with amp.autocast():
                loss = nn.functional.mse_loss(model(batch[0]), batch[1], reduction="sum")
            amp.backward(loss)
            if amp.step(optimizer):
                schedule.step()
            return loss

        return {
            "model": model,
            "optimizer": optimizer,
            "step": step,
            "batches": [batch],
            "schedulers": [schedule],
        }

    from scalertune._run._loop import run_config

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record = run_config(
            factory,
            AmpConfig(init_scale=2.0**24, growth_interval=5),
            steps=30,
            seed=0,
            device=torch.device("cpu"),
        )
    skipped = len(skipped_steps(record.scales, 2.0**24))
    assert skipped > 5 and made[-1].last_epoch == 30 - skipped  # once per real step


def test_a_scaler_that_a_framework_steps_counts_its_skips_and_runs_the_guard():
    # Accelerate's optimizer and Lightning's precision plugin call scaler.step and
    # scaler.update themselves: the runtime's scaler counts those steps as its own.
    model, batch = _model_and_batch(target_scale=1e3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    amp = AmpRuntime(
        AmpConfig(init_scale=2.0**24, growth_interval=5),
        device="cpu",
        guard=scalertune.Guard(min_scale=2.0**10, check_every=10),
    )
    scales = []
    with pytest.raises(scalertune.AmpGuardError, match="scale"):
        for _ in range(60):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(batch[0]), batch[1], reduction="sum")
            amp.scaler.scale(loss).backward()
            amp.scaler.step(opt)
            amp.scaler.update()
            scales.append(amp.scaler.get_scale())
    # the guard's check after step 20 raised from inside that step's update()
    assert amp.steps == len(scales) + 1 == 20
    assert amp.skipped_steps == len(skipped_steps(scales, 2.0**24)) + 1 > 10


def test_a_scale_set_between_steps_is_no_step_and_its_scaler_shadows_none_of_torchs_names():
    # The in-run check sets a scale in place (GradScaler's update(new_scale)); the runtime's
    # scaler reports updates, and this one must not count as a step taken.
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from scalertune._amp._scaler import sharded_scaler

    model, batch = _model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = AmpRuntime(AmpConfig(init_scale=256.0), device="cpu")
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    amp.reconfigure(AmpConfig(init_scale=256.0, growth_interval=7), scale=32.0)
    assert amp.steps == 1 and amp.scaler.get_scale() == 32.0
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    assert amp.steps == 2 and amp.scaler.get_growth_interval() == 7
    for torch_class in (torch.amp.GradScaler, ShardedGradScaler):
        torchs = set(vars(torch_class("cpu")))
        ours = set(vars(amp.scaler)) - set(vars(torch.amp.GradScaler("cpu")))
        assert ours and not ours & torchs, ours & torchs
    assert issubclass(sharded_scaler(), ShardedGradScaler)


def test_a_step_reads_the_device_no_more_than_a_hand_written_amp_step(monkeypatch):
    # GradScaler reads its inf/NaN flag to decide whether to step (and Adam reads its step
    # counts); the runtime's own bookkeeping, skipped steps included, adds no read.
    model, batch = _model_and_batch()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    amp = AmpRuntime(AmpConfig(init_scale=256.0), device="cpu")
    amp.train_step(model, opt, nn.functional.mse_loss, batch)  # the hook is checked once
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    reads = {"n": 0}
    item = torch.Tensor.item

    def counted(self):
        reads["n"] += 1
        return item(self)

    def hand_written():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    monkeypatch.setattr(torch.Tensor, "item", counted)
    for _ in range(20):
        hand_written()
    hand, reads["n"] = reads["n"], 0
    for _ in range(20):
        amp.train_step(model, opt, nn.functional.mse_loss, batch)
    assert (amp.steps, amp.skipped_steps) == (21, 0)
    assert reads["n"] == hand > 0


@pytest.mark.parametrize("kind", ["adam", "fused-adam"])
def test_the_guard_stops_a_run_that_skips_every_step(kind):
    model, batch = _model_and_batch(target_scale=1e3)
    opt = _optimizers()[kind](model.parameters())
    amp = AmpRuntime(
        AmpConfig(init_scale=2.0**24),
        device="cpu",
        guard=scalertune.Guard(max_consecutive_skips=15, check_every=5),
    )
    with pytest.raises(scalertune.AmpGuardError, match="at step 15.*after 15 skipped steps"):
        for _ in range(40):
            amp.train_step(
                model, opt, lambda o, y: 1e6 * nn.functional.mse_loss(o, y, reduction="sum"), batch
            )


def test_writers_of_the_same_result_file_at_once_never_trip_over_each_others_temporary(tmp_path):
    # Workers that finish together write the same YAML: one shared ".tmp" name was renamed
    # away under another writer (FileNotFoundError in CI's three-worker test).
    import threading

    import yaml

    from scalertune._amp._schema import write_result

    path, errors = str(tmp_path / "shared.yaml"), []

    def write(i):
        try:
            for _ in range(20):
                write_result({"config": AmpConfig(init_scale=2.0**i).to_dict()}, path)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert yaml.safe_load((tmp_path / "shared.yaml").read_text())["config"]["dtype"] == "float16"
    assert [p.name for p in tmp_path.iterdir()] == ["shared.yaml"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_accelerator_readings_record_what_the_cpu_readings_do(dtype, monkeypatch):
    # On a CPU each step's loss and scale are read with item(); on an accelerator they are
    # copied into device buffers and read once per window. Forced onto the CPU, that second
    # path must give the same record, skipped steps and all (init_scale 2**20 overflows
    # this workload's first steps).
    import workloads

    from scalertune._run import _loop

    config = (
        AmpConfig(init_scale=2.0**20, growth_interval=7)
        if dtype == "float16"
        else AmpConfig(dtype=dtype)
    )

    def record():
        return _loop.run_config(
            workloads.gradient_overflow, config, steps=45, seed=0, device=torch.device("cpu")
        )

    on_cpu = record()
    monkeypatch.setattr(_loop, "HOST_READS", ())
    on_device = record()
    assert on_device.losses == on_cpu.losses and on_device.scales == on_cpu.scales
    assert len(on_cpu.losses) == 45
    if dtype == "float16":
        assert on_cpu.skipped and on_cpu.skipped == on_device.skipped
        scales = on_cpu.scales
        assert any(later > earlier for earlier, later in zip(scales, scales[1:]))  # it grew
    else:
        assert set(on_cpu.scales) == {1.0}


def test_the_yaml_a_picture_and_a_checkpoint_are_never_written_through_a_planted_link(
    tmp_path, monkeypatch
):
    """Whoever can write the output folder or the store may leave links at the names a
    writer would use for its temporary file (they were the pid and the thread): every writer
    creates its own file instead, so the link's target is untouched and the result is a
    regular file whole in place."""
    import secrets

    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from scalertune._amp._schema import write_result
    from scalertune._review._plots import save_figure
    from scalertune._run._checkpoint_file import read_checkpoint, write_checkpoint

    victim = tmp_path / "victim.txt"
    victim.write_text("left alone")
    guesses = iter(["a" * 12, "b" * 12] * 3)  # the first name a writer tries is planted
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(guesses))
    state = {"step": 3, **{part: {} for part in ("model", "optimizer", "cursor", "rng")}}
    state.update(schedulers=[], ranks=None, extra={})
    for name, write in (
        ("amp.yaml", lambda p: write_result({"config": AmpConfig().to_dict()}, p)),
        ("amp.png", lambda p: save_figure(plt.figure(), p)),
        ("ck.pt", lambda p: write_checkpoint(state, p)),
    ):
        path = tmp_path / name
        os.symlink(victim, f"{path}.{'a' * 12}.tmp")
        write(str(path))
        assert victim.read_text() == "left alone", name
        assert path.is_file() and not path.is_symlink(), name
        assert not (tmp_path / f"{name}.{'b' * 12}.tmp").exists()
    assert scalertune.load(str(tmp_path / "amp.yaml"), device="cpu").config == AmpConfig()
    assert read_checkpoint(str(tmp_path / "ck.pt"))["step"] == 3
    assert (tmp_path / "amp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_result_file_warns_once_when_its_runtime_trains_another_model(tmp_path):
    """evidence.model is the searched model's fingerprint (names and shapes, whatever wraps
    it): the runtime loaded from the file warns once, in one line, on the first step of a
    model with another layer, and says nothing for the model it was searched on."""
    import yaml

    from scalertune._amp._fingerprint import fingerprint

    searched, batch = _model_and_batch()
    assert fingerprint(nn.DataParallel(searched)) == fingerprint(searched)  # `module.` left out
    path = tmp_path / "amp.yaml"
    document = {"config": {"dtype": "bfloat16"}, "evidence": {"model": fingerprint(searched)}}
    path.write_text(yaml.safe_dump(document))
    loss = nn.functional.mse_loss
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = scalertune.load(str(path), device="cpu")
        same.train_step(searched, torch.optim.SGD(searched.parameters(), lr=0.01), loss, batch)
    other = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    amp = scalertune.load(str(path), device="cpu")
    optimizer = torch.optim.SGD(other.parameters(), lr=0.01)
    with pytest.warns(UserWarning) as caught:
        for _ in range(3):
            amp.train_step(other, optimizer, loss, batch)
    (warning,) = caught
    assert str(warning.message) == (
        f"{path} was searched on another model (4 parameter tensors, 161 values; this one has "
        "4 parameter tensors, 321 values, named or shaped otherwise): its config and "
        "predictions are that model's; search this one (scalertune search) before relying "
        "on them"
    )
    assert warning.filename == __file__


def _cut_before(path, line):
    """``path`` cut short just before ``line`` (as a full disk or a copy stopped midway
    leaves it): still valid YAML, lacking what followed."""
    text = path.read_text()
    cut = path.with_name("cut.yaml")
    cut.write_text(text[: text.index(line + "\n")])
    return cut


def test_a_result_file_cut_short_is_refused_in_one_line_naming_what_it_lost(tmp_path):
    """A real result file, cut just before its ``evidence.model`` (still valid YAML): load
    and attach refuse it in one line that names what is missing, where it loaded silently
    and the other-model warning went quiet; the whole file loads, and a file written before
    the promise of its last line reads as it did."""
    from scalertune._amp._fingerprint import fingerprint
    from scalertune._amp._schema import PROMISE_LINE, write_result
    from scalertune._errors import UsageError

    searched, _ = _model_and_batch()
    evidence = {"study": "s", "model": fingerprint(searched), "verdict": "train in bfloat16"}
    whole = tmp_path / "amp.yaml"
    write_result({"config": {"dtype": "bfloat16"}, "evidence": evidence}, str(whole))
    assert scalertune.load(str(whole), device="cpu").config.dtype == "bfloat16"
    cut = _cut_before(whole, "  model:")
    with pytest.raises(UsageError) as refused:
        scalertune.load(str(cut), device="cpu")
    said = str(refused.value)
    assert "\n" not in said and "was cut short" in said and "it has no evidence.model" in said
    # the command that writes it again names the study the file still names
    assert "scalertune report --storage STORAGE --study-name s -o " in said
    accelerate = pytest.importorskip("accelerate")
    with pytest.raises(UsageError, match="it has no evidence.model"):
        scalertune.attach(accelerate.Accelerator(cpu=True), str(cut))
    old = tmp_path / "old.yaml"  # no promise in its header: read as it is
    old.write_text(cut.read_text().replace(PROMISE_LINE + "\n", ""))
    assert scalertune.load(str(old), device="cpu").config.dtype == "bfloat16"


def test_a_run_rolled_back_past_its_fall_back_to_float32_scales_its_loss_again():
    """The in-run check fell back to float32, then the run loads a checkpoint from before:
    float16 again, with its scaler on at the checkpoint's scale (not float16 unscaled)."""
    model, batch = _model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = AmpRuntime(AmpConfig(init_scale=1024.0), device="cpu", check=InRunCheck())
    for _ in range(3):
        amp.train_step(model, opt, nn.functional.mse_loss, batch)
    before = amp.state_dict()
    amp.reconfigure(AmpConfig(dtype="float32"))
    amp.train_step(model, opt, nn.functional.mse_loss, batch)
    assert not amp.scaler.is_enabled() and float(amp.scale) == 1.0 and amp.steps == 4
    amp.load_state_dict(before)
    assert amp.config.dtype == "float16" and amp.scaler.is_enabled() and amp.steps == 3
    opt.zero_grad(set_to_none=True)
    amp.backward(amp.loss(lambda: nn.functional.mse_loss(model(batch[0]), batch[1])))
    scaled = model[0].weight.grad.clone()
    assert amp.step(opt) and amp.steps == 4 and amp.scaler.get_scale() == 1024.0
    opt.zero_grad(set_to_none=True)
    with amp.autocast():
        nn.functional.mse_loss(model(batch[0]), batch[1]).backward()
    ratio = float((scaled / model[0].weight.grad).nanmean())
    assert ratio == pytest.approx(1024.0, rel=0.05)


def test_a_runtime_made_without_a_scaler_refuses_a_config_with_one():
    amp = AmpRuntime(AmpConfig(dtype="bfloat16"), device="cpu")
    with pytest.raises(scalertune.UsageError, match="made without a loss scaler"):
        amp.reconfigure(AmpConfig(dtype="float16"))


FSDP1_SCRIPT = """
import os, torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from scalertune import AmpConfig, AmpRuntime
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
saved = AmpRuntime(AmpConfig(init_scale=4096.0), device="cpu")
saved.load_scaler_state({"scale": 256.0})
state = saved.state_dict()
state["steps"] = 14
loaded = AmpRuntime(AmpConfig(init_scale=4096.0), device="cpu")
loaded.load_state_dict(state)
model = loaded.prepare(FSDP(nn.Linear(4, 1), device_id=torch.device("cpu")))
print(type(loaded.scaler).__name__, loaded.scaler.get_scale(), loaded.steps)
config = AmpConfig(init_scale=4096.0, growth_interval=50)
told = AmpRuntime(AmpConfig(init_scale=4096.0), device="cpu")
told.reconfigure(config, scale=64.0)
told.prepare(FSDP(nn.Linear(4, 1), device_id=torch.device("cpu")))
print(type(told.scaler).__name__, told.scaler.get_scale(), told.scaler.get_growth_interval())
dist.destroy_process_group()
"""


def test_an_fsdp1_model_prepared_after_a_checkpoint_or_a_set_scale_keeps_them(tmp_path):
    """FSDP1 takes ShardedGradScaler at prepare: a checkpoint loaded before (steps 14) or a
    scale set before carries over to it, instead of a plain GradScaler kept (each rank
    skipping on its own shard) or the scale lost."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "fsdp1.py"
    script.write_text(FSDP1_SCRIPT)
    ran = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PORT": str(port)},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n")[:2] == [
        "ShardedRuntimeScaler 256.0 14",
        "ShardedRuntimeScaler 64.0 50",
    ]


def test_the_scale_reads_where_the_scaler_starts_before_its_first_step_and_1_without_one():
    amp = AmpRuntime(AmpConfig(init_scale=4096.0), device="cpu")
    assert float(amp.scale) == 4096.0
    amp.reconfigure(AmpConfig(init_scale=4096.0), scale=64.0)
    assert float(amp.scale) == 64.0 == amp.scaler.get_scale()
    assert float(AmpRuntime(AmpConfig(dtype="bfloat16"), device="cpu").scale) == 1.0


def test_a_scale_set_in_place_grows_a_whole_growth_interval_later():
    """The in-run check's knobs are replayed from the scale they set, with no clean step
    counted yet: the run must grow when the replay says, not sooner."""
    model, batch = _model_and_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = AmpConfig(init_scale=256.0, growth_interval=3)
    amp = AmpRuntime(config, device="cpu")
    for _ in range(2):  # two clean steps toward a growth at the third
        amp.train_step(model, opt, nn.functional.mse_loss, batch)
    amp.reconfigure(config, scale=64.0)
    scales = []
    for _ in range(3):
        amp.train_step(model, opt, nn.functional.mse_loss, batch)
        scales.append(float(amp.scale))
    assert amp.skipped_steps == 0 and scales == [64.0, 64.0, 128.0]


def test_clipping_takes_a_param_group_added_later_and_a_new_optimizer_alike():
    model, batch = _model_and_batch(target_scale=10.0)
    first, second = list(model[0].parameters()), list(model[2].parameters())
    amp = AmpRuntime(AmpConfig(init_scale=16.0, clip_norm=1e-3), device="cpu")

    def norm_after_step(optimizer, params):
        optimizer.zero_grad(set_to_none=True)
        amp.train_step(model, optimizer, nn.functional.mse_loss, batch)
        return float(torch.nn.utils.get_total_norm([p.grad for p in params]))

    optimizer = torch.optim.SGD(first, lr=0.0)
    assert norm_after_step(optimizer, first) <= 1e-3 * 1.001
    optimizer.add_param_group({"params": second})
    assert norm_after_step(optimizer, first + second) <= 1e-3 * 1.001
    for _ in range(3):  # optimizers made and freed: a new one may take a freed one's id
        optimizer = torch.optim.SGD(second, lr=0.0)
        assert norm_after_step(optimizer, second) <= 1e-3 * 1.001
    assert amp.skipped_steps == 0


def test_a_run_resumed_under_another_config_than_it_was_made_with_says_which_it_keeps():
    """A new user resumed a bfloat16 run's checkpoint with a float16 YAML attached: the run
    went on in bfloat16, as the run it resumes, and nothing said the YAML was not used."""
    from scalertune._inrun._build import in_run_check

    def runtime(config):
        return AmpRuntime(config, device="cpu", check=in_run_check(None, None))

    state = runtime(AmpConfig(dtype="bfloat16", fp32_modules=("2",))).state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same config: nothing said
        runtime(AmpConfig(dtype="bfloat16", fp32_modules=("2",))).load_state_dict(state)
    other = runtime(AmpConfig(dtype="float16"))
    with pytest.warns(UserWarning) as said:
        other.load_state_dict(state)
    (line,) = [str(w.message) for w in said if "made with" in str(w.message)]
    assert line.startswith("scalertune: the run this state is from was made with bfloat16")
    assert "this runtime with float16" in line and other.config.dtype == "bfloat16"


def test_a_run_resumed_after_the_checks_knobs_watches_as_the_run_it_resumes():
    """The in-run check changed the scaler's knobs (and gave the watch their prediction): a
    run resumed from a checkpoint after that goes on from there, as the uninterrupted run
    does, and takes no action that run did not."""
    import copy

    from scalertune import Guard
    from scalertune._amp._watch import ScalerPrediction, Watch

    predicted = ScalerPrediction(
        horizon=200, skipped_steps=0, min_scale=2.0**14, final_scale=2.0**14
    )

    def runtime():  # growth every 10 steps: skips far more often than the search predicted
        return AmpRuntime(
            AmpConfig(init_scale=2.0**14, growth_interval=10),
            device="cpu",
            check=InRunCheck(scalertune.CheckPolicy(), prediction=predicted),
            watch=Watch(predicted, check_every=10),
            guard=Guard(check_every=10),
        )

    def model_and_optimizer(state=None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        if state is not None:
            model.load_state_dict(state[0])
            optimizer.load_state_dict(state[1])
        return model, optimizer

    torch.manual_seed(1)
    batch = (torch.randn(32, 6), 3e2 * torch.randn(32, 1))  # gradients far past the prediction
    model, optimizer = model_and_optimizer()
    amp = runtime()
    model = amp.prepare(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(600):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batch)
        saved = copy.deepcopy((model.state_dict(), optimizer.state_dict(), amp.state_dict()))
        for _ in range(400):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batch)
        model2, optimizer2 = model_and_optimizer(saved)
        resumed = runtime()
        model2 = resumed.prepare(model2)
        resumed.load_state_dict(saved[2])
        for _ in range(400):
            resumed.train_step(model2, optimizer2, nn.functional.mse_loss, batch)
    ran = [(a.step, a.kind) for a in amp.check.actions.done]
    assert ran and ran[0][1] == "knobs" and ran[0][0] < 600, ran  # before the checkpoint
    assert [(a.step, a.kind) for a in resumed.check.actions.done] == ran
    assert resumed.readback.watch.prediction == amp.readback.watch.prediction != predicted
    assert resumed.readback.state_dict() == amp.readback.state_dict()  # counts from there
