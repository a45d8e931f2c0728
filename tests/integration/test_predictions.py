"""What a search predicts a loss scaler will do over the horizon, against what it does: the
public path a user takes (a search with a horizon, the study analyzed again from storage,
``SearchResult.predict``) against GradScaler in a plain float16 loop trained the whole horizon,
with no scalertune code in it. At the reference's seed (the run the trace saw) and at another
seed (another run: other initial weights and data), for PyTorch's defaults, what the search
carries as its float16 answer, and random configs over the shipped space's ranges."""

import optuna
import pytest
import torch
from conftest import example
from plain_loop import random_configs, skipped_steps

import scalertune
from scalertune import AmpConfig
from scalertune._judge._rank import skip_tolerance

torch.set_num_threads(1)
HORIZON = 1500


def _within(predicted, real):
    return abs(predicted - real) <= skip_tolerance(real)


@pytest.fixture(scope="session")  # once per worker: its group may interleave with other modules
def searched(tmp_path_factory):
    """The shipped example searched with a horizon, then its study read back from storage."""
    folder = tmp_path_factory.mktemp("predictions")
    storage = f"sqlite:///{folder / 'p.db'}"
    found = scalertune.search(
        example("codepoints").make_model,
        storage=storage,
        study_name="predictions",
        horizon=HORIZON,
        device="cpu",
        artifact_dir=str(folder / "artifacts"),
    )
    again = scalertune.analyze(
        optuna.load_study(study_name="predictions", storage=storage), storage=storage
    )
    return found, again


@pytest.mark.slow
@pytest.mark.xdist_group("predictions")  # one search for both seeds
@pytest.mark.parametrize("seed", [0, 1])
def test_predicted_skips_are_a_plain_gradscaler_loops_over_the_horizon(searched, seed):
    found, again = searched
    factory = example("codepoints").make_model
    answers = [
        o.config
        for o in (found.recommended, found.best_amp)
        if o is not None and o.config.dtype == "float16"
    ]
    configs = [AmpConfig(), *answers, *random_configs(20, seed=12345)]
    rows = []
    for config in configs:
        predicted = again.predict(config)
        assert predicted.horizon == HORIZON
        assert predicted.skipped_steps == found.predict(config).skipped_steps
        real = len(skipped_steps(factory, config, HORIZON, seed=seed))
        rows.append((config.describe(), predicted.skipped_steps, real))
    held = [row for row in rows if _within(row[1], row[2])]
    assert len(held) >= 0.9 * len(rows), [row for row in rows if row not in held]
    # PyTorch's defaults and the answers are what a user acts on: each one within it
    for row in rows[: 1 + len(answers)]:
        assert _within(row[1], row[2]), row
    # a test that can fail: the configs' counts spread (6 to 92 skips here), predicted and real
    assert len({row[1] for row in rows}) > 5 and len({row[2] for row in rows}) > 5
