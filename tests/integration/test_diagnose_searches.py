"""A search locates a forward overflow, and the command it prints fixes it."""

import os

from conftest import ROOT
from gradscaler import gradscaler, one_thread  # noqa: F401 - an autouse fixture

import scalertune

ATTENTION = os.path.join(ROOT, "examples", "attention.py") + ":make_model"


def test_search_names_the_overflow_and_its_printed_command_fixes_it(storage, tmp_path):
    overflowing = scalertune.search(
        ATTENTION, storage=storage, space="float16", n_trials=2, steps=30, device="cpu"
    )
    assert overflowing.forward_overflow_modules == ["attn.score"]
    assert all(o.overflow_islands == "attn.score" for o in overflowing.ranking)
    hint = overflowing.forward_overflow_hint()
    assert "--space float16 --fp32-modules attn.score" in hint
    fixed = scalertune.search(
        ATTENTION,
        storage=storage,
        space="float16",
        n_trials=2,
        steps=30,
        device="cpu",
        fp32_modules="attn.score",
        study_name="attention+fp32",
    )
    sampled = [o for o in fixed.ranking if o.role == "search"]
    assert sampled and not any(o.prune_kind == "forward" for o in sampled)
    assert all(o.config.fp32_modules == ("attn.score",) for o in sampled)
    fixed.to_yaml(str(tmp_path / "amp.yaml"))
    assert scalertune.load_config(str(tmp_path / "amp.yaml"), best_amp=True).fp32_modules == (
        "attn.score",
    )


def test_baselines_keep_the_islands_every_float16_run_has(storage):
    result = scalertune.search(
        ATTENTION,
        storage=storage,
        space="float16",
        n_trials=1,
        steps=30,
        device="cpu",
        fp32_modules="attn.score",
    )
    for name, baseline in result.baselines.items():
        assert baseline.config.fp32_modules == ("attn.score",), name
        assert baseline.prune_kind != "forward", baseline.prune_reason
