"""One test per way float16 training goes wrong, each on a tiny real model."""

import torch
import workloads

from scalertune._amp._config import AmpConfig
from scalertune._run._loop import run_config

CPU = torch.device("cpu")


def test_large_scale_overflows_gradients_skips_then_recovers():
    record = run_config(
        workloads.gradient_overflow, AmpConfig(init_scale=2.0**24), steps=60, seed=0, device=CPU
    )
    assert not record.pruned
    assert record.first_nonfinite_step == 0
    # The scaler halves the scale on each overflowing step until the gradients fit.
    assert 5 <= len(record.skipped) < 30
    assert record.skipped[:5] == [0, 1, 2, 3, 4]
    assert min(record.scales) < 2.0**24
    assert all(v == v for v in record.losses)
    small = run_config(
        workloads.gradient_overflow, AmpConfig(init_scale=2.0**8), steps=60, seed=0, device=CPU
    )
    assert len(small.skipped) < len(record.skipped)


def test_forward_overflow_is_fixed_by_bfloat16_not_by_a_small_scale():
    tiny = run_config(
        workloads.forward_overflow, AmpConfig(init_scale=2.0**-8), steps=40, seed=0, device=CPU
    )
    assert tiny.prune_kind == "forward"
    bf16 = run_config(
        workloads.forward_overflow, AmpConfig(dtype="bfloat16"), steps=40, seed=0, device=CPU
    )
    assert not bf16.pruned


def test_the_trailing_skip_streak_read_backwards_matches_the_skipped_steps():
    import random

    from scalertune._run._nonfinite import _trailing_skip_streak
    from scalertune._run._record import RunRecord

    rng = random.Random(0)
    for _ in range(200):
        config = AmpConfig(init_scale=2.0 ** rng.randint(-4, 16))
        scales, scale = [], config.init_scale
        for _ in range(rng.randint(0, 30)):
            scale *= rng.choice([0.5, 1.0, 1.0, 2.0])
            scales.append(scale)
        record = RunRecord(
            config=config, seed=0, steps=30, losses=[1.0] * len(scales), scales=scales
        )
        skipped, streak = set(record.skipped), 0
        while len(scales) - 1 - streak in skipped:
            streak += 1
        assert _trailing_skip_streak(record) == streak
