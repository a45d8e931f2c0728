"""The real run's record: what ``scalertune report`` and ``amp.report()`` print of records
stored in the form the in-run check wrote them before the record had a version
(``tests/data/runs_v1.json``: made by the code of commit a89ef91, as its study kept them;
the text that code printed of them is ``runs_v1.summary.txt`` and ``runs_v1.report.txt``),
byte for byte; the typed record (``_inrun._run_record``) written as before with its version
and read back, a damaged one named in one line and its run shown unread, and no other module
reading a run's parts by key."""

import ast
import contextlib
import dataclasses
import json
import math
import os
import types
import warnings

import optuna
import pytest
import torch
from conftest import HERE
from torch import nn
from torch.nn.functional import mse_loss

import scalertune
from scalertune import AmpConfig, AmpRuntime, CheckPolicy
from scalertune._amp._watch import ScalerPrediction
from scalertune._errors import DamagedEvidence
from scalertune._inrun import InRunCheck
from scalertune._inrun._account import describe
from scalertune._inrun._gap import Check
from scalertune._inrun._lines import Action
from scalertune._inrun._run_record import VERSION, NotARunRecord, RunRecord
from scalertune._review._runs import real_runs, runs_lines
from scalertune._storage._names import RUN_PREFIX

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
            amp.train_step(model, optimizer, mse_loss, batch)
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


def _good() -> dict[str, dict]:
    return {
        key[len(RUN_PREFIX) :]: value
        for key, value in _stored().items()
        if key.startswith(RUN_PREFIX) and key[len(RUN_PREFIX) :].startswith("host-")
    }


def test_a_record_written_before_it_had_a_version_reads_as_version_1():
    runs = _good()
    del runs["host-g-107-20261201T140000"]  # its policy is damaged
    for name, stored in runs.items():
        record = RunRecord.from_dict(stored, f"run {name}")
        assert record.version == 1 and record.yaml == stored["yaml"]
        # the keys it holds are the fields', and written again as they were, with a version
        assert set(record.to_dict()) == set(stored) | {"version"}
        again = RunRecord.from_dict(record.to_dict())
        assert describe(again) == describe(record)


def test_the_record_the_check_makes_is_written_with_its_version_and_reads_back():
    prediction = ScalerPrediction(horizon=500, skipped_steps=3, min_scale=2.0, final_scale=8.0)
    config = AmpConfig(init_scale=2.0**10, fp32_modules=("2",))
    model, batch = _precision_floor()
    amp = AmpRuntime(config, device="cpu", check=InRunCheck(prediction=prediction))
    model = amp.prepare(model)
    amp.train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), mse_loss, batch)
    record = amp.check.summary(amp)
    stored = json.loads(json.dumps(record.to_dict()))
    assert stored["version"] == VERSION and "host" not in stored and "scale" in stored
    assert set(stored) == {f.name for f in dataclasses.fields(RunRecord)} - {
        "host",
        "started",
        "yaml",
        "device",
    }
    assert RunRecord.from_dict(stored) == record


def test_the_check_writes_the_keys_and_values_it_wrote_before_plus_its_version():
    """The run behind the stored ``host-d`` (float32 after an overflow island, a check that
    overflowed, a prediction), made again: the same plain data, with its version."""
    check = InRunCheck(
        prediction=ScalerPrediction(
            horizon=5000, skipped_steps=17, min_scale=2.0**12, final_scale=2.0**15
        )
    )
    check.checks = [Check(0, 2.5, 2.4), Check(100, math.inf, 2.0), Check(200, 1.9, 1.9)]
    check.checks.append(Check(300, 1.2, 0.0))
    check.actions.done = [
        Action(100, "overflow", "scalertune check at step 100: the forward overflowed: "
               "keeping 'mlp' in float32"),
        Action(250, "float32", "scalertune check at step 250: training in float32 from now on"),
    ]  # fmt: skip
    amp = types.SimpleNamespace(
        config=AmpConfig(dtype="float32", clip_norm=0.5), steps=12345, skipped_steps=37
    )
    before = dict(_good()["host-d-104-20261201T110000"])
    for who in ("host", "started", "yaml", "device"):
        del before[who]
    assert json.loads(json.dumps(check.summary(amp).to_dict())) == {**before, "version": VERSION}


def _damage(**changes):
    stored = dict(_good()["host-c-103-20261201T100000"])
    stored.update(changes)
    return {k: v for k, v in stored.items() if v is not _GONE}


_GONE = object()


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"version": 3}, "version is damaged: it is not a version this scalertune reads (2)"),
        ({"yaml": 7}, "yaml is damaged: it is not text"),
        ({"policy": {"every": 0, "action": "act", "window": 5}}, "policy is damaged"),
        ({"policy": {"action": "act"}}, "policy is damaged: it is not a check's policy as"),
        ({"config": {"dtype": "float64"}}, "config is damaged: it is not an AMP config"),
        ({"steps": -1}, "steps is damaged: it is not a count of steps"),
        ({"skipped_steps": "3"}, "skipped_steps is damaged"),
        ({"checks": [[0, 1.0]]}, "checks is damaged: it holds a check that is not"),
        ({"checks": [[0, "1", 1.0]]}, "checks is damaged"),
        ({"checks": [[0, 1.0, 1.0]] * 513}, "checks is damaged: it holds more than 512"),
        ({"actions": [{"step": 1, "kind": "island"}]}, "actions is damaged"),
        ({"actions": [{"step": 1, "kind": "Island!", "line": "x"}]}, "actions is damaged"),
        ({"scale": math.nan}, "scale is damaged: it is not a loss scale"),
        ({"scale": -1.0}, "scale is damaged"),
        ({"prediction": {"horizon": 10}}, "prediction is damaged"),
        ({"prediction": {"horizon": 10, "skipped_steps": 11, "min_scale": 1.0,
                         "final_scale": 1.0}}, "prediction is damaged"),
    ],
)  # fmt: skip
def test_a_damaged_record_is_named_in_one_line_and_its_run_shown_unread(changes, named):
    stored = _damage(**changes)
    with pytest.raises(DamagedEvidence) as caught:
        RunRecord.from_dict(stored, "run c")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("run c's ") and named in message
    assert not isinstance(caught.value, NotARunRecord)
    runs = real_runs({RUN_PREFIX + "c": stored})
    assert runs_lines(runs) == [
        "Real runs that checked themselves against float32 (1):",
        "- c" + (", loading /runs/c/amp.yaml" if "yaml" not in changes else ""),
        "  (its record cannot be read)",
    ]
    assert runs["c"].why == message


@pytest.mark.parametrize(
    "changes",
    [{"policy": _GONE}, {"config": "float16"}, {"steps": 1.0}, {"checks": {}}, {"actions": "x"}],
)
def test_a_value_that_is_no_runs_record_is_left_out(changes):
    with pytest.raises(NotARunRecord):
        RunRecord.from_dict(_damage(**changes))
    assert real_runs({RUN_PREFIX + "c": _damage(**changes), RUN_PREFIX + "d": "text"}) == {}


JUNK = [None, True, -1, 2**70, 1.5, math.nan, math.inf, "x" * 70_000, [], [[]], {}, {"a": 1}]


def test_no_stored_value_is_more_than_a_damaged_record():
    """Every part of a record replaced by every kind of junk: the record reads, or is named
    damaged (or no run's record); the report prints either way."""
    for key in [*_damage(), "version"]:
        for junk in JUNK:
            stored = _damage(**{key: junk})
            with contextlib.suppress(DamagedEvidence):
                RunRecord.from_dict(stored)
            runs_lines(real_runs({RUN_PREFIX + "c": stored}))


def _string_reads(path):
    """``x["key"]`` and ``x.get("key")`` in ``path``, and ``except KeyError``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript):
            key = node.slice
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
            key = node.args[0] if node.args else None
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield f"{path}:{node.lineno}: [{key.value!r}]"
        if isinstance(node, ast.ExceptHandler) and "KeyError" in ast.unparse(node.type or node):
            yield f"{path}:{node.lineno}: except KeyError"


def test_only_the_record_reads_the_parts_a_run_stores():
    """What prints a run's record, and what reads it from a study, read it by attribute."""
    package = os.path.dirname(scalertune.__file__)
    readers = [os.path.join(package, "_inrun", "_account.py")]
    readers.append(os.path.join(package, "_review", "_runs.py"))
    assert [found for path in readers for found in _string_reads(path)] == []


def test_a_resumed_run_adopts_only_a_run_key_from_its_checkpoint(tmp_path):
    """A checkpoint's ``run`` names the record a resumed run goes on writing; anything that
    is not a run's key (another study attribute, a damaged value) leaves the log's own."""
    from scalertune._storage._run_log import RunLog

    first = RunLog(str(tmp_path / "none.journal"), "s")
    log = RunLog(str(tmp_path / "none.journal"), "s")
    assert log.key != first.key  # one process, the same second: two records
    own = log.key
    for bad in (
        None,
        "text",
        {"key": "scalertune.settings"},
        {"key": RUN_PREFIX + "a/../b"},
        {"key": RUN_PREFIX + "x" * 300},
        {"key": 7},
    ):
        log.adopt(bad)
        assert log.key == own, bad
    log.adopt(first.of_run())
    assert log.of_run() == first.of_run()
    for each in (first, log):
        each.close(timeout=1)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"SLURM_PROCID": "1"}, {"RANK": "0"}])
def test_a_ranks_record_is_written_by_rank_0_alone_after_its_process_group_is_gone(tmp_path, env):
    """A 2-rank run showed twice in the report: rank 1's last record, written as its
    program ended after ``destroy_process_group``, read rank 0. The launcher's rank decides
    then (a process of its own: no process group, the record written at its exit)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    optuna.create_study(study_name="s", storage=url)
    (stored,) = [v for k, v in _good().items() if k == "host-b-102-20261201T080000"]
    script = (
        "import json, sys\n"
        "import torch\n"  # a training program's
        "from scalertune._inrun._run_record import RunRecord\n"
        "from scalertune._storage._run_log import RunLog\n"
        "log = RunLog(sys.argv[1], 's')\n"
        "record = RunRecord.from_dict(json.loads(sys.argv[2]))\n"
        "log.final = lambda: record\n"  # written as the program ends, as a run's last
        "print(log.key)\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
    ran = subprocess.run(
        [sys.executable, "-c", script, url, json.dumps(stored)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    written = list(optuna.load_study(study_name="s", storage=url).user_attrs)
    assert written == ([ran.stdout.strip()] if env.get("RANK") == "0" else [])
