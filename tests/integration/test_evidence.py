"""Evidence that survives several hosts, a storage outage and a lost checkpoint: a search over a
horizon, through the real command line, whose workers start in different folders (as on other
hosts), share an S3 bucket, find float32's checkpoints gone after the reference, ride out a
PostgreSQL outage, find a checkpoint planted to run code or another model's in its place, or
cannot write their YAML, ends with the AMP answer of the same search
undisturbed, and never prints a password. (A checkpoint damaged as its worker dies, and
rerun after rerun, is the fault loop's: ``test_faults.py``.)"""

import json
import os
import subprocess
import sys

import optuna
import pytest
import yaml
from conftest import (
    HERE,
    HORIZON_SEARCH,
    horizon_answer,
    needs_postgres,
    postgres_database,
    reference_is_float32s_own,
    run_cli,
    s3_bucket,
    spec,
)
from optuna.trial import TrialState

import scalertune
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._optuna import storage_of, study_id

pytestmark = pytest.mark.xdist_group("evidence")

WORKLOAD = "healthy"
HORIZON = 200
ARGS = list(HORIZON_SEARCH)
LAUNCHER = os.path.join(HERE, "fault_launcher.py")
#: A search here takes about 20 s; longer is stuck.
STUCK_S = 300


def _search(storage, cwd, *extra, launcher=(), study="shared", output="amp.yaml"):
    os.makedirs(cwd, exist_ok=True)
    head = (
        [sys.executable, LAUNCHER, *launcher] if launcher else [sys.executable, "-m", "scalertune"]
    )
    return subprocess.Popen(
        [
            *head,
            "search",
            spec(WORKLOAD),
            "--storage",
            storage,
            "--study-name",
            study,
            "-o",
            output,
            *ARGS,
            *extra,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _finish(*procs):
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=STUCK_S)
            out.append((proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return out


_answer = horizon_answer


def _study(storage, name="shared"):
    from scalertune._storage._open import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(storage))


def _nothing_failed(study):
    """No run failed on an error, none is left running or waiting, none lacks evidence (a
    trial that lost the race for the last sampled slot never ran: not a failure)."""
    trials = study.get_trials(deepcopy=False)
    assert not [
        (t.number, t.user_attrs.get("error") or t.user_attrs["missing"])
        for t in trials
        if ("error" in t.user_attrs or "missing" in t.user_attrs)
        and t.user_attrs.get("role") != "surplus"
    ]
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_workers_started_in_two_folders_share_the_evidence_beside_the_journal(
    tmp_path, undisturbed
):
    """As on two hosts: each worker starts in its own folder and names the journal file from
    there; the checkpoints go beside the journal, where both find them."""
    a, b = _search("../study.log", tmp_path / "a"), _search("../study.log", tmp_path / "b")
    for code, out, err in _finish(a, b):
        assert code == 0, err
        assert "Failed:" not in out and "Missing evidence" not in out
    for folder in ("a", "b"):
        assert _answer(tmp_path / folder / "amp.yaml") == undisturbed["answer"]
        assert not (tmp_path / folder / "scalertune-artifacts").exists()
    study = _study(str(tmp_path / "study.log"))
    _nothing_failed(study)
    store = tmp_path / "scalertune-artifacts"
    assert study.user_attrs["scalertune.artifact_dir"] == "scalertune-artifacts"  # relative
    assert any(name.endswith(".pt.json") for name in os.listdir(store))
    # a report from a third folder finds the study, its store and its answer
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "report",
            "--storage",
            "../study.log",
            "--study-name",
            "shared",
            "--json",
        ],
        cwd=tmp_path / "a",
        capture_output=True,
        text=True,
        timeout=STUCK_S,
    )
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["evidence"]["best_amp"]["config"] == undisturbed["answer"]


def test_workers_share_the_evidence_through_an_s3_bucket(tmp_path, undisturbed):
    """Workers on several hosts: Optuna's Boto3 artifact store on a local S3 endpoint (moto's
    server); the bucket, recorded in the study, holds every checkpoint and picture."""
    import boto3

    with s3_bucket() as bucket:
        workers = [
            _search("../study.log", tmp_path / name, "--artifact-dir", bucket)
            for name in ("a", "b")
        ]
        for code, _, err in _finish(*workers):
            assert code == 0, err
        keys = {
            o["Key"]
            for o in boto3.client("s3").list_objects_v2(Bucket=bucket[len("s3://") :])["Contents"]
        }
    for name in ("a", "b"):
        assert _answer(tmp_path / name / "amp.yaml") == undisturbed["answer"]
    assert not list(tmp_path.rglob("scalertune-artifacts"))
    study = _study(str(tmp_path / "study.log"))
    _nothing_failed(study)
    assert study.user_attrs["scalertune.artifact_dir"] == bucket
    checkpoints = {k for k in keys if k.endswith(".pt")}
    assert checkpoints and {k + ".json" for k in checkpoints} <= keys
    pictures = {m.artifact_id for m in optuna.artifacts.get_all_artifact_meta(study)}
    assert pictures and pictures <= keys


@pytest.mark.parametrize("how", ["gone", "foreign"])
def test_float32s_checkpoints_lost_after_the_reference_are_rebuilt_not_judged(
    tmp_path, undisturbed, how
):
    """Every checkpoint the reference saved at a phase is lost once it is stored, or
    replaced by another model's (with a matching manifest, found only as a run loads it):
    the runs that need one rebuild it (float32 trained again from the last good one before
    it), and the answer is the undisturbed one, never 'no AMP config held'."""
    ((code, out, err),) = _finish(_search("study.log", tmp_path, launcher=("lose", how)))
    assert code == 0, err
    assert "to rebuild it" in err and "no AMP config" not in out
    assert how != "foreign" or "was saved from another model" in err
    assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    study = _study(str(tmp_path / "study.log"))
    _nothing_failed(study)
    reference_is_float32s_own(study, HORIZON)


def test_a_checkpoint_planted_to_run_code_never_runs_and_the_rerun_gives_the_answer(
    tmp_path, undisturbed, monkeypatch
):
    """Someone who can write the artifact store but not the workers replaces the reference's
    first checkpoint, while it trains, with a pickle that runs a command on load, and
    rewrites its manifest to match; the worker is killed. The same command run again runs
    nothing from the file, names it damaged in one line, trains float32 from step 0 and
    gives the undisturbed answer."""
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("SCALERTUNE_TEST_PLANTED", str(mark))
    planted = _search("study.log", tmp_path, launcher=("checkpoint", "planted", "1"))
    ((code, _, err),) = _finish(planted)
    assert code == -9, err
    ((code, out, err),) = _finish(_search("study.log", tmp_path))
    assert code == 0, err
    assert not mark.exists()
    lines = err.splitlines()
    damaged = [line for line in lines if "is damaged" in line]
    assert len(damaged) == 1 and "its pickle asks for more than tensors" in damaged[0]
    assert damaged[0].endswith(": passed over")
    assert lines[lines.index(damaged[0]) + 1].endswith("training from step 0"), err
    assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    study = _study(str(tmp_path / "study.log"))
    _nothing_failed(study)
    reference_is_float32s_own(study, HORIZON)


def test_a_yaml_that_cannot_be_written_is_one_line_and_loses_nothing(tmp_path, undisturbed):
    """A full disk (no file may grow past a limit): `report -o` ends with one line naming
    the file and exit status 3 (a fault of the machine, nothing lost: not bad input, which was
    checked before); the YAML written before is intact, and so is the study."""
    storage = str(undisturbed["folder"] / "study.log")
    before = "config: {dtype: float32}\n"
    for limit, failing in ((1024, "amp.yaml"), (16 * 1024, ".png")):
        (tmp_path / "amp.yaml").write_text(before)
        proc = subprocess.run(
            [
                sys.executable,
                LAUNCHER,
                "fsize",
                str(limit),
                "report",
                "--storage",
                storage,
                "--study-name",
                "shared",
                "-o",
                "amp.yaml",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=STUCK_S,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 3 and len(lines) == 1, proc.stderr
        assert "cannot write " in lines[0] and "File too large" in lines[0]
        assert failing in lines[0].split("cannot write ")[1].split(":")[0]
        if failing == "amp.yaml":
            assert (tmp_path / "amp.yaml").read_text() == before
        else:
            assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


PASSWORD = "my secret pw"


@needs_postgres
def test_workers_on_postgresql_ride_out_an_outage_and_never_print_the_password(tmp_path):
    """Two workers on PostgreSQL, as a user whose password has spaces, written as typed: the
    database refuses every connection and drops the open ones for a few seconds while the
    float32 reference trains. Both ride it out and give the same answer; the password is in
    no output, no YAML, no `report --json`, no study attribute."""
    import sqlalchemy
    from conftest import POSTGRES

    with postgres_database("scalertune_outage") as fresh:
        url = fresh()
        admin = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
        name = url.rsplit("/", 1)[1]
        role = f"spaced{os.getpid()}"
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f"DROP ROLE IF EXISTS {role}"))
            c.execute(sqlalchemy.text(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"))
            c.execute(sqlalchemy.text(f"ALTER DATABASE {name} OWNER TO {role}"))
        host = sqlalchemy.engine.make_url(POSTGRES)
        storage = f"postgresql://{role}:{PASSWORD}@{host.host}:{host.port}/{name}"
        try:
            # a study on a server names no folder: its workers name the one they share
            shared = ("--artifact-dir", str(tmp_path / "artifacts"))
            workers = [_search(storage, tmp_path / w, *shared) for w in ("a", "b")]
            # longer than a heartbeat's interval: some storage call of the running reference
            # (a heartbeat, or its result) falls inside the outage however late the other
            # worker starts under load
            _outage_during_the_reference(
                admin, name, storage, seconds=_storage_policy.HEARTBEAT_INTERVAL_S + 1
            )
            results = _finish(*workers)
            report = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "scalertune",
                    "report",
                    "--storage",
                    storage,
                    "--study-name",
                    "shared",
                    "--json",
                ],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                timeout=STUCK_S,
            )
            study = _study(storage)
            _nothing_failed(study)
            stored = json.dumps([study.user_attrs, _system_attrs(study)], default=str)
        finally:
            with admin.connect() as c:
                c.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
            admin.dispose()
    for code, _, err in results:
        assert code == 0, err
    assert "is unreachable" in results[0][2] + results[1][2]
    assert _answer(tmp_path / "a" / "amp.yaml") == _answer(tmp_path / "b" / "amp.yaml")
    assert report.returncode == 0, report.stderr
    said = [out + err for _, out, err in results] + [report.stdout + report.stderr]
    said += [(tmp_path / w / "amp.yaml").read_text() for w in ("a", "b")]
    said.append(stored)
    for text in said:
        assert "secret" not in text
    assert f"postgresql://{role}:***@" in results[0][1]


def _system_attrs(study):
    return storage_of(study).get_study_system_attrs(study_id(study))


def _outage_during_the_reference(admin, name, storage, *, seconds):
    """Once a worker holds the float32 reference's claim, close the database to connections
    and drop the open ones, for ``seconds``."""
    import time

    import sqlalchemy

    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline:
        try:
            if "scalertune.claim.reference.0" in _system_attrs(_study(storage)):
                break
        except KeyError:
            pass
        time.sleep(0.05)
    with admin.connect() as c:
        c.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        c.execute(
            sqlalchemy.text(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            )
        )
    time.sleep(seconds)
    with admin.connect() as c:
        c.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))


def test_a_storage_down_past_the_bound_ends_the_worker_in_one_line_and_a_rerun_resumes(
    tmp_path, undisturbed
):
    """SQLite locked by another process for longer than the outage bound (1 s here): the
    worker ends with one line naming the storage and what to do, exit status 3, its running
    trial left as a dead worker's; the same command again resumes to the undisturbed answer."""
    import time

    storage = f"sqlite:///{tmp_path / 'study.db'}?timeout=0.05"
    worker = _search(storage, tmp_path, "-q", launcher=("outage", "1"))
    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline and worker.poll() is None:
        try:
            if len(_study(storage).get_trials(deepcopy=False)) >= 4:
                break
        except (KeyError, scalertune.UsageError):  # not made yet, or busy with the worker's
            pass  # writes at this probe's short timeout: look again
        time.sleep(0.05)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); time.sleep(8); c.execute('COMMIT')\n",
            str(tmp_path / "study.db"),
        ]
    )
    ((code, out, err),) = _finish(worker)
    holder.wait(timeout=60)
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1, err
    assert lines[0].startswith(
        f"scalertune search: storage {storage} has been unreachable for "
        "1 s (database is locked): start it"
    )
    assert "rerun the same command" in lines[0]
    ((code, out, err),) = _finish(_search(storage, tmp_path))
    assert code == 0, err
    assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    _nothing_failed(_study(storage))


# -- a study whose stored values someone else changed ----------------------------------------


def _damaged_copy(undisturbed, folder, damage):
    """The undisturbed study copied into ``folder`` (its journal file, and the artifact store
    beside it), with stored values replaced as someone who can write the storage would:
    ``damage`` maps (attribute, trial role or ``None`` for the study's own) to the value
    written in its place. The copy records its own artifact store."""
    import shutil

    source = undisturbed["folder"]
    shutil.copytree(source / "scalertune-artifacts", folder / "scalertune-artifacts")
    roles = {t.number: t.user_attrs.get("role") for t in _study(str(source / "study.log")).trials}
    damage = {**damage, ("scalertune.artifact_dir", None): str(folder / "scalertune-artifacts")}
    created, lines = 0, []
    for line in (source / "study.log").read_text().splitlines():
        op = json.loads(line)
        if "trial_id" in op:
            role = roles[op["trial_id"]]
        elif "datetime_start" in op:  # a trial created: the journal numbers them in order
            role, created = roles[created], created + 1
        else:
            role = None
        for field in ("user_attr", "system_attr", "user_attrs", "system_attrs"):
            for key in op.get(field) or {}:
                if (key, role) in damage:
                    op[field][key] = damage[key, role]
        lines.append(json.dumps(op))
    (folder / "study.log").write_text("\n".join(lines) + "\n")
    return str(folder / "study.log")


@pytest.mark.parametrize(
    "key, role, value, said",
    [
        (
            "scalertune.trace",
            "reference",
            "not base64!",
            "gradient trace is damaged: it is not base64",
        ),
        ("scalertune.trace", "reference", 12, "gradient trace is damaged: it is not text but int"),
        (
            "scalertune.judged",
            "baseline",
            "junk",
            "scalertune.judged is damaged: it is not a mapping",
        ),
        (
            "scalertune.losses",
            "confirm",
            [1.0, "x"],
            "losses is damaged: it is not a loss per step",
        ),
        (
            "scalertune.losses",
            "reference",
            [1.0, float("nan")],
            "losses is damaged: it is not a loss per step",
        ),
        (
            "scalertune.losses",
            "reference",
            [float("inf"), 1.0],
            "losses is damaged: it is not a loss per step",
        ),
        ("scalertune.scales", "baseline", [[1.0, 10**12]], "runs past the longest horizon"),
        ("config", "confirm", {"dtype": "int8"}, "config is damaged: it is not an AMP config"),
        ("seed", "phase", "0", "seed is damaged: it is not a whole number"),
        ("scalertune.step_times", "reference", {"rounds": {"float32": ["x"]}}, "not a step timing"),
        (
            "scalertune.horizon",
            "reference",
            {"horizon": 200, "windows": {"100": "x"}, "checkpoints": {}},
            "window at step 100 is damaged: it is not a loss per step",
        ),
    ],
)
def test_a_damaged_value_in_the_study_is_named_in_one_line_and_left_out(
    tmp_path, undisturbed, key, role, value, said
):
    """A value in the study that is not what a run stores (a trace that does not decode,
    judged figures that are not a mapping, a curve or a scale run past any horizon, a config
    of no dtype, a step timing of no seconds): ``report`` says which trial and which value,
    in one line each, and leaves that run out; never a traceback."""
    storage = _damaged_copy(undisturbed, tmp_path, {(key, role): value})
    ran = run_cli("report", "--storage", storage, "--study-name", "shared", "--json", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    damaged = json.loads(ran.stdout)["evidence"]["damaged"]
    assert damaged and all(said in why for why in damaged.values()), damaged
    numbers = {int(name.split()[1]) for name in damaged}
    study = _study(storage)
    assert {t.number for t in study.trials if t.user_attrs.get("role") == role} >= numbers


def test_damaged_settings_end_the_report_in_one_line(tmp_path, undisturbed):
    storage = _damaged_copy(undisturbed, tmp_path, {("scalertune.settings", None): "junk"})
    ran = run_cli("report", "--storage", storage, "--study-name", "shared", cwd=tmp_path)
    assert ran.returncode == 3 and ran.stdout == "", ran.stdout
    assert (
        ran.stderr.count("\n") == 1 and "settings (scalertune.settings) are damaged" in ran.stderr
    )


def test_a_damaged_trace_in_a_sqlite_study_is_named_and_left_out(tmp_path, undisturbed):
    """The same in SQLite: the trace's row changed in the database."""
    import sqlite3

    from scalertune._storage._open import open_storage

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.copy_study(
        from_study_name="shared",
        from_storage=open_storage(str(undisturbed["folder"] / "study.log")),
        to_storage=storage,
    )
    with sqlite3.connect(tmp_path / "study.db") as db:
        changed = db.execute(
            "UPDATE trial_system_attributes SET value_json = ? WHERE key = 'scalertune.trace'",
            (json.dumps("eJzLSM3JyQcABiwCFQ=="),),  # "hello", compressed: no npz archive
        ).rowcount
    assert changed == 1
    ran = run_cli("report", "--storage", storage, "--study-name", "shared", "--json", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    assert json.loads(ran.stdout)["evidence"]["damaged"] == {
        "trial 0": "trial #0's gradient trace is damaged: it is not the archive a trace is "
        "(BadZipFile)"
    }


def test_a_search_on_a_damaged_study_runs_the_damaged_evidence_again(tmp_path, undisturbed):
    """The same command run on a study whose float32 trace does not decode, whose baseline's
    judged figures are not a mapping, one of whose claims is junk and one of whose picture
    records is not JSON: it names the trace in one line and runs the reference again (from
    its latest checkpoint: the same losses and the same trace, bit for bit), runs the
    baseline again, takes the claim over, uploads the picture again, and gives the
    undisturbed answer; the summary names what it left out."""
    import numpy as np

    from scalertune._judge._view import reference_of

    original = _study(str(undisturbed["folder"] / "study.log"))
    record = next(k for k in _system_attrs(original) if k.startswith("artifacts:"))
    storage = _damaged_copy(
        undisturbed,
        tmp_path,
        {
            ("scalertune.trace", "reference"): "not base64!",
            ("scalertune.judged", "baseline"): "junk",
            ("scalertune.claim.baselines", None): "junk",
            (record, None): "{not json",
        },
    )
    ((code, out, err),) = _finish(_search(storage, tmp_path))
    assert code == 0 and "Traceback" not in err, err
    said = [line for line in (out + err).splitlines() if "is damaged" in line]
    assert any(
        line.endswith(
            "gradient trace is damaged: it is not base64 text: the float32 "
            "reference of seed 0 runs again"
        )
        for line in said
    ), said
    assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    study = _study(storage)
    _nothing_failed(study)
    again, before = reference_of(study, 0), reference_of(original, 0)
    assert again is not None and before is not None
    assert again.trial > 8 and again.windows == before.windows
    assert again.trace is not None and before.trace is not None
    assert np.array_equal(again.trace.amax, before.trace.amax)
    assert any(
        t.user_attrs.get("baseline") == "pytorch-default" and t.state == TrialState.COMPLETE
        for t in study.trials[9:]
    )
    with open(tmp_path / "amp.yaml", encoding="utf-8") as f:
        damaged = yaml.safe_load(f)["evidence"]["damaged"]
    assert set(damaged) >= {"trial 0"} and "Damaged evidence, left out: trial #0's" in out


def test_a_journal_cut_mid_record_is_mended_and_the_rerun_completes(tmp_path, undisturbed):
    """A worker killed (or a disk full) as it wrote leaves the journal's last record cut
    mid-line: the rerun of the same command sets the cut bytes aside in one line, appends
    after the last whole record, and finishes; ``report`` reads the study after it, with
    every finished run."""
    storage = _damaged_copy(undisturbed, tmp_path, {})
    whole = (tmp_path / "study.log").read_bytes()
    (tmp_path / "study.log").write_bytes(whole[:-40])  # the last record loses its end
    # Optuna reads the whole records before the cut one (read here with Optuna's own
    # storage: scalertune's would mend the file first): those runs must all survive
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    cut = optuna.load_study(
        study_name="shared", storage=JournalStorage(JournalFileBackend(storage))
    )
    finished = {t.number for t in cut.trials if t.state == TrialState.COMPLETE}
    ((code, _, stderr),) = _finish(_search(storage, tmp_path))
    assert code == 0, stderr
    said = [line for line in stderr.splitlines() if "cut mid-line" in line]
    assert len(said) == 1 and "bytes set aside in" in said[0], stderr
    (side,) = tmp_path.glob("study.log.cut-*")
    assert whole[:-40].endswith(side.read_bytes())
    ran = run_cli("report", "--storage", storage, "--study-name", "shared", cwd=tmp_path)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    after = {t.number for t in _study(storage).trials if t.state == TrialState.COMPLETE}
    assert finished <= after
