"""The real run's record: what ``scalertune report`` and ``amp.report()`` print of records
stored in the form the in-run check wrote them before the record had a version
(``tests/data/runs_v1.json``: made by the code of commit a89ef91, as its study kept them;
the text that code printed of them is ``runs_v1.summary.txt`` and ``runs_v1.report.txt``),
byte for byte."""

import json
import os
import warnings

import optuna
import pytest
import torch
from conftest import HERE
from torch import nn

from scalertune import AmpConfig, AmpRuntime, CheckPolicy
from scalertune._amp._watch import ScalerPrediction
from scalertune._inrun import InRunCheck
from scalertune._review._runs import real_runs, runs_lines

DATA = os.path.join(HERE, "data")


def _stored() -> dict:
    with open(os.path.join(DATA, "runs_v1.json"), encoding="utf-8") as f:
        return json.load(f)


def _text(name: str) -> str:
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


def test_the_runs_a_study_stored_report_byte_for_byte(tmp_path):
    """Six runs, one whose record is damaged (named, its record unread), two values under
    the runs' prefix that are no run's record (left out) and the study's settings beside
    them: through a study's storage and back, the text is the one printed before."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    study = optuna.create_study(study_name="runs", storage=url)
    for key, value in _stored().items():
        study.set_user_attr(key, value)
    attrs = optuna.load_study(study_name="runs", storage=url).user_attrs
    assert "\n".join(runs_lines(real_runs(attrs))) + "\n" == _text("runs_v1.summary.txt")


def _precision_floor():
    """A model whose bfloat16 output at ~1000 rounds by 4: the check fails at once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(1000.0)
    x = torch.randn(64, 4)
    with torch.no_grad():
        y = model(x) + 0.01 * torch.randn(64, 1)
    return model, (x, y)


def _report(config, policy, prediction=None, steps=6):
    model, batch = _precision_floor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    amp = AmpRuntime(config, device="cpu", check=InRunCheck(policy, prediction=prediction))
    model = amp.prepare(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batch)
    return amp.check.report(amp)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_amp_report_prints_what_it_printed():
    """The two runs behind the stored records ``host-a`` and ``host-c``, trained again: an
    island for bfloat16's precision, and float16 with its scaler beside a prediction."""
    prediction = ScalerPrediction(
        horizon=5000, skipped_steps=17, min_scale=2.0**12, final_scale=2.0**15, skipped_first=9
    )
    bfloat16 = _report(AmpConfig(dtype="bfloat16"), CheckPolicy(every=1, window=3))
    float16 = _report(
        AmpConfig(dtype="float16", init_scale=2.0**10, clip_norm=1.0),
        CheckPolicy(every=2, tolerance=0.1, z=3.0),
        prediction,
        steps=9,
    )
    assert bfloat16 + "\n" + float16 + "\n" == _text("runs_v1.report.txt")
