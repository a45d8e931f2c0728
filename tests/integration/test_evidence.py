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
    needs_postgres,
    postgres_database,
    reference_is_float32s_own,
    s3_bucket,
    spec,
)
from optuna.trial import TrialState

import scalertune
from scalertune._storage import _policy as _storage_policy
from scalertune._storage._optuna import storage_of, study_id

pytestmark = pytest.mark.xdist_group("evidence")

WORKLOAD = "healthy"
#: A search whose answer is the same however its workers share it: no sampled trial (which
#: configs several workers sample depends on who asks first), PyTorch's float16 defaults and
#: the replay's choice, ranked by their steps to the target (one dtype, one step time).
HORIZON = 200
ARGS = [
    "--steps",
    "40",
    "--horizon",
    str(HORIZON),
    "--n-trials",
    "0",
    "--space",
    "float16",
    "--device",
    "cpu",
]
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


def _answer(path):
    """The AMP answer of a search, from its YAML: the best AMP config that held and was
    confirmed. (Whether it or float32 is recommended on this CPU is a timing verdict, within
    the noise here, which the load of two workers at once can tip either way.)"""
    with open(path, encoding="utf-8") as f:
        evidence = yaml.safe_load(f)["evidence"]
    assert "missing" not in evidence
    return evidence["best_amp"]["config"]


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


@pytest.fixture(scope="session")  # once per worker: its group may interleave with other modules
def undisturbed(tmp_path_factory):
    """The same search, one worker, nothing in its way: the answer the others must give."""
    folder = tmp_path_factory.mktemp("undisturbed")
    ((code, out, err),) = _finish(_search(str(folder / "study.log"), folder))
    assert code == 0, err
    return {"answer": _answer(folder / "amp.yaml"), "folder": folder, "summary": out}


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
    assert study.user_attrs["scalertune.artifact_dir"] == str(store)
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
    damaged = [line for line in err.splitlines() if "is damaged" in line]
    assert len(damaged) == 1 and "its pickle asks for more than tensors" in damaged[0]
    assert damaged[0].endswith("falling back to an earlier checkpoint")
    assert _answer(tmp_path / "amp.yaml") == undisturbed["answer"]
    study = _study(str(tmp_path / "study.log"))
    _nothing_failed(study)
    reference_is_float32s_own(study, HORIZON)


def test_a_yaml_that_cannot_be_written_is_one_line_and_loses_nothing(tmp_path, undisturbed):
    """A full disk (no file may grow past a limit): `report -o` ends with one line naming
    the file and exit status 2; the YAML written before is intact, and so is the study."""
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
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
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
            workers = [_search(storage, tmp_path / w) for w in ("a", "b")]
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
