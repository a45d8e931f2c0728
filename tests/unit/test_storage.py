"""The storage's faults: passwords never printed and nothing else masked, outages ridden out
(real SQLite locks), checkpoints that carry their checksum in folders and buckets."""

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from scalertune._storage._redact import redact

#: (password as the user means it, as written in the URL)
PASSWORDS = [
    ("my secret pw", "my secret pw"),
    ("my secret pw", "my%20secret%20pw"),
    ("p@ss:w/rd", "p%40ss%3Aw%2Frd"),
    ("s3cr3t-PW", "s3cr3t-PW"),
    ("e", "e"),
    ("127", "127"),
    ("failed", "failed"),
    ("ünïcødé pässwörd", "ünïcødé pässwörd"),
    ("'quoted\"", "'quoted\""),
]


@pytest.mark.parametrize("password, written", PASSWORDS, ids=[w for _, w in PASSWORDS])
def test_a_storage_url_is_printed_with_its_password_hidden_whatever_it_holds(password, written):
    url = f"postgresql://sp:{written}@127.0.0.1:5432/optuna"
    shown = redact(url)
    assert shown == "postgresql://sp:***@127.0.0.1:5432/optuna"
    # a message quoting the URL, as SQLAlchemy renders it or as the user wrote it
    from sqlalchemy.engine import make_url

    rendered = make_url(url).render_as_string(hide_password=False)
    for quoted in (url, rendered):
        assert redact(f"could not parse '{quoted}' here", url) == (
            f"could not parse '{shown}' here"
        )


@pytest.mark.parametrize(
    "message, password",
    [
        ('connection to server at "127.0.0.1", port 1 failed: Connection refused', "127"),
        ('FATAL:  password authentication failed for user "sp"', "failed"),
        ('FATAL:  password authentication failed for user "sp"', "password"),
        ('FATAL:  database "optuna" does not exist', "optuna"),
        ("server closed the connection unexpectedly", "e"),
    ],
)
def test_a_password_that_is_a_word_or_number_masks_nothing_else(message, password):
    assert redact(message, f"postgresql://sp:{password}@127.0.0.1:1/optuna") == message


@pytest.mark.parametrize(
    "message",
    [
        "invalid connection option: host=db password=PW dbname=optuna",
        "invalid connection option: host=db password='PW' dbname=optuna",
        "postgresql://sp:PW@db/optuna is down",
    ],
)
@pytest.mark.parametrize("password", ["127", "failed", "my secret pw", "e"])
def test_a_password_given_as_one_in_a_message_is_hidden_however_short(message, password):
    shown = redact(message.replace("PW", password), f"postgresql://sp:{password}@db/optuna")
    assert shown == message.replace("PW", "***")


def test_a_distinctive_password_is_hidden_wherever_a_message_quotes_it():
    url = "postgresql://sp:my secret pw@db/optuna"
    assert redact("pw 'my secret pw' rejected", url) == "pw '***' rejected"
    assert redact("rejected s3cr3t-PW!", "postgresql://sp:s3cr3t-PW@db/x") == "rejected ***!"


# -- riding out an outage ---------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path, seconds):
    """Another process's exclusive lock on a SQLite database, for ``seconds``: SQLite's
    "database is locked", as a busy server or a stuck writer gives it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
            "time.sleep(float(sys.argv[2])); c.execute('COMMIT')\n",
            str(path),
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.wait(timeout=60)


def _sqlite_study(tmp_path):
    import optuna

    from scalertune._storage._open import open_storage

    # SQLite's own wait for a lock, cut short: the outage is what is tested here
    url = f"sqlite:///{tmp_path / 's.db'}?timeout=0.05"
    return optuna.create_study(study_name="s", storage=open_storage(url)), url


def test_a_storage_that_is_busy_for_a_while_is_waited_for_and_said_so(tmp_path):
    from scalertune._storage import _outage

    study, _ = _sqlite_study(tmp_path)
    said = []
    _outage.set_log(said.append)
    try:
        with _locked(tmp_path / "s.db", 1.5):
            started = time.monotonic()
            study.set_user_attr("written", True)
            waited = time.monotonic() - started
    finally:
        _outage.set_log(None)
    assert study.user_attrs["written"] is True and 0.5 < waited < 10
    assert len(said) == 2 and "is unreachable (database is locked)" in said[0]
    assert said[1].endswith("is back")


def test_a_storage_down_past_the_bound_ends_the_worker_with_one_line(tmp_path, monkeypatch):
    from scalertune._storage import _outage
    from scalertune._storage import _policy as _storage_policy

    monkeypatch.setattr(_storage_policy, "STORAGE_OUTAGE_S", 0.6)
    study, url = _sqlite_study(tmp_path)
    try:
        with _locked(tmp_path / "s.db", 3):
            with pytest.raises(_outage.Outage) as down:
                study.set_user_attr("written", True)
            started = time.monotonic()
            with pytest.raises(_outage.Outage):  # down for this process: said at once
                study.set_user_attr("written", True)
            assert time.monotonic() - started < 0.5
    finally:
        _outage.forget()
    message = str(down.value)
    assert "\n" not in message and message.startswith(f"storage {url} has been unreachable")
    assert "rerun the same command" in message


#: Appends one record to the journal ``sys.argv[1]`` (relative to the working folder) with
#: the journal lock's grace cut to ``sys.argv[2]`` s; prints the wall and CPU seconds it took.
_APPEND = """
import resource, sys, time
import optuna
from scalertune._storage import _policy
from scalertune._storage._open import open_storage
_policy.JOURNAL_LOCK_GRACE_S = float(sys.argv[2])
study = optuna.load_study(study_name="s", storage=open_storage(sys.argv[1]))
cpu, wall = resource.getrusage(resource.RUSAGE_SELF).ru_utime, time.monotonic()
study.set_user_attr("written", True)
print(time.monotonic() - wall, resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu)
"""

#: Takes Optuna's own lock on the journal ``sys.argv[1]`` and dies holding it (SIGKILL), as a
#: worker killed while it appends.
_DIE_HOLDING = """
import os, signal, sys
from optuna.storages.journal import JournalFileSymlinkLock
JournalFileSymlinkLock(sys.argv[1]).acquire()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    "journal, left_by",
    [
        ("runs/study.log", "a killed worker"),
        ("../study.log", "a killed worker"),
        ("ABSOLUTE", "a killed worker"),
        ("runs/study.log", "a link to nowhere"),
        ("runs/study.log", "a link to a file"),
    ],
)
def test_a_journal_lock_nobody_holds_is_taken_over_after_its_grace_without_spinning(
    tmp_path, journal, left_by
):
    """A lock left behind on a journal (its worker killed as it appended, or planted) is
    taken over once it has been left unchanged for the grace period, whatever it points to
    and however the journal's path was given; the worker waits for it asleep. (Optuna's own
    lock, given ``runs/study.log``, judges the lock through a link that resolves to nothing
    and spins at full CPU for ever.)"""
    import optuna

    from scalertune._storage._open import open_storage

    here = tmp_path / "here"
    (here / "runs").mkdir(parents=True)
    path = str(tmp_path / "study.log") if journal == "ABSOLUTE" else journal
    optuna.create_study(study_name="s", storage=open_storage(str(here / path)))
    lock = here / (path + ".lock")
    victim = tmp_path / "victim"
    victim.write_text("kept")
    if left_by == "a killed worker":
        died = subprocess.run([sys.executable, "-c", _DIE_HOLDING, path], cwd=here, timeout=60)
        assert died.returncode == -9
    else:
        os.symlink(str(victim) if left_by == "a link to a file" else "nowhere/at/all", lock)
    assert os.path.islink(lock)
    appended = subprocess.run(
        [sys.executable, "-c", _APPEND, path, "1.5"],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert appended.returncode == 0, appended.stderr
    wall, cpu = map(float, appended.stdout.split())
    assert 1.5 < wall < 20 and cpu < 0.5, (wall, cpu)
    said, named = appended.stderr.splitlines(), os.path.abspath(here / path) + ".lock"
    assert len(said) == 2, said
    assert said[0] == (
        f"journal file {path}: its lock {named} is held; waiting for it (a lock "
        "left unchanged for 1.5 s is taken over)"
    )
    assert said[1] == (
        f"journal file {path}: its lock {named}, unchanged for 1.5 s (as a worker killed "
        "while appending leaves it), taken over"
    )
    assert not os.path.lexists(lock) and victim.read_text() == "kept"
    assert sorted(p.name for p in lock.parent.iterdir() if "study.log" in p.name) == ["study.log"]
    study = optuna.load_study(study_name="s", storage=open_storage(str(here / path)))
    assert study.user_attrs == {"written": True}


#: Counts to ``sys.argv[1]`` in the file ``count``, each read and write under the journal
#: ``j.log``'s lock, its grace cut to 1 s.
_COUNT_UNDER_THE_LOCK = """
import sys
from scalertune._storage import _policy
from scalertune._storage._journal_lock import JournalLock
_policy.JOURNAL_LOCK_GRACE_S = 1.0
lock = JournalLock("j.log")
for _ in range(int(sys.argv[1])):
    lock.acquire()
    try:
        n = int(open("count").read())
        open("count", "w").write(str(n + 1))
    finally:
        lock.release()
"""


def test_workers_that_find_one_stale_journal_lock_at_once_take_it_over_once(tmp_path):
    """Four workers wait on one stale lock from the same moment: one takes it over, and the
    lock then lets one of them at a time in (Optuna's take-over lets two that saw it stale
    both remove it, the second the fresh lock the first made since)."""
    (tmp_path / "j.log").touch()
    (tmp_path / "count").write_text("0")
    os.symlink("nowhere", tmp_path / "j.log.lock")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _COUNT_UNDER_THE_LOCK, "200"],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    said = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, said
    assert sum(", taken over" in s for s in said) == 1, said
    assert (tmp_path / "count").read_text() == "800"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["count", "j.log"]


def test_a_storage_error_that_does_not_pass_is_not_retried(tmp_path):
    import sqlalchemy

    from scalertune._storage._outage import passing_rdb

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(sqlalchemy.exc.OperationalError) as caught, engine.connect() as c:
        c.execute(sqlalchemy.text("SELECT * FROM no_such_table"))
    assert not passing_rdb(caught.value)


# -- checkpoints that carry their checksum -----------------------------------------------------


def _saved(location, step=30):
    """A real float32 checkpoint of the healthy workload at ``step``, stored at ``location``;
    the checkpoint, and the losses of the run that goes on from it to step 60."""
    import torch
    import workloads

    from scalertune._amp._config import AmpConfig
    from scalertune._run._loop import Plan, run_config
    from scalertune._storage._checkpoints import StoredCheckpoint
    from scalertune._storage._store import Store

    stored = StoredCheckpoint(Store(location), "study-abc.reference-seed0-step30.pt")
    run_config(
        workloads.healthy,
        AmpConfig(dtype="float32"),
        steps=step,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(save_at={step: stored}),
    )
    whole = run_config(
        workloads.healthy, AmpConfig(dtype="float32"), steps=60, seed=0, device=torch.device("cpu")
    )
    return stored, whole.losses[step:]


def _branch(path):
    import torch
    import workloads

    from scalertune._amp._config import AmpConfig
    from scalertune._run._loop import Plan, run_config

    return run_config(
        workloads.healthy,
        AmpConfig(dtype="float32"),
        steps=60,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(checkpoint=path),
    ).losses


def _damage(stored, how):
    """Damage the stored file as a disk, a copy or a person would: cut short, emptied,
    overwritten in the middle, or gone."""
    from optuna.artifacts.exceptions import ArtifactNotFound

    body = stored.store.read(stored.name, lambda f: f.read())
    damaged = {
        "truncated": body[: len(body) // 3],
        "emptied": b"",
        "garbled": body[:500] + bytes(b ^ 0xFF for b in body[500:600]) + body[600:],
    }
    if how == "gone":
        stored.store.inner.remove(stored.name)
        with pytest.raises(ArtifactNotFound):
            stored.store.read(stored.name, lambda f: f.read())
        return
    import io

    stored.store.inner.write(stored.name, io.BytesIO(damaged[how]))


@pytest.mark.parametrize("how", ["truncated", "emptied", "garbled", "gone"])
def test_a_damaged_checkpoint_is_named_in_one_line_and_never_loaded(tmp_path, how):
    from scalertune._errors import MissingEvidence

    stored, after = _saved(str(tmp_path / "artifacts"))
    assert _branch(stored.fetch()) == after  # whole, it replays the run bit for bit
    _damage(stored, how)
    with pytest.raises(MissingEvidence) as missing:
        stored.fetch()
    said = str(missing.value)
    assert "\n" not in said and stored.name in said and str(tmp_path / "artifacts") in said
    assert ("is missing its file" if how == "gone" else "is damaged") in said


def test_a_checkpoint_swapped_before_it_is_stored_is_not_vouched_for(tmp_path, monkeypatch):
    """Whoever can write the store replaces the run's file between its write and its store
    (a new user's strace showed the file hashed again from the store's folder there): the
    manifest holds the digest of the bytes the run wrote, so the planted file is damaged
    evidence, never loaded, where its own bytes were hashed and vouched for."""
    from scalertune._errors import MissingEvidence
    from scalertune._storage._checkpoints import StoredCheckpoint

    planted, _ = _saved(str(tmp_path / "elsewhere"), step=10)  # a real checkpoint, not this
    plant = planted.store.read(planted.name, lambda f: f.read())
    publish = StoredCheckpoint.publish

    def swapped(self, path, step, *written):
        with open(path, "wb") as f:
            f.write(plant)
        publish(self, path, step, *written)

    monkeypatch.setattr(StoredCheckpoint, "publish", swapped)
    stored, _ = _saved(str(tmp_path / "artifacts"))
    with pytest.raises(MissingEvidence, match="is damaged: its file is"):
        stored.fetch()


def test_a_checkpoint_without_its_manifest_was_never_finished(tmp_path):
    from scalertune._errors import MissingEvidence

    stored, _ = _saved(str(tmp_path / "artifacts"))
    stored.store.inner.remove(stored.name + ".json")
    assert stored.manifest() is None
    with pytest.raises(MissingEvidence, match="is missing$"):
        stored.fetch()


def test_checkpoints_in_an_s3_bucket_carry_their_checksum_too(tmp_path):
    """... and are copied here no further than their manifest says."""
    from conftest import s3_bucket

    from scalertune._errors import MissingEvidence

    with s3_bucket() as bucket:
        stored, after = _saved(bucket)
        import boto3

        keys = {
            o["Key"]
            for o in boto3.client("s3").list_objects_v2(Bucket=bucket[len("s3://") :])["Contents"]
        }
        assert keys == {stored.name, stored.name + ".json"}
        assert stored.manifest()["step"] == 30
        assert _branch(stored.fetch()) == after
        _damage(stored, "truncated")
        # a good copy fetched before is used again; a worker without one fetches the damage
        assert _branch(stored.fetch()) == after
        from scalertune._storage import _checkpoints

        for name in os.listdir(_checkpoints._scratch()):
            os.remove(os.path.join(_checkpoints._scratch(), name))
        with pytest.raises(MissingEvidence, match=f"{stored.name} in {bucket} is damaged"):
            stored.fetch()
        # a planted file longer than its manifest says is copied here no further than the
        # bytes it should have and one more: it fills no disk
        import io

        size = stored.manifest()["bytes"]
        stored.store.inner.write(stored.name, io.BytesIO(b"\0" * (size + 8 * 2**20)))
        with pytest.raises(MissingEvidence, match=f"its file is {size + 1} bytes"):
            stored.fetch()


def test_a_long_run_also_saves_every_few_minutes_into_two_slots_in_turn(tmp_path):
    """The schedule's clock, shortened: every window saves, into the two slots in turn; the
    later slot holds the latest state, the earlier one the state before it."""
    import torch
    import workloads

    from scalertune._amp._config import AmpConfig
    from scalertune._run._checkpoint import SaveSchedule
    from scalertune._run._loop import Plan, run_config
    from scalertune._storage._checkpoints import StoredCheckpoint
    from scalertune._storage._store import Store

    store = Store(str(tmp_path / "artifacts"))
    slots = (StoredCheckpoint(store, "a.pt"), StoredCheckpoint(store, "b.pt"))
    fixed = StoredCheckpoint(store, "step20.pt")
    run_config(
        workloads.healthy,
        AmpConfig(dtype="float32"),
        steps=50,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(save_at=SaveSchedule({20: fixed}, slots=slots, every_s=0.0)),
    )
    steps = sorted(s.manifest()["step"] for s in slots)
    assert steps == [40, 50] and fixed.manifest()["step"] == 20
    never = SaveSchedule({20: fixed}, slots=slots, every_s=300.0)
    assert 10 not in never and 10 not in never and 20 in never


def test_what_is_checked_is_what_is_loaded_a_file_swapped_after_the_check_is_never_read(
    tmp_path,
):
    """The checked copy is this process's own: the store's file swapped for another right
    after the check (the window between a check and a load) changes nothing that loads."""
    stored, after = _saved(str(tmp_path / "artifacts"))
    path = stored.fetch()
    own = stored.store.path(stored.name)
    assert os.path.realpath(path) != os.path.realpath(own)
    with open(path, "rb") as f:
        checked = f.read()
    with open(own, "wb") as f:  # the planted file, after the check
        f.write(b"planted" * 1000)
    with open(path, "rb") as f:
        assert f.read() == checked
    assert _branch(path) == after


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_a_link_or_a_fifo_in_place_of_a_checkpoint_is_damaged_evidence_and_never_followed(
    tmp_path, planted
):
    """Missing evidence, never followed, and named as what it is (a tester found a link and
    a FIFO both said to be 'missing its file')."""
    from scalertune._errors import MissingEvidence

    stored, _ = _saved(str(tmp_path / "artifacts"))
    own = stored.store.path(stored.name)
    os.remove(own)
    if planted == "symlink":
        (tmp_path / "elsewhere").write_bytes(b"x" * 10)
        os.symlink(tmp_path / "elsewhere", own)
        what = "is a symbolic link"
    else:
        os.mkfifo(own)  # a reader of a FIFO would wait forever
        what = "is not a regular file"
    with pytest.raises(MissingEvidence) as damaged:
        stored.fetch()
    assert str(damaged.value) == f"{stored.describe()} is damaged: its file {what}, not read"


# -- a study key: manifests signed, planted files told apart ------------------------------------

KEY, OTHER_KEY = "a study key 7f3c9e", "another key 1b2d4a"


def test_with_a_study_key_a_planted_checkpoint_with_a_matching_checksum_is_refused(
    tmp_path, monkeypatch
):
    """Whoever can write the store can rewrite a manifest's checksum, not its signature."""
    from fault_launcher import damage

    from scalertune._errors import MissingEvidence

    monkeypatch.setenv("SCALERTUNE_STUDY_KEY", KEY)
    stored, after = _saved(str(tmp_path / "artifacts"))
    manifest = stored.manifest()
    assert len(manifest["hmac"]) == 64 and KEY not in json.dumps(manifest)
    assert _branch(stored.fetch()) == after
    monkeypatch.setenv("SCALERTUNE_TEST_PLANTED", str(tmp_path / "ran"))
    damage(stored, "planted")  # the file and its checksum replaced, the signature kept
    with pytest.raises(MissingEvidence) as refused:
        stored.fetch()
    said = str(refused.value)
    assert "is damaged: its signature is not the study key's" in said and KEY not in said
    assert not (tmp_path / "ran").exists()


def test_a_checkpoint_signed_under_another_key_or_none_is_refused_where_a_key_is_set(
    tmp_path, monkeypatch
):
    from scalertune._errors import MissingEvidence

    monkeypatch.setenv("SCALERTUNE_STUDY_KEY", OTHER_KEY)
    signed, after = _saved(str(tmp_path / "signed"))
    monkeypatch.delenv("SCALERTUNE_STUDY_KEY")
    unsigned, _ = _saved(str(tmp_path / "unsigned"))
    assert "hmac" not in unsigned.manifest()
    # without a key nothing is checked: a key adds a check, it takes nothing away
    assert _branch(signed.fetch()) == after and _branch(unsigned.fetch()) == after
    monkeypatch.setenv("SCALERTUNE_STUDY_KEY", KEY)
    with pytest.raises(MissingEvidence, match="its signature is not the study key's") as other:
        signed.fetch()
    with pytest.raises(MissingEvidence, match="carries no signature") as none:
        unsigned.fetch()
    for said in (str(other.value), str(none.value)):
        assert KEY not in said and OTHER_KEY not in said and "\n" not in said


@pytest.mark.parametrize(
    "digest", ["../../escaped", "A" * 64, 64], ids=["a-path", "not-hex", "not-text"]
)
def test_a_manifest_whose_digest_is_not_one_is_damaged(tmp_path, digest):
    """A bucket's checkpoint is fetched into a file named by its digest: never a path."""
    import io

    from scalertune._errors import MissingEvidence

    stored, _ = _saved(str(tmp_path / "artifacts"))
    manifest = {**stored.manifest(), "sha256": digest}
    stored.store.inner.write(stored.name + ".json", io.BytesIO(json.dumps(manifest).encode()))
    with pytest.raises(MissingEvidence, match="its checksum record is not readable"):
        stored.fetch()


# -- names and records read back from a study or a store ----------------------------------------


@pytest.mark.parametrize("name", ["../escaped.pt", "/etc/passwd", "a/b.pt", ".hidden", "..", ""])
def test_a_name_that_is_not_a_plain_file_name_never_reaches_the_store(tmp_path, name):
    """A checkpoint's name can come from a study, which others may write: a path, or a name
    that climbs out of the store, is damaged evidence before any file is opened."""
    from scalertune._errors import DamagedEvidence
    from scalertune._storage._checkpoints import StoredCheckpoint
    from scalertune._storage._store import Store

    (tmp_path / "escaped.pt").write_bytes(b"outside the store")
    store = Store(str(tmp_path / "artifacts"))
    with pytest.raises(DamagedEvidence, match="is not the name of a file in an artifact store"):
        store.read(name, lambda f: f.read())
    with pytest.raises(DamagedEvidence):
        store.write(name, str(tmp_path / "escaped.pt"))
    with pytest.raises(DamagedEvidence):
        StoredCheckpoint(store, name).fetch()
    assert (tmp_path / "escaped.pt").read_bytes() == b"outside the store"


def test_a_manifest_longer_than_one_is_damaged_without_being_read_whole(tmp_path):
    import io

    from scalertune._errors import MissingEvidence

    stored, _ = _saved(str(tmp_path / "artifacts"))
    padded = json.dumps({**stored.manifest(), "pad": "x" * 2**16}).encode()
    stored.store.inner.write(stored.name + ".json", io.BytesIO(padded))
    with pytest.raises(MissingEvidence, match="its checksum record is not readable"):
        stored.fetch()


def test_a_claim_that_is_not_one_is_no_claim(tmp_path):
    """A claim's value in the study is junk (written by someone else, or torn): nobody holds
    it, and the next worker takes it over and does the work."""
    import optuna

    from scalertune._storage._claims import Once, held
    from scalertune._storage._open import open_storage
    from scalertune._storage._optuna import storage_of, study_id

    study = optuna.create_study(storage=open_storage(str(tmp_path / "j.log")))
    done = []
    for junk in ("junk", {"by": 5, "at": "now"}, {"by": "host:1"}, ["by", "at"]):
        storage_of(study).set_study_system_attr(study_id(study), "scalertune.claim.k", junk)
        assert not held(study, "k")
        Once(study)("k", lambda: done.append(1), lambda: len(done) == 4)
    assert done == [1, 1, 1, 1]


def _journal(path):
    """Optuna's own storage on a journal file."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    return JournalStorage(JournalFileBackend(str(path)))


def _add_trial(path, value, create=False):
    import optuna

    journal = _journal(path)
    make = optuna.create_study if create else optuna.load_study
    study = make(study_name="s", storage=journal)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=value))


def test_a_cut_record_longer_than_one_read_is_set_aside_whole(tmp_path, monkeypatch, capsys):
    """A cut record longer than the mend's read from the end (a run's gradient trace is one
    record) goes aside whole: the journal ends at its last whole record, Optuna reads the
    study and its next trial after the mend."""
    import optuna

    from scalertune._storage import _open

    path = tmp_path / "study.log"
    _add_trial(path, 1.0, create=True)
    _add_trial(path, 2.0)
    whole = path.read_bytes()
    cut = b'{"op_code": 4, "worker_id": "w", "user_attr": {"trace": "' + b"x" * 5000
    path.write_bytes(whole + cut)
    monkeypatch.setattr(_open, "_TAIL_BYTES", 1024)  # the record spans five reads
    side = _open.mend_cut_record(str(path))
    assert path.read_bytes() == whole
    assert pathlib.Path(side).read_bytes() == cut
    assert f"its {len(cut)} bytes set aside in {side};" in capsys.readouterr().err
    _add_trial(path, 3.0)
    study = optuna.load_study(study_name="s", storage=_journal(path))
    assert [t.value for t in study.trials] == [1.0, 2.0, 3.0]


def test_a_last_record_cut_only_of_its_newline_is_kept(tmp_path, capsys):
    """A journal cut between its last record and that record's newline holds the record
    whole (no prefix of a JSON object is one): the line is ended, nothing is set aside, and
    Optuna reads that trial and the next."""
    import optuna

    from scalertune._storage._open import mend_cut_record

    path = tmp_path / "study.log"
    _add_trial(path, 1.0, create=True)
    _add_trial(path, 2.0)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])  # the last record, its newline lost
    assert mend_cut_record(str(path)) is None
    assert path.read_bytes() == whole
    assert "lacked only its line end" in capsys.readouterr().err
    assert not [p for p in os.listdir(tmp_path) if ".cut-" in p]
    _add_trial(path, 3.0)
    study = optuna.load_study(study_name="s", storage=_journal(path))
    assert [t.value for t in study.trials] == [1.0, 2.0, 3.0]


def test_the_cut_bytes_go_to_a_new_file_never_through_a_planted_link_nor_over_a_side_file(
    tmp_path,
):
    """Whoever can write the journal's folder may plant links at the side file's predictable
    names (the time): the mend creates a file of its own instead, and two mends within one
    second keep both cut records."""
    from scalertune._storage._open import mend_cut_record

    path = tmp_path / "study.log"
    _add_trial(path, 1.0, create=True)
    whole = path.read_bytes()
    victim = tmp_path / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("left alone")
    now = int(time.time())
    for second in range(now - 1, now + 30):
        os.symlink(victim, tmp_path / f"study.log.cut-{second}")
    cuts = [b'{"op_code": 1, "half', b'{"op_code": 2, "other half']
    sides = []
    for cut in cuts:
        path.write_bytes(whole + cut)
        sides.append(pathlib.Path(mend_cut_record(str(path))))
        assert path.read_bytes() == whole
    assert victim.read_text() == "left alone"
    assert [s.read_bytes() for s in sides] == cuts and not any(s.is_symlink() for s in sides)


def test_a_bucket_without_credentials_is_one_line_naming_them(tmp_path, monkeypatch):
    """Before any run: boto3 finds no credentials anywhere (no variables, no files, no
    instance metadata), which is the user's to set, not a traceback. boto3 signs before it
    sends, so the endpoint (a closed port) is never reached."""
    from scalertune._errors import UsageError
    from scalertune._storage._store import Store

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # credentials an earlier test found
    with pytest.raises(UsageError, match=r"boto3 finds no credentials: set AWS_ACCESS_KEY_ID"):
        Store("s3://scalertune-no-credentials").check()
