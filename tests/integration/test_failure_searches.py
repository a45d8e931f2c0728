"""Whole searches on the workloads that fail one way each: underflow, forward overflow, exploding
gradients."""

import torch
import workloads
from conftest import amp_answer, spec

import scalertune
from scalertune._amp._config import AmpConfig
from scalertune._run._loop import run_config

CPU = torch.device("cpu")


def test_scale_one_underflow_never_reaches_target_and_ranks_below_larger_scale(storage, space_file):
    path = space_file("dtype: {choices: [float16]}\ninit_scale: 1.0\n")
    result = scalertune.search(
        spec("underflow"), storage=storage, space=path, n_trials=1, steps=60, device="cpu"
    )
    (scale_one,) = [o for o in result.ranking if o.role == "search"]
    default = result.baselines["pytorch-default"]
    assert scale_one.config.init_scale == 1.0
    # Nothing is skipped and nothing is NaN: the gradients are simply zero.
    assert scale_one.state == "complete"
    assert scale_one.figures.skipped_steps == 0
    assert scale_one.figures.first_nonfinite_step is None
    assert not scale_one.reached
    assert default.reached
    assert result.ranking.index(default) < result.ranking.index(scale_one)
    assert result.config.init_scale != 1.0


def test_forward_overflow_is_pruned_with_a_reason_that_says_forward(storage):
    result = scalertune.search(
        spec("forward_overflow"),
        storage=storage,
        space="float16",
        n_trials=3,
        steps=40,
        device="cpu",
    )
    float16_runs = [o for o in result.ranking if o.config.dtype == "float16"]
    # PyTorch's defaults (and the article's fix where the replay tells it apart), and
    # three sampled trials
    assert len(float16_runs) == 3 + len(result.baselines)
    for outcome in float16_runs:
        assert outcome.state == "pruned"
        assert outcome.prune_kind == "forward"
        assert "forward overflow" in outcome.prune_reason
        assert outcome.figures.first_nonfinite_step == 0
    assert result.pruned_by_kind == {"forward": len(float16_runs)}
    assert result.recommended is None and result.config.dtype == "float32"
    assert "keep training in float32" in result.verdict
    n = len(float16_runs)
    assert f"of {n} AMP runs, {n} pruned (forward overflow)" in result.verdict
    # the replay models the gradients, not the forward: no scaler advice drawn from it (a
    # new user's summary said "PyTorch's defaults: skips no step ... keep them" beside a
    # table of runs that all overflowed), and no runs it was checked on
    summary = result.summary()
    assert "Every float16 trial overflowed in the forward pass" in summary
    assert "Scaler over the horizon" not in summary and "Replay check" not in summary


def test_exploding_gradients_clipping_decides(storage, space_file):
    # Unclipped, the workload explodes in any dtype: clipping is what trains it.
    unclipped_bf16 = run_config(
        workloads.exploding, AmpConfig(dtype="bfloat16"), steps=60, seed=0, device=CPU
    )
    assert unclipped_bf16.prune_kind in {"diverged", "parameters"}
    path = space_file("dtype: {choices: [bfloat16]}\nclip_norm: 10.0\n")
    result = scalertune.search(
        spec("exploding"), storage=storage, space=path, n_trials=1, steps=60, device="cpu"
    )
    assert amp_answer(result) is not None
    assert amp_answer(result).config == AmpConfig(dtype="bfloat16", clip_norm=10.0)
    # The baselines clip as the workload declares: PyTorch's scaler defaults, not "no clip".
    assert all(o.config.clip_norm == 10.0 for o in result.baselines.values())
