"""The float32 reference as one typed record: its round trip through a study, the references
written before it had a version (``tests/data/study_v1.journal``), and a damaged one, which
is named in one line and read as missing, never trusted."""

import ast
import math
import os
import shutil

import numpy as np
import optuna
import pytest
from conftest import HERE
from optuna.trial import TrialState

import scalertune
from scalertune._errors import DamagedEvidence
from scalertune._judge._reference import VERSION, Reference
from scalertune._judge._view import reference_of, reference_trial
from scalertune._replay._trace import empty
from scalertune._run._step_times import StepTimes
from scalertune._storage._names import HORIZON_ATTR, LOSSES_ATTR, REFERENCE_VERSION_ATTR
from scalertune._storage._open import open_storage

LOSSES = tuple(2.0 * 0.97**i for i in range(40))


def _record(**changes):
    base = {
        "seed": 0,
        "losses": LOSSES,
        "target_loss": LOSSES[-1] * 1.01,
        "steps_to_target": 38,
        "step_time_s": 0.0021,
        "steps_run": 80,
        "step_times": StepTimes(rounds={"float32": [0.002, 0.0021], "bfloat16": [0.004]}, steps=9),
        "horizon": 80,
        "windows": {40: tuple(range(40, 60)), 60: (1.0, 0.5)},
        "checkpoints": {40: "study.reference-seed0-step40.pt", 60: "x.pt"},
        "trace": _trace(len(LOSSES)),
    }
    return Reference(**{**base, **changes})


def _trace(steps):
    trace = empty(("fc",))
    trace.amax = np.linspace(1.0, 2.0, steps, dtype=np.float32)
    trace.param_amax = trace.amax / 2
    return trace


def _stored(study, reference, **system_changes):
    user, system = reference.to_attrs()
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE,
            value=math.inf,
            user_attrs={**user, "config": {"dtype": "float32"}},
            system_attrs={**system, **system_changes},
        )
    )
    return study.trials[-1]


def test_the_record_round_trips_through_a_study_with_its_version():
    study = optuna.create_study()
    written = _record()
    trial = _stored(study, written)
    assert trial.system_attrs[REFERENCE_VERSION_ATTR] == VERSION
    # JSON keeps a window's first step as text: the record gives it back as the step
    assert set(trial.system_attrs[HORIZON_ATTR]["windows"]) == {"40", "60"}
    read = reference_of(study, 0)
    assert read == written.__class__(**{**written.__dict__, "trial": trial.number})
    assert read.windows[40] == tuple(float(v) for v in range(40, 60))
    assert read.latest_start == 60 and read.checkpoints[40].endswith("step40.pt")
    assert read.time_to_target_s == pytest.approx(38 * 0.0021)
    assert read.target.loss == written.target.loss
    assert np.array_equal(read.trace.amax, written.trace.amax)  # the gradient trace, decoded
    assert reference_of(study, 1) is None  # no reference of that seed has run


def test_a_reference_of_a_trial_alone_has_no_horizon_windows_timing_or_trace():
    study = optuna.create_study()
    short = _record(step_times=None, horizon=None, windows={}, checkpoints={}, trace=None)
    trial = _stored(study, short)
    assert HORIZON_ATTR not in trial.system_attrs
    assert reference_of(study, 0) == Reference(**{**short.__dict__, "trial": trial.number})


@pytest.mark.parametrize("name", ["short", "long"])
def test_a_reference_written_before_the_record_had_a_version_reads_as_version_1(tmp_path, name):
    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), tmp_path / "v1.journal")
    study = optuna.load_study(study_name=name, storage=open_storage(str(tmp_path / "v1.journal")))
    trial = reference_trial(study, 0)
    assert trial is not None and REFERENCE_VERSION_ATTR not in trial.system_attrs
    read = reference_of(study, 0)
    assert read.version == 1 and read.trial == trial.number
    assert list(read.losses) == trial.system_attrs[LOSSES_ATTR]
    assert read.target_loss == trial.user_attrs["target_loss"]
    if name == "long":  # windows by step, each float32's own losses there
        stored = trial.system_attrs[HORIZON_ATTR]
        assert read.horizon == stored["horizon"] == 200
        assert {str(k): list(v) for k, v in read.windows.items()} == stored["windows"]
        assert read.step_times is not None
    else:
        assert read.horizon is None and not read.windows and not read.checkpoints


@pytest.mark.parametrize(
    ("user", "system", "named"),
    [
        ({"target_loss": "0.5"}, {}, "target_loss is damaged: it is not a finite number"),
        ({"target_loss": math.nan}, {}, "target_loss is damaged"),
        ({"steps_to_target": -3}, {}, "steps_to_target is damaged"),
        ({"step_time_s": [1]}, {}, "step_time_s is damaged"),
        ({}, {LOSSES_ATTR: "not a curve"}, "scalertune.losses is damaged"),
        ({}, {LOSSES_ATTR: [0.5] * 10_000_001}, "scalertune.losses is damaged"),
        ({}, {REFERENCE_VERSION_ATTR: VERSION + 1}, "version is damaged: it is not one"),
        ({}, {HORIZON_ATTR: {"horizon": 80, "windows": {"../x": [1.0]}}}, "not by step"),
        ({}, {HORIZON_ATTR: {"horizon": 80, "checkpoints": {"40": 7}}}, "not text"),
        ({}, {HORIZON_ATTR: {"horizon": True}}, "names no horizon"),
        ({}, {"scalertune.step_times": {"rounds": {"float32": "fast"}}}, "not a step timing"),
        (
            {},
            {"scalertune.step_times": {"rounds": {"float32": [1e-3]}, "load": math.inf}},
            "not a step timing",
        ),
        (
            {},
            {"scalertune.step_times": {"rounds": {"float32": [1e-3]}, "load": "busy"}},
            "not a step timing",
        ),
        ({}, {"scalertune.trace": "bm90IGEgdHJhY2U="}, "gradient trace is damaged"),
    ],
)
def test_a_damaged_reference_is_named_in_one_line_and_read_as_missing(user, system, named):
    study = optuna.create_study()
    good = _record(trace=None)
    stored_user, stored_system = good.to_attrs()
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE,
            value=math.inf,
            user_attrs={**stored_user, **user},
            system_attrs={**stored_system, **system},
        )
    )
    with pytest.raises(DamagedEvidence, match=named) as caught:
        Reference.from_trial(study.trials[0])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("trial #0's ")
    # the search reads it as not run (it runs it again), and a sound one after it is used
    assert reference_of(study, 0) is None and reference_trial(study, 0) is None
    _stored(study, good)
    assert reference_of(study, 0).trial == 1


#: The parts only a reference stores: no module but the record's reads them (the names are
#: declared with every stored name, in ``_storage/_names.py``).
REFERENCE_PARTS = ("HORIZON_ATTR", "REFERENCE_VERSION_ATTR", "TIMES_ATTR", "TRACE_ATTR")


def _names_in(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.alias):
            yield node.asname or node.name


def test_only_the_record_reads_the_parts_a_reference_stores():
    package = os.path.dirname(scalertune.__file__)
    readers = {
        os.path.relpath(os.path.join(folder, name), package)
        for folder, _, files in os.walk(package)
        for name in files
        if name.endswith(".py")
        and set(REFERENCE_PARTS) & set(_names_in(os.path.join(folder, name)))
    }
    assert readers == {
        os.path.join("_judge", "_reference.py"),
        os.path.join("_storage", "_names.py"),
    }


def test_the_search_asks_the_judge_and_leaves_the_showing_to_the_review():
    search = os.path.join(os.path.dirname(scalertune.__file__), "_search")
    asks = {
        name: set(_names_in(os.path.join(search, name)))
        for name in os.listdir(search)
        if name.endswith(".py")
    }
    assert {name for name, names in asks.items() if "judge" in names} >= {
        "_jobs.py",
        "_horizon_jobs.py",
    }
    # analyze() builds the SearchResult that search() returns; nothing decides with it
    assert {name for name, names in asks.items() if "analyze" in names} == {"_api.py"}
