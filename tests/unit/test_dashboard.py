"""What scalertune adds for optuna-dashboard: rounding for reading, the notes, the Best Trial
the server reports, the horizon's picture, and the command's errors.

The studies here are built as a search stores them (the same attributes, in an in-memory
storage) but with made-up losses, so that the notes and the picture are checked in
milliseconds against figures known in advance. The dashboard itself, served and rendered in a
browser after real searches, is tested in tests/integration/test_browser.py.
"""

import json
import math

import optuna
import pytest
from conftest import run_cli
from optuna.trial import TrialState, create_trial

from scalertune import _policy
from scalertune._judge._phases import judge_phase
from scalertune._judge._settings import StudySettings
from scalertune._judge._target import Target
from scalertune._review._analyze import analyze
from scalertune._review._dashboard import study_note
from scalertune._review._notes import ROLES, trial_note
from scalertune._review._server import recommended_best
from scalertune._storage._names import (
    HORIZON_ATTR,
    JUDGED_ATTR,
    LOSSES_ATTR,
    SETTINGS_ATTR,
)
from scalertune._storage._optuna import storage_of, study_id
from scalertune._text import readable

STEPS, HORIZON = 100, 1000
WINDOWS = StudySettings(
    factory="late.py:make_model",
    steps=STEPS,
    horizon=HORIZON,
    seed=0,
    space={},
    device_type="cpu",
    device="cpu",
).windows
FLOAT16 = {
    "dtype": "float16",
    "init_scale": 0.01,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "clip_norm": None,
}
BFLOAT16 = {"dtype": "bfloat16", "clip_norm": None}
FLOAT32 = {"dtype": "float32", "clip_norm": None}
#: How far above float32's each run's loss is in each window (float16 holds, bfloat16 falls
#: behind late, as bfloat16 does on readings near 1000).
BEHIND = {"float16": 1.01, "bfloat16": 1.8}


def _float32_losses():
    # noisy, so that the phase verdict's paired standard error is not zero
    return [1000.0 * 0.99**i + 10.0 + (i % 7) * 0.1 for i in range(HORIZON)]


def _add(study, *, value, attrs, system=None, curve=None, state=TrialState.COMPLETE):
    study.add_trial(
        create_trial(
            state=state,
            value=value if state == TrialState.COMPLETE else None,
            params={},
            distributions={},
            intermediate_values=curve or {9: 1.0},
            user_attrs=attrs,
            system_attrs=system or {},
        )
    )
    return study.trials[-1].number


def _run(study, target, config, losses, step_time):
    reached = target.steps_to_target(losses)
    return _add(
        study,
        value=reached * step_time,
        system={LOSSES_ATTR: losses},
        attrs={
            "role": "search",
            "seed": 0,
            "config": config,
            "steps_to_target": reached,
            "step_time_s": step_time,
            "time_to_target_s": reached * step_time,
            "skipped_steps": 0,
            "min_scale": 0.01,
            "steps_run": len(losses),
            "loss_vs_float32": 0.9,
        },
    )


def _branch(study, of, config, start, end, reference):
    losses = [v * BEHIND[config["dtype"]] for v in reference]
    phase = judge_phase(losses, reference, start=start, pruned=False)
    judged = {
        "phase_ratio": phase.ratio,
        "phase_z": phase.z,
        "phase_nonfinite": False,
        "phase_holds": phase.holds,
        "initial_scale": 0.03125,
    }
    return _add(
        study,
        value=math.inf,
        curve={s: -1.0 for s in range(start + 9, end, 10)},
        system={LOSSES_ATTR: losses, JUDGED_ATTR: judged},
        attrs={
            "role": "phase",
            "of": of,
            "start": start,
            "end": end,
            "seed": 0,
            "config": config,
            **readable(judged),
        },
    )


@pytest.fixture
def late():
    """A study of a 1000-step horizon as the search stores it: the float32 reference to the
    horizon, a float16 run that holds and a bfloat16 run faster to the early target (the
    least value) that falls behind, each branched at both windows, a pruned run and the
    recommendation."""
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="late")
    study.set_user_attr(
        SETTINGS_ATTR,
        {
            "factory": "late.py:make_model",
            "steps": STEPS,
            "horizon": HORIZON,
            "seed": 0,
            "space": {"name": "default"},
            "device": "cpu",
            "reference": FLOAT32,
        },
    )
    losses = _float32_losses()
    target = Target.from_reference(losses[:STEPS])
    reached = target.steps_to_target(losses[:STEPS])
    windows = {str(a): losses[a:b] for a, b in WINDOWS}
    _add(
        study,
        value=math.inf,
        attrs={
            "role": "reference",
            "seed": 0,
            "config": FLOAT32,
            "target_loss": target.loss,
            "steps_to_target": reached,
            "step_time_s": 0.001,
            "time_to_target_s": reached * 0.001,
            "steps_run": HORIZON,
        },
        system={
            LOSSES_ATTR: losses[:STEPS],
            HORIZON_ATTR: {"horizon": HORIZON, "windows": windows, "checkpoints": {}},
        },
        curve={s: 0.0 for s in range(9, HORIZON, 10)},
    )
    faster = [v * 0.8 for v in losses[:STEPS]]
    runs = {
        "float16": _run(study, target, FLOAT16, losses[:STEPS], 0.002),
        "bfloat16": _run(study, target, BFLOAT16, faster, 0.0005),
    }
    _add(
        study,
        value=None,
        state=TrialState.PRUNED,
        attrs={
            "role": "search",
            "seed": 0,
            "config": {**FLOAT16, "init_scale": 1e6},
            "pruned_because": "slower",
            "steps_run": 40,
        },
        system={LOSSES_ATTR: losses[:40]},
    )
    for name, config in (("float16", FLOAT16), ("bfloat16", BFLOAT16)):
        for start, end in WINDOWS:
            _branch(study, runs[name], config, start, end, windows[str(start)])
    _add(
        study,
        value=readable(reached * 0.001),
        attrs={
            "role": "recommended",
            "seed": 0,
            "config": FLOAT32,
            "recommends": "float32",
            "reference_trial": 0,
            "time_to_target_s": readable(reached * 0.001),
        },
    )
    result = analyze(study)
    return study, result, runs


def _phase_trial(study, of, start):
    return next(
        t
        for t in study.trials
        if t.user_attrs.get("role") == "phase"
        and t.user_attrs["of"] == of
        and t.user_attrs["start"] == start
    )


def test_readable_rounds_floats_for_reading_and_leaves_the_rest():
    assert readable(0.0030449795900123) == 0.003045
    # a loss scale that stayed at 2**16 must not read 65540, as if it had moved
    assert readable([65536.0, 2.0**-9, -(2.0**40), 65537.0]) == [
        65536.0,
        0.001953125,
        -(2.0**40),
        65540.0,
    ]
    assert readable(
        {
            "min_scale": 0.0019531,
            "skipped_steps": 25,
            "role": "search",
            "steps_to_target": None,
            "loss_vs_float32": math.inf,
        }
    ) == {
        "min_scale": 0.001953,
        "skipped_steps": 25,
        "role": "search",
        "steps_to_target": None,
        "loss_vs_float32": math.inf,
    }
    assert readable([12345.678, True]) == [12350.0, True]


def test_the_servers_best_trial_is_the_latest_recommendation_not_the_least_value(late):
    study, _, runs = late
    storage = recommended_best(storage_of(study))
    # the bfloat16 run has the least value: faster to the early target, behind later
    assert (
        optuna.storages.InMemoryStorage.get_best_trial(storage, study_id(study)).number
        == runs["bfloat16"]
    )
    best = storage.get_best_trial(study_id(study))
    assert best.user_attrs["role"] == "recommended" and best.number == study.trials[-1].number
    other = optuna.create_study(storage=storage, study_name="not scalertune's")
    other.add_trial(create_trial(value=2.0))
    other.add_trial(create_trial(value=1.0))
    assert storage.get_best_trial(study_id(other)).number == 1
    assert type(storage) is optuna.storages.InMemoryStorage


def test_a_branch_note_says_where_it_started_how_it_did_and_where_float32s_continuation_is(late):
    study, result, runs = late
    (start, end), _ = WINDOWS
    note = trial_note(_phase_trial(study, runs["float16"], start), result)
    assert f"branch of trial {runs['float16']} at steps {start}-{end}" in note
    assert f"float32 reference's checkpoint at step {start} (trial 0" in note
    assert "loss scaler started at 0.03125 (`initial_scale`" in note
    half = start + (end - start) // 2
    assert f"**Holds**: its loss is 1.01x float32's over steps {half}-{end}" in note
    branch = _phase_trial(study, runs["float16"], start).number
    assert "float32's continuation** over steps" in note
    assert "double-click `trial #0`" in note and f"then click `trial #{branch}`" in note
    assert f"at the absolute steps of its window ({start + 9}-{end - 1})" in note


def test_a_branch_that_falls_behind_says_so_and_bfloat16_needs_no_scaler_start(late):
    study, result, runs = late
    start, end = WINDOWS[-1]
    note = trial_note(_phase_trial(study, runs["bfloat16"], start), result)
    assert "**Falls behind float32**: its loss is 1.8x float32's" in note
    assert "initial_scale" not in note
    run_note = trial_note(study.trials[runs["bfloat16"]], result)
    assert "**Does not hold for the horizon**" in run_note and f"1.8x at {start}-{end}" in run_note


def test_study_note_states_the_horizon_what_the_evidence_covers_and_the_phases(late):
    study, result, runs = late
    note = study_note(result)
    assert f"horizon {HORIZON} steps" in note
    assert f"evidence covers steps 0-{HORIZON} of the horizon" in note
    assert "### Phases of the horizon" in note
    (a, b), (c, d) = WINDOWS
    assert f"| {a}-{b} | {c}-{d} | holds |" in note
    behind = _phase_trial(study, runs["bfloat16"], c).number
    assert f"1.8x behind (trial {behind})" in note
    assert f"trial #{runs['bfloat16']}: falls behind float32 by {a}-{b}" in note
    for role in ("phase", "island", "replay", "recommended"):
        assert f"| {role} | {ROLES[role]} |" in note


def test_the_study_note_claims_no_speed_for_float8_run_emulated(late):
    """The summary and the YAML claim no speed for float8 emulated on a CPU; the study note
    said "4.63x slower than float32 ... (0.18-0.26x of float32's speed)" for it."""
    import dataclasses

    from scalertune import AmpConfig

    _, result, _ = late
    # float32 recommended on the CPU, a float8 run its best AMP config that holds
    best = dataclasses.replace(result.ranking[0], config=AmpConfig(dtype="float8"))
    note = study_note(dataclasses.replace(result, recommended=None, best_amp=best))
    (line,) = [x for x in note.splitlines() if x.startswith("**Best AMP config that holds:**")]
    assert "no speed claimed" in line and "emulated on cpu" in line, line
    assert "float32's speed" not in line and "slower than float32" not in line, line


def test_notes_say_pruned_trials_have_no_value_and_the_recommendation_repeats_its_run(late):
    study, result, _ = late
    pruned = next(t for t in study.trials if t.state == TrialState.PRUNED)
    assert pruned.value is None
    assert "has no objective value" in trial_note(pruned, result)
    recommended = trial_note(study.trials[-1], result)
    assert recommended.startswith(f"### Trial {study.trials[-1].number}: ★ the recommendation")
    assert "It repeats the float32 reference, trial 0" in recommended
    assert "Best Trial** is the recommendation: trial" in study_note(result)


def test_horizon_picture_draws_each_finalist_against_float32_with_the_tolerance(late):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from scalertune._review._horizon_plot import horizon_figure

    study, result, runs = late
    fig = horizon_figure(result)
    try:
        (ax,) = fig.axes
        assert ax.get_yscale() == "log"
        levels = {line.get_ydata()[0] for line in ax.lines if len(line.get_xdata()) == 2}
        assert {1.0, 1 + _policy.PHASE_TOLERANCE} <= {float(v) for v in levels}
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(
            f"trial #{runs['bfloat16']}" in label and "does not hold" in label for label in labels
        )
        assert any(f"trial #{runs['float16']}" in label and "holds" in label for label in labels)
        # each run: its short trial from step 0 and a stretch in every window
        for number in runs.values():
            label = next(lb for lb in labels if f"trial #{number}" in lb)
            color = next(li.get_color() for li in ax.lines if li.get_label() == label)
            starts = sorted(
                int(li.get_xdata()[0])
                for li in ax.lines
                if li.get_color() == color and len(li.get_xdata()) > 2
            )
            assert starts == [0, *(a for a, _ in WINDOWS)]
        late_bf16 = next(
            li for li in ax.lines if li.get_label().startswith(f"trial #{runs['bfloat16']}")
        )
        assert late_bf16.get_ydata()[0] == pytest.approx(0.8)
        # the legend names what is drawn, and every word fits in the picture
        assert set(labels) == {
            li.get_label() for li in ax.lines if not li.get_label().startswith("_")
        }
        fig.canvas.draw()
        page = fig.bbox
        for text in [
            *fig.texts,
            ax.title,
            ax.xaxis.label,
            ax.yaxis.label,
            *ax.get_legend().get_texts(),
        ]:
            box = text.get_window_extent()
            assert (
                page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
            ), text.get_text()
    finally:
        plt.close(fig)


def test_dashboard_without_the_study_database_is_a_usage_error(tmp_path):
    proc = run_cli("dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}", cwd=tmp_path)
    assert proc.returncode == 2 and "no such database" in proc.stderr


def test_dashboard_on_a_storage_without_studies_is_a_usage_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(url).remove_session()
    proc = run_cli("dashboard", "--storage", url, cwd=tmp_path)
    assert proc.returncode == 2 and "holds no study" in proc.stderr, proc.stderr


def _study_on_a_journal(tmp_path):
    from scalertune._storage._open import open_storage

    optuna.create_study(study_name="s", storage=open_storage(str(tmp_path / "study.log")))
    return "study.log"


def test_dashboard_on_an_address_other_than_loopback_says_who_can_read_it(tmp_path):
    """192.0.2.1 is a documentation address no machine here has: the server cannot bind it,
    so nothing is served and nobody reads anything: one line, exit 2, before any is said
    about who could read it. The warning itself is said where it serves (``0.0.0.0``)."""
    storage = _study_on_a_journal(tmp_path)
    proc = run_cli("dashboard", "--storage", storage, "--host", "192.0.2.1", cwd=tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert len(lines) == 1 and lines[0].endswith(
        "error: cannot serve at 192.0.2.1:8080: Cannot assign requested address: pass "
        "another --host or --port"
    )
    from scalertune._cli._commands import _loopback

    assert not _loopback("192.0.2.1") and not _loopback("0.0.0.0") and _loopback("127.0.0.2")


def test_dashboard_on_every_interface_says_who_can_read_it_before_it_serves(tmp_path):
    import socket
    import subprocess
    import sys

    storage = _study_on_a_journal(tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "scalertune", "dashboard", "--storage", storage,
         "--host", "0.0.0.0", "--port", str(port)],
        cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        first = server.stderr.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert first.startswith("--host 0.0.0.0 is not a loopback address: optuna-dashboard"), first
    assert f"has no login, so anyone who reaches http://0.0.0.0:{port}/dashboard reads" in first


def _serving(storage, tmp_path, *flags, stderr=None, stdout=False):
    """``scalertune dashboard`` on ``storage`` on a free loopback port, once it answers (its
    stderr a pipe, or ``stderr``: a server that logs every request fills a pipe no one
    reads, and blocks)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    where = "[::1]" if "::1" in flags else "127.0.0.1"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "scalertune", "dashboard", "--storage", storage,
         "--port", str(port), *flags],
        cwd=tmp_path, stderr=stderr or subprocess.PIPE, text=True,
        stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://{where}:{port}/api/studies", timeout=10):
                return server, port
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "no dashboard"
            time.sleep(0.3)


def _request(port, method, path):
    import urllib.error
    import urllib.request

    ask = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(ask, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_dashboard_is_read_only_unless_writes_are_allowed(tmp_path):
    """optuna-dashboard has no login, and any user of the host reaches 127.0.0.1: a new user
    deleted a study with one ``curl -X DELETE``. Served read-only, the DELETE and a note's
    rewrite are refused (403, the reason in the body the page shows), the study kept;
    ``--allow-writes`` serves optuna-dashboard's own API, said in one line."""
    from scalertune._storage._open import open_storage

    storage = _study_on_a_journal(tmp_path)
    server, port = _serving(storage, tmp_path)
    try:
        status, body = _request(port, "DELETE", "/api/studies/0")
        assert status == 403 and "--allow-writes" in json.loads(body)["reason"], body
        assert _request(port, "PUT", "/api/studies/0/note")[0] == 403
        status, body = _request(port, "GET", "/api/studies")
        assert status == 200 and len(json.loads(body)["study_summaries"]) == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert len(optuna.get_all_study_summaries(open_storage(str(tmp_path / storage)))) == 1
    server, port = _serving(storage, tmp_path, "--allow-writes")
    try:
        said = server.stderr.readline()
        assert said.startswith("--allow-writes: optuna-dashboard has no login"), said
        assert _request(port, "DELETE", "/api/studies/0")[0] == 204
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert optuna.get_all_study_summaries(open_storage(str(tmp_path / storage))) == []


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_the_dashboard_stops_at_ctrl_c_or_sigterm_while_requests_come(tmp_path, signum):
    """A new user's Ctrl-C landed in a request in 4 runs of 4 with three request loops:
    wsgiref's error handler caught the KeyboardInterrupt and the server served on. The
    signal now stops the server's loop after the request it answers: exit 0, in seconds."""
    import signal
    import threading
    import time

    storage = _study_on_a_journal(tmp_path)
    with open(tmp_path / "server.log", "w") as log:
        server, port = _serving(storage, tmp_path, stderr=log)
    done = threading.Event()

    def ask():
        while not done.is_set():
            try:
                _request(port, "GET", "/api/studies")
            except OSError:
                time.sleep(0.01)

    loops = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
    try:
        for loop in loops:
            loop.start()
        time.sleep(1.0)
        server.send_signal(getattr(signal, signum))
        code = server.wait(timeout=15)
    finally:
        done.set()
        if server.poll() is None:
            server.kill()
            server.wait()
    assert code == 0, (tmp_path / "server.log").read_text()[-3000:]


def test_the_dashboards_address_on_ipv6_loopback_is_a_url(tmp_path):
    """``--host ::1`` serves, read-only, at ``http://[::1]:PORT``: the address it prints
    was ``http://::1:PORT``, which no browser opens."""
    storage = _study_on_a_journal(tmp_path)
    server, port = _serving(storage, tmp_path, "--host", "::1", stdout=True)
    try:
        first = server.stdout.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert f"at http://[::1]:{port}/dashboard (Ctrl-C stops it)" in first, first


def test_dashboard_on_loopback_says_nothing_of_who_can_read_it(tmp_path):
    import socket

    storage = _study_on_a_journal(tmp_path)
    with socket.socket() as taken:  # a port in use: the server stops in one line
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("dashboard", "--storage", storage, "--port", port, cwd=tmp_path)
    assert proc.returncode == 2 and "loopback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(
        f"error: cannot serve at 127.0.0.1:{port}: Address already in use: pass another "
        "--host or --port"
    )


def test_the_recommended_trial_shows_its_runs_figures_and_none_of_that_runs_job(storage):
    """A real search's recommended trial: the figures of the run it repeats (its judged
    record, in full in the system attribute, rounded in the user attributes) and the answer's
    own job, never the repeated run's (a baseline's name, a branch's window)."""
    from conftest import spec

    import scalertune
    from scalertune._judge._judged import Judged
    from scalertune._judge._view import StudyView
    from scalertune._search._recommended import _shown
    from scalertune._storage._names import JUDGED_ATTR
    from scalertune._storage._trial_record import JOB_ATTRS, Job, Recommendation

    scalertune.search(
        spec("healthy"), storage=storage, study_name="rec", n_trials=3, steps=40, device="cpu"
    )
    study = optuna.load_study(study_name="rec", storage=storage)
    (rec,) = [t for t in study.trials if t.user_attrs.get("role") == "recommended"]
    source = Recommendation.of_trial(rec)
    job = Job.of_trial(rec)
    assert (
        {k for k in rec.user_attrs if k in JOB_ATTRS}
        == set(job.attrs())
        == {
            "role",
            "seed",
            "config",
        }
    )
    assert source.recommends == "float32"  # on a CPU, float16 and bfloat16 are slower
    assert rec.user_attrs["target_loss"] == study.trials[0].user_attrs["target_loss"]
    # where an AMP run is the answer: a baseline's, shown without its name and its worker
    view = StudyView(study)
    (run,) = [t for t in study.trials if t.user_attrs.get("baseline") == "pytorch-default"]
    shown, system = _shown(view, run, 1.5)
    assert not set(shown) & set(JOB_ATTRS) and "worker" in run.user_attrs
    assert "worker" not in shown and shown["time_to_target_s"] == 1.5
    assert shown["steps_run"] == run.user_attrs["steps_run"]
    assert Judged.read(system[JUDGED_ATTR]) == Judged.of_trial(run)
    assert rec.value == rec.user_attrs["time_to_target_s"]


def test_a_picture_whose_file_is_a_link_or_gone_is_404_from_the_dashboards_own_route(tmp_path):
    """optuna-dashboard's ``/artifacts`` route, given the stores as the server gives them: a
    picture's file replaced by a link out of the store, or removed, is 404 (the route let the
    store's refusal through as a 500, a traceback in the server's log); the file itself is
    served."""
    import os
    import wsgiref.util

    pytest.importorskip("optuna_dashboard")
    from optuna_dashboard import wsgi

    from scalertune._review._server import Served

    store = tmp_path / "scalertune-artifacts"
    store.mkdir()
    served = Served([str(store)])
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    picture = tmp_path / "p.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n picture")
    ids = [
        optuna.artifacts.upload_artifact(
            study_or_trial=study, file_path=str(picture), artifact_store=served
        )
        for _ in range(4)
    ]
    (tmp_path / "secret").write_text("outside the store")
    os.remove(store / ids[1])
    os.symlink(tmp_path / "secret", store / ids[1])
    os.remove(store / ids[2])
    os.remove(store / ids[3])  # a hard link: another name of a file outside the store
    os.link(tmp_path / "secret", store / ids[3])
    app = wsgi(storage, artifact_store=served)
    sid = storage.get_study_id_from_name(study.study_name)

    def get(artifact_id):
        environ = {"PATH_INFO": f"/artifacts/{sid}/{artifact_id}"}
        wsgiref.util.setup_testing_defaults(environ)
        said = {}
        body = b"".join(app(environ, lambda status, headers, exc=None: said.update(status=status)))
        return said["status"], body

    assert get(ids[0]) == ("200 OK", b"\x89PNG\r\n\x1a\n picture")
    for artifact_id in ids[1:]:
        status, body = get(artifact_id)
        assert status.startswith("404"), (status, body)
        assert b"outside the store" not in body
    # the whole store folder swapped for a link to another after the server started: the
    # folder it started with is read, not the one the link leads to
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ids[0]).write_text("outside the store")
    os.rename(store, tmp_path / "moved")
    os.symlink(elsewhere, store)
    assert get(ids[0]) == ("200 OK", b"\x89PNG\r\n\x1a\n picture")
