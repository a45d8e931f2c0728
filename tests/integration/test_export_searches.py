"""Searches whose result goes into training: the guard from the evidence, function factories, a
LightningModule."""

import pytest
import torch
from conftest import amp_answer, spec

import scalertune
from scalertune import AmpConfig


def test_the_yaml_carries_a_guard_from_the_evidence_and_load_enables_it(storage, tmp_path):
    result = scalertune.search(
        spec("healthy"), storage=storage, space="float16", n_trials=2, steps=60, device="cpu"
    )
    # float32 is the answer on this CPU: the float16 config that held carries its guard
    best = amp_answer(result)
    assert best is not None and best.config.dtype == "float16"
    path = str(tmp_path / "amp.yaml")
    result.to_yaml(path)
    guard = result.guard()
    lowest = min(min(o.scales) for o in [best, *result.confirmations[best.number].values()])
    assert guard.min_scale == pytest.approx(max(lowest / 2**10, 2.0**-24), rel=1e-5)
    assert guard.max_consecutive_skips >= 50
    amp = scalertune.load(path, device="cpu", best_amp=True)
    assert amp.config == best.config and amp.guard == guard
    assert scalertune.load(path, device="cpu", best_amp=True, guard=False).guard is None
    if result.recommended is None:  # the float32 answer has no scaler to guard
        assert scalertune.load(path, device="cpu").guard is None
    # the search's result and its YAML export alike, evidence included
    assert scalertune.export(result, "deepspeed").code == scalertune.export(path, "deepspeed").code


def test_a_function_factory_is_searched_like_its_spec_and_crosses_to_an_isolated_trial(storage):
    import workloads

    from scalertune._search._launch import run_isolated

    result = scalertune.search(
        workloads.healthy, storage=storage, space="bfloat16", n_trials=1, steps=20, device="cpu"
    )
    assert result.study_name == "workloads:healthy"
    assert result.settings.factory == "workloads:healthy"
    assert result.reference is not None and result.ranking
    # --isolate hands the function itself to a fresh process, which imports it by name
    record = run_isolated(
        workloads.healthy,
        AmpConfig(dtype="bfloat16"),
        steps=20,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=120,
        memory_gb=None,
    )
    assert len(record.losses) == 20 and not record.pruned


def test_a_lightning_module_is_searched_through_its_own_training_step(storage):
    result = scalertune.search(
        spec("lightning_module"), storage=storage, n_trials=2, steps=40, device="cpu"
    )
    assert result.reference is not None
    assert amp_answer(result) is not None
    assert all(o.state in ("complete", "pruned") for o in result.ranking)
