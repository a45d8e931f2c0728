"""A branch from a float32 checkpoint trains exactly as the reference did from there: the same
weights, optimizer state, schedule, batches and random numbers."""

import pytest
import torch
import workloads
from conftest import example

from scalertune._amp._config import AmpConfig
from scalertune._run._loop import Plan, run_config

CPU = torch.device("cpu")
FLOAT32 = AmpConfig(dtype="float32")


def _scheduled():
    """``healthy`` with an LR schedule its own step function steps, and dropout drawing from
    torch's RNG on every step."""
    parts = workloads.healthy()
    model = torch.nn.Sequential(torch.nn.Dropout(0.2), parts["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)

    def step(model, batch, amp):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = parts["loss_fn"](model(x), y)
        amp.backward(loss)
        if amp.step(optimizer):  # the schedule follows the steps the optimizer took
            schedule.step()
        return loss

    return {
        "model": model,
        "optimizer": optimizer,
        "step": step,
        "batches": parts["batches"],
        "schedulers": [schedule],
    }


@pytest.mark.parametrize(
    "factory",
    [_scheduled, example("classifier").make_model],
    ids=["schedule-and-dropout", "shuffling-dataloader"],
)
def test_a_branch_from_a_checkpoint_replays_the_reference_bit_for_bit(tmp_path, factory):
    whole = run_config(factory, FLOAT32, steps=60, seed=3, device=CPU)
    path = str(tmp_path / "at30.pt")
    first = run_config(
        factory, FLOAT32, steps=30, seed=3, device=CPU, plan=Plan(save_at={30: path})
    )
    assert first.losses == whole.losses[:30]
    branch = run_config(factory, FLOAT32, steps=60, seed=3, device=CPU, plan=Plan(checkpoint=path))
    assert branch.start == 30 and branch.losses == whole.losses[30:]
    again = run_config(factory, FLOAT32, steps=60, seed=3, device=CPU, plan=Plan(checkpoint=path))
    assert again.losses == branch.losses  # the checkpoint is unchanged by a branch from it


def test_a_float16_branch_starts_its_scaler_where_the_plan_puts_it(tmp_path):
    path = str(tmp_path / "at20.pt")
    run_config(
        workloads.healthy, FLOAT32, steps=20, seed=0, device=CPU, plan=Plan(save_at={20: path})
    )
    branch = run_config(
        workloads.healthy,
        AmpConfig(init_scale=2.0**16),
        steps=40,
        seed=0,
        device=CPU,
        plan=Plan(checkpoint=path, scaler={"scale": 256.0, "_growth_tracker": 5}),
    )
    assert branch.initial_scale == 256.0 and branch.scales[0] == 256.0
    assert branch.skipped == []


def test_a_cursor_that_saves_nothing_takes_no_rng_snapshot_and_refuses_to_save():
    from scalertune._run._checkpoint import BatchCursor

    batches = [torch.ones(1) * i for i in range(3)]
    kept, bare = BatchCursor(batches), BatchCursor(batches, saves=False)
    assert [float(next(kept)) for _ in range(5)] == [float(next(bare)) for _ in range(5)]
    assert kept.state()["pass_rng"] is not None and kept.state()["index"] == 2
    with pytest.raises(RuntimeError, match="saves=False"):
        bare.state()
