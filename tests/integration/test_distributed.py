"""Runs as ranks of a torch.distributed group (--nproc-per-node), checked against a plain
GradScaler loop of the same factory under torchrun, on CPU with gloo and 2 processes."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import run_cli, spec

from scalertune._amp._config import AmpConfig
from scalertune._processes._protocol import RankFailed, TrialCrashed
from scalertune._search._launch import run_isolated, time_isolated
from tests import distributed_workloads

STEPS = 30
CONFIG = {
    "dtype": "float16",
    "init_scale": 2.0**16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 5,
}
FACTORIES = ("ddp", "fsdp2", "fsdp1")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The yardstick: the user's own loop of each factory, under torchrun (one launch)."""
    out = tmp_path_factory.mktemp("plain") / "plain.json"
    _torchrun(json.dumps(CONFIG), str(STEPS), str(out), *FACTORIES, timeout=180)
    return json.loads(out.read_text())


def _torchrun(*args, timeout):
    """``tests/distributed_workloads.py ARGS`` as 2 processes under torchrun."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [distributed_workloads.HERE, *args],
        timeout=timeout,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    # the ranks' own words when torchrun fails: CalledProcessError alone shows none of them
    assert done.returncode == 0, f"torchrun exited {done.returncode}:\n{done.stderr[-4000:]}"


def _ranks_run(factory, config, steps, timeout_s=120):
    return run_isolated(
        f"{distributed_workloads.HERE}:{factory}",
        AmpConfig(**config),
        steps=steps,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=timeout_s,
        memory_gb=None,
        ranks=2,
    )


@pytest.mark.xdist_group("plain-torchrun")  # one launch of the yardstick for the three
@pytest.mark.parametrize("factory", FACTORIES)
def test_a_run_on_two_ranks_trains_as_the_plain_torchrun_loop(factory, plain):
    """The global batch's loss and the scale after every step are those of the user's own
    GradScaler loop under torchrun (FSDP1 with ShardedGradScaler on both sides), including
    the steps the scaler skipped."""
    record = _ranks_run(factory, CONFIG, STEPS)
    assert record.scales == plain[factory]["scales"]
    assert min(plain[factory]["scales"]) < CONFIG["init_scale"]  # the scaler did skip steps
    assert record.losses == pytest.approx(plain[factory]["losses"], rel=1e-5)


def test_a_run_in_its_own_process_or_on_ranks_stops_where_it_stops_in_one():
    """The same float16 run stopped by the same rule (at the float32 target): trained in this
    process, in a process of its own (--isolate) and on 2 DDP ranks with the same global
    batch, it stops after the same window, long before its last step."""
    from scalertune._judge._stopping import StopRule
    from scalertune._judge._target import Target
    from scalertune._run._loop import run_config

    single = f"{distributed_workloads.HERE}:single"
    cpu, steps = torch.device("cpu"), 200
    reference = run_config(
        distributed_workloads.single, AmpConfig(dtype="float32"), steps=60, seed=0, device=cpu
    )
    target = Target.from_reference(reference.losses)
    here = run_config(
        distributed_workloads.single,
        AmpConfig(**CONFIG),
        steps=steps,
        seed=0,
        device=cpu,
        stop=StopRule(target),
    )
    alone = run_isolated(
        single,
        AmpConfig(**CONFIG),
        steps=steps,
        seed=0,
        device=cpu,
        timeout_s=120,
        memory_gb=None,
        stop=StopRule(target),
    )
    ranks = run_isolated(
        f"{distributed_workloads.HERE}:ddp",
        AmpConfig(**CONFIG),
        steps=steps,
        seed=0,
        device=cpu,
        timeout_s=120,
        memory_gb=None,
        stop=StopRule(target),
        ranks=2,
    )
    assert here.stopped == "reached" and here.steps_run < steps // 2
    assert (alone.stopped, alone.steps_run, alone.reached_at) == (
        "reached",
        here.steps_run,
        here.reached_at,
    )
    assert (ranks.stopped, ranks.steps_run) == ("reached", here.steps_run)


def test_ranks_whose_scalers_disagree_stop_the_run_naming_the_step(tmp_path):
    """FSDP1 with a plain GradScaler (a step of the workload's own): each rank decides on its
    own shard's gradients, the scales drift apart, and the run stops saying so."""
    with pytest.raises(
        TrialCrashed,
        match=r"GradScalers disagree on the loss scale after "
        r"step \d+ \(rank 0: [\d.]+, rank 1: [\d.]+\)",
    ):
        _ranks_run("fsdp1_own_scaler", CONFIG, STEPS)


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_a_rank_that_dies_or_hangs_ends_its_run_naming_the_rank(fault, tmp_path, monkeypatch):
    """Rank 1 exits hard (or hangs) mid-run: the run ends within its bounds, as a fault of
    one rank (retried, never a verdict) naming rank 1 and how it ended, with no process
    left behind."""
    import multiprocessing

    monkeypatch.setenv("SCALERTUNE_TEST_FAULT", str(tmp_path / "fault"))
    started = time.monotonic()
    with pytest.raises(
        RankFailed,
        match="rank 1 of 2: the trial's process exited with status 13"
        if fault == "dies"
        else "timed out|rank 1 of 2 hung",
    ) as failed:
        _ranks_run(f"ddp_rank_{fault}", CONFIG, STEPS, timeout_s=20)
    assert time.monotonic() - started < 60
    assert (tmp_path / "fault").exists()
    assert not multiprocessing.active_children()
    assert isinstance(failed.value, TrialCrashed)


def test_a_rank_that_dies_during_the_step_timing_is_said_and_the_timing_runs_again(
    tmp_path, monkeypatch
):
    """Rank 1 exits hard once, in the step timing: a fault of one process, not of a dtype's
    kernels. The timing runs again and times every dtype; the line says which rank died."""
    monkeypatch.setenv("SCALERTUNE_TEST_FAULT", str(tmp_path / "fault"))
    said = []
    times = time_isolated(
        f"{distributed_workloads.HERE}:ddp_rank_dies",
        ["float32", "float16"],
        clip_norm=None,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=120,
        memory_gb=None,
        ranks=2,
        log=said.append,
    )
    assert (tmp_path / "fault").exists(), "the rank never died"
    assert times is not None and set(times.rounds) == {"float32", "float16"}, said
    assert said == [
        "the step timing: rank 1 of 2: the trial's process exited with status 13 without a "
        "result; run again"
    ]


@pytest.mark.slow
def test_a_ranks_factory_whose_model_is_neither_ddp_nor_fsdp_is_refused_in_one_line(tmp_path):
    """nanoGPT's factory with its DistributedDataParallel left out: on 2 ranks each trains a
    copy of its own on its half of the batch. The search's first float32 step sees the
    ranks' gradients and weights differ and refuses it (exit 2, no study); the same factory
    with DDP passes that step."""
    from scalertune._search._launch import preflight_ranks

    ran = run_cli(
        "search",
        spec("make_model_without_ddp", "nanogpt.py"),
        "--nproc-per-node",
        "2",
        "--device",
        "cpu",
        cwd=tmp_path,
    )
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        "scalertune search: error: rank 0 of 2: after one step, rank 1's gradients and "
        "weights differ from rank 0's: each rank trains a copy of its own, as the model is "
        "neither DistributedDataParallel nor FSDP and no step all-reduces its gradients; wrap "
        "it as your training script does (model = DistributedDataParallel(model)), or "
        "all-reduce the gradients in the step; --independent-ranks if the copies are meant "
        "(an ensemble)"
    )
    assert not (tmp_path / "scalertune.db").exists()
    for factory, independent in (
        ("make_model_all_reduced", False),
        ("make_model_without_ddp", True),
    ):
        checked = preflight_ranks(
            spec(factory, "nanogpt.py"),
            device=torch.device("cpu"),
            seed=0,
            islands=set(),
            timeout_s=120,
            ranks=2,
            independent_ranks=independent,
        )
        assert checked.reference.clip_norm == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_hugging_face_trainer_on_two_ranks_trains_as_its_own_train_under_torchrun(
    dtype, tmp_path
):
    """A Trainer's run on 2 ranks (its Accelerator's DDP, gradients all-reduced after the
    last micro-batch of each step) against its own ``train()`` under torchrun, with a plain
    GradScaler of the same knobs through Accelerate's float16 path: the same loss at every
    step, and in float16 the same skipped steps."""
    import trainers

    from scalertune._run._record import skipped_steps

    knobs = {"init_scale": 2.0**22, "growth_factor": 4.0, "backoff_factor": 0.125}
    knobs["growth_interval"] = 6
    out = tmp_path / "own.json"
    _torchrun("hf", str(out), *([json.dumps(knobs)] if dtype == "float16" else []), timeout=300)
    own = json.loads(out.read_text())
    config = {"dtype": dtype, **(knobs if dtype == "float16" else {})}
    record = _ranks_run("hf_trainer", config, trainers.HF_STEPS)
    assert len(own["losses"]) == trainers.HF_STEPS
    if dtype == "float16":
        assert len(own["skipped"]) > 3
        assert skipped_steps(record.scales, knobs["init_scale"]) == own["skipped"]
    assert record.losses == pytest.approx(own["losses"], rel=1e-5 if dtype == "float32" else 1e-3)
