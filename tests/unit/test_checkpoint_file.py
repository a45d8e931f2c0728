"""A checkpoint file holds tensors and plain data, and reading one runs nothing in it: what real
optimizers, schedulers and trainers save reads back bit for bit with ``weights_only=True``; a
pickle that asks for anything else, another model's checkpoint or a file of another format is
damaged evidence in one line, never code run and never a crash."""

import io
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
import trainers
import workloads
from fault_launcher import Planted, _foreign_body

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedCheckpoint, UsageError
from scalertune._run._checkpoint import BatchCursor, load_checkpoint
from scalertune._run._checkpoint_file import read_checkpoint
from scalertune._run._loop import Plan, run_config
from scalertune._workload._factory import build_workload

CPU = torch.device("cpu")
FLOAT32 = AmpConfig(dtype="float32")
OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.02),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.1),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9, nesterov=True),
}


def _with(optimizer):
    """``healthy`` under ``optimizer``, a LambdaLR its step steps, and NumPy drawing in it."""

    def factory():
        parts = workloads.healthy()
        model = parts["model"]
        opt = OPTIMIZERS[optimizer](model.parameters())
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.97**step)

        def step(model, batch, amp):
            x, y = batch
            opt.zero_grad(set_to_none=True)
            with amp.autocast():
                loss = parts["loss_fn"](model(x * float(np.random.uniform(0.9, 1.1))), y)
            amp.backward(loss)
            if amp.step(opt):
                schedule.step()
            return loss

        return {
            "model": model,
            "optimizer": opt,
            "step": step,
            "batches": parts["batches"],
            "schedulers": [schedule],
        }

    return factory


def _branch_replays(factory, tmp_path, at, end):
    whole = run_config(factory, FLOAT32, steps=end, seed=1, device=CPU)
    path = str(tmp_path / "at.pt")
    run_config(factory, FLOAT32, steps=at, seed=1, device=CPU, plan=Plan(save_at={at: path}))
    branch = run_config(factory, FLOAT32, steps=end, seed=1, device=CPU, plan=Plan(checkpoint=path))
    assert branch.start == at and branch.losses == whole.losses[at:]
    return path


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_real_optimizers_and_a_lambda_schedule_read_back_bit_for_bit_with_weights_only(
    tmp_path, optimizer
):
    path = _branch_replays(_with(optimizer), tmp_path, 12, 24)
    state = torch.load(path, weights_only=True)  # nothing but torch's own allowlist
    assert state["schedulers"][0]["last_epoch"] > 0 and state["optimizer"]["state"]


@pytest.mark.parametrize(
    "factory",
    [trainers.hf_trainer, trainers.lightning_parts, trainers.accelerate_parts],
    ids=["hf-trainer", "lightning", "accelerate"],
)
def test_the_trainers_checkpoints_read_back_bit_for_bit_with_weights_only(tmp_path, factory):
    _branch_replays(factory, tmp_path, 6, 10)


def test_a_resumed_run_reads_its_record_scaler_and_trace_back_from_plain_data(tmp_path):
    """The reference's own resume: the record, the scaler and the watcher's state."""
    whole = run_config(workloads.healthy, AmpConfig(), steps=40, seed=0, device=CPU)
    path = str(tmp_path / "at20.pt")
    run_config(
        workloads.healthy, AmpConfig(), steps=20, seed=0, device=CPU, plan=Plan(save_at={20: path})
    )
    resumed = run_config(
        workloads.healthy,
        AmpConfig(),
        steps=40,
        seed=0,
        device=CPU,
        plan=Plan(checkpoint=path, resume=True),
    )
    assert resumed.losses == whole.losses and resumed.scales == whole.scales
    assert resumed.config == whole.config


def _load_into_healthy(path):
    workload = build_workload(workloads.healthy, seed=0, device=CPU)
    return load_checkpoint(path, workload, BatchCursor(workload.batches))


def test_a_planted_pickle_never_runs_and_is_damaged_in_one_line(tmp_path):
    mark = tmp_path / "ran"
    path = str(tmp_path / "planted.pt")
    torch.save({"step": 20, "model": Planted(f"touch {mark}")}, path)
    with pytest.raises(DamagedCheckpoint) as caught:
        _load_into_healthy(path)
    assert not mark.exists()
    message = str(caught.value)
    assert "\n" not in message and "planted.pt is damaged" in message
    assert "posix.system" in message and "weights_only" not in message


def test_a_checkpoint_of_another_model_is_damaged_not_a_crash(tmp_path):
    path = tmp_path / "other.pt"
    path.write_bytes(_foreign_body(3))
    with pytest.raises(DamagedCheckpoint, match="saved from another model"):
        _load_into_healthy(str(path))


@pytest.mark.parametrize(
    "body, why",
    [
        (b"", "not a file torch.save wrote"),
        (b"PK\x03\x04 not really a zip", "not a file torch.save wrote"),
        (pickle.dumps({"step": 20}, protocol=4), "asks for more than tensors"),
        ({"step": 20}, "it has no model, optimizer"),
        ([1, 2, 3], "holds a list"),
        ({"step": "20"}, "no model"),
    ],
    ids=["empty", "other-format", "a-raw-pickle", "parts-missing", "a-list", "step-not-a-number"],
)
def test_a_file_that_is_not_a_checkpoint_is_damaged(tmp_path, body, why):
    """... in one line: nothing of torch's own (a warning about the pickle) comes before it."""
    path = tmp_path / "bad.pt"
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        torch.save(body, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DamagedCheckpoint, match=why) as caught:
            read_checkpoint(str(path))
    assert "\n" not in str(caught.value)


def test_a_checkpoint_of_another_step_than_its_manifest_names_is_damaged(tmp_path):
    path = str(tmp_path / "at10.pt")
    run_config(
        workloads.healthy, FLOAT32, steps=10, seed=0, device=CPU, plan=Plan(save_at={10: path})
    )
    assert read_checkpoint(path, step=10, mmap=True)["step"] == 10
    with pytest.raises(DamagedCheckpoint, match="holds step 10, not step 30"):
        read_checkpoint(path, step=30)


def test_a_state_that_a_checkpoint_cannot_hold_is_refused_when_saved_naming_where(tmp_path):
    class Schedule:
        def state_dict(self):
            return {"best": np.float64(0.5)}

        def load_state_dict(self, state):
            pass

    def factory():
        return {**workloads.healthy(), "schedulers": [Schedule()]}

    path = str(tmp_path / "at10.pt")
    with pytest.raises(UsageError, match=r"\['schedulers'\]\[0\]\['best'\] is a numpy.float64"):
        run_config(factory, FLOAT32, steps=10, seed=0, device=CPU, plan=Plan(save_at={10: path}))
    assert not os.listdir(tmp_path)  # nothing half-written


def test_numpys_random_state_is_saved_as_plain_data_and_put_back():
    from scalertune._workload._rng import rng_state, set_rng_state

    state = rng_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    first = np.random.uniform(size=3)
    set_rng_state(torch.load(buffer, weights_only=True))
    assert (np.random.uniform(size=3) == first).all()


@pytest.mark.parametrize("kind", ["link", "fifo", "folder", "large"])
def test_a_trainers_state_file_that_is_no_plain_file_is_refused_in_one_line_at_once(tmp_path, kind):
    """The runtime's state in a Trainer's or an Accelerator's checkpoint folder is read once,
    from a regular file, not through a link, bounded: a link to another file, a FIFO (which
    torch.load waited on forever) or a huge file in its place is one line, and nothing read."""
    from scalertune import AmpRuntime
    from scalertune._frameworks import _state_file

    saved = AmpRuntime(AmpConfig(init_scale=1024.0), device="cpu")
    _state_file.save_state(saved, str(tmp_path))
    restored = AmpRuntime(AmpConfig(), device="cpu")
    _state_file.load_state(restored, str(tmp_path), stacklevel=1)
    assert restored.scaler.get_scale() == 1024.0
    assert os.listdir(tmp_path) == [_state_file.STATE_FILE]  # nothing left beside it

    path = tmp_path / _state_file.STATE_FILE
    elsewhere = tmp_path / "elsewhere.pt"
    path.rename(elsewhere)
    if kind == "link":
        path.symlink_to(elsewhere)
        said = "is a symbolic link"
    elif kind == "fifo":
        os.mkfifo(path)
        said = "is not a regular file"
    elif kind == "folder":
        path.mkdir()
        said = "is not a regular file"
    else:
        with open(path, "wb") as f:
            f.truncate(_state_file.MAX_STATE_BYTES + 1)
        said = "is larger than 64 MiB"
    fresh = AmpRuntime(AmpConfig(), device="cpu")
    with pytest.raises(UsageError) as refused:
        _state_file.load_state(fresh, str(tmp_path), stacklevel=1)
    assert str(refused.value) == (
        f"the runtime's state {path} {said}: delete it to resume with the config the run was "
        "attached with"
    )
    assert fresh.scaler.get_scale() == AmpConfig().init_scale
    if kind == "folder":  # nor is one written over it
        with pytest.raises(UsageError) as refused:
            _state_file.save_state(saved, str(tmp_path))
        assert str(refused.value) == (
            f"cannot write the runtime's state {path}: Is a directory: remove the folder of "
            "that name"
        )
        assert sorted(os.listdir(tmp_path)) == ["elsewhere.pt", _state_file.STATE_FILE]
