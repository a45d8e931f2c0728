"""Runs as ranks of a torch.distributed group (--nproc-per-node), checked against a plain
GradScaler loop of the same factory under torchrun, on CPU with gloo and 2 processes."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import scalertune
from scalertune._amp._config import AmpConfig
from scalertune._search._launch import TrialCrashed, run_isolated
from tests import distributed_workloads

STEPS = 30
CONFIG = {"dtype": "float16", "init_scale": 2.0**16, "growth_factor": 2.0,
          "backoff_factor": 0.5, "growth_interval": 5}
FACTORIES = ("ddp", "fsdp2", "fsdp1")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The yardstick: the user's own loop of each factory, under torchrun (one launch)."""
    out = tmp_path_factory.mktemp("plain") / "plain.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", distributed_workloads.HERE, json.dumps(CONFIG),
                    str(STEPS), str(out), *FACTORIES],
                   check=True, timeout=180, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text())


def _ranks_run(factory, config, steps, **kwargs):
    return run_isolated(f"{distributed_workloads.HERE}:{factory}", AmpConfig(**config),
                        steps=steps, seed=0, device=torch.device("cpu"), timeout_s=120,
                        memory_gb=None, ranks=2, **kwargs)


@pytest.mark.parametrize("factory", FACTORIES)
def test_a_run_on_two_ranks_trains_as_the_plain_torchrun_loop(factory, plain):
    """The global batch's loss and the scale after every step are those of the user's own
    GradScaler loop under torchrun (FSDP1 with ShardedGradScaler on both sides), including
    the steps the scaler skipped."""
    record = _ranks_run(factory, CONFIG, STEPS)
    assert record.scales == plain[factory]["scales"]
    assert min(plain[factory]["scales"]) < CONFIG["init_scale"]  # the scaler did skip steps
    assert record.losses == pytest.approx(plain[factory]["losses"], rel=1e-5)


def test_ranks_whose_scalers_disagree_stop_the_run_naming_the_step(tmp_path):
    """FSDP1 with a plain GradScaler (a step of the workload's own): each rank decides on its
    own shard's gradients, the scales drift apart, and the run stops saying so."""
    with pytest.raises(TrialCrashed, match=r"GradScalers disagree on the loss scale after "
                                           r"step \d+ \(rank 0: [\d.]+, rank 1: [\d.]+\)"):
        _ranks_run("fsdp1_own_scaler", CONFIG, STEPS)


def test_a_rank_that_dies_mid_run_fails_its_trial_and_the_search_finishes(tmp_path,
                                                                          monkeypatch):
    """Rank 1 exits hard once mid-run: the run's record names the rank and how it died, the
    run is retried, the search ends by itself with its answer, and no trial is left
    RUNNING."""
    import optuna

    monkeypatch.setenv("SCALERTUNE_TEST_FAULT", str(tmp_path / "died"))
    started = time.monotonic()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    result = scalertune.search(f"{distributed_workloads.HERE}:ddp_rank_dies", storage=storage,
                               space="float16", n_trials=1, steps=20, device="cpu",
                               nproc_per_node=2, artifact_dir=str(tmp_path / "art"))
    assert (tmp_path / "died").exists()
    assert time.monotonic() - started < 300
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert optuna.trial.TrialState.RUNNING not in states
    failed = [t for t in study.get_trials(deepcopy=False)
              if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1
    assert "rank 1 of 2" in str(failed[0].user_attrs) and "status 13" in str(failed[0].user_attrs)
    assert result.config is not None


def test_a_search_under_torchrun_is_refused_in_one_line(tmp_path):
    """Started by torchrun, every rank would run its own search: refused, naming the
    option."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", "-m", "scalertune", "search", f"{distributed_workloads.HERE}:ddp",
         "--storage", str(tmp_path / "s.db")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert "run it once, without the launcher, with --nproc-per-node 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "s.db").exists()
