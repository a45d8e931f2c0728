"""A storage that can no longer be written: a full disk, the file-size limit, a read-only
database. Each ends the command in one true line with exit status 3 (where Optuna said
"exceeding max length", SQLite gave a traceback and a journal ``AssertionError: Should not
reach.``), nothing finished is lost, and the same command rerun completes (issue 50).

The disk fills for real: a file-size limit (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored so the
write fails instead of the process dying) in the search's own process, and, where this
machine lets a test mount one, a small tmpfs."""

import contextlib
import os
import resource
import signal
import subprocess
import sys

import optuna
import pytest
from conftest import spec
from optuna.trial import TrialState

pytestmark = pytest.mark.slow  # each runs a whole search, most of them twice

#: Where each storage's file-size limit falls inside a search: past an empty study (a
#: journal's first record; SQLite's 112 KiB of tables), before the search's end (61 KiB and
#: 160 KiB).
LIMITS = {"study.log": 20_000, "study.db": 125_000}
SEARCH = ["--steps", "20", "--n-trials", "2", "--device", "cpu", "-o", "amp.yaml"]


def _search(storage, cwd, *, fsize=None, extra=()):
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "scalertune", "search", spec("healthy"), "--storage", storage]
        + SEARCH
        + list(extra),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        stdin=subprocess.DEVNULL,
        preexec_fn=None if fsize is None else limited,
    )


def _finished(path):
    """The finished runs of the study at ``path``: number -> (values, user attributes)."""
    storage = (
        f"sqlite:///{path}"
        if path.endswith(".db")
        else optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    )
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    return {
        t.number: (t.values, t.user_attrs) for t in study.trials if t.state == TrialState.COMPLETE
    }


def _refused_in_one_line(done, *why):
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "exceeding max length" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot be written" in last and "rerun the same command" in last, done.stderr
    assert any(w in last for w in why), last


def _completes_and_keeps(storage, cwd, before):
    again = _search(storage, cwd)
    assert again.returncode == 0, again.stderr
    assert "Recommended:" in again.stdout
    after = _finished(os.path.join(cwd, storage))
    assert {n: after[n] for n in before} == before  # nothing finished was lost
    assert os.path.exists(os.path.join(cwd, "amp.yaml"))


@pytest.mark.parametrize("storage", sorted(LIMITS))
def test_a_file_size_limit_mid_search_is_one_line_and_the_rerun_completes(tmp_path, storage):
    done = _search(storage, tmp_path, fsize=LIMITS[storage])
    _refused_in_one_line(done, "file-size limit")
    path = str(tmp_path / storage)
    before = _finished(path)
    assert before, "the limit fell before any run finished: move it"
    if storage.endswith(".log"):
        with open(path, "rb") as f:
            assert f.read().endswith(b"\n")  # the refused append was cut back, whole records
        assert not [n for n in os.listdir(tmp_path) if ".cut-" in n]
    _completes_and_keeps(storage, tmp_path, before)


@contextlib.contextmanager
def _mounted(folder, size):
    """A tmpfs of ``size`` at ``folder``, where this machine lets a test mount one."""
    folder.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize("storage, size", [("study.log", "32k"), ("study.db", "168k")])
def test_a_full_disk_mid_search_is_one_line_and_the_rerun_completes(tmp_path, storage, size):
    """A real full disk (a small tmpfs): the storage's file on it, the search's outputs
    beside; the study copied out whole to a disk with room, where the rerun completes (SQLite
    takes pages in steps: on 168 KiB its disk fills as the notes are written, at the end)."""
    import shutil

    with _mounted(tmp_path / "disk", size) as disk:
        done = _search(os.path.join(disk, storage), tmp_path)
        _refused_in_one_line(done, "the disk is full", "a write failed")
        shutil.copy(os.path.join(disk, storage), tmp_path / storage)
    before = _finished(str(tmp_path / storage))  # where it filled depends on the pages
    _completes_and_keeps(storage, tmp_path, before)


def test_a_full_disk_under_the_checkpoints_is_one_line_and_the_rerun_completes(tmp_path):
    """The artifact store on a full disk, the storage beside it with room: the float32
    reference's first checkpoint cannot be written. One line naming the checkpoint, exit 3,
    where it read "the float32 reference failed: OSError ..." (or torch's RuntimeError of a
    short write), exit 1, as if the workload were at fault; with room, the rerun completes."""
    with _mounted(tmp_path / "disk", "16k") as disk:
        extra = ["--horizon", "80", "--artifact-dir", str(disk)]
        done = _search("study.log", tmp_path, extra=extra)
        assert done.returncode == 3, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr and "reference failed" not in done.stderr
        assert last.startswith("scalertune search: the float32 reference stopped: could not "
                               "store checkpoint "), last  # fmt: skip
        assert "No space left on device: free space" in last, last
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        again = _search("study.log", tmp_path, extra=extra)
    assert again.returncode == 0 and "Recommended:" in again.stdout, again.stderr


@pytest.mark.parametrize("storage", sorted(LIMITS))
def test_a_read_only_database_is_said_as_such_in_one_line(tmp_path, storage):
    """A study made, then its file system made read-only (or, not as root, the file and its
    folder): the next search says so, where Optuna said "exceeding max length"."""
    with contextlib.ExitStack() as stack:
        if os.geteuid() == 0:
            disk = stack.enter_context(_mounted(tmp_path / "disk", "4m"))
        else:
            disk = tmp_path / "disk"
            disk.mkdir()
        path = os.path.join(disk, storage)
        with open(path, "wb"):  # an empty journal: a new study to write into
            pass
        if storage.endswith(".db"):  # made in a process of its own: none holds it open
            os.remove(path)
            made = f"import optuna; optuna.create_study(storage='sqlite:///{path}')"
            subprocess.run([sys.executable, "-c", made], check=True, capture_output=True)
        if os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        else:
            os.chmod(path, 0o444)
            os.chmod(disk, 0o555)
            stack.callback(os.chmod, disk, 0o755)
        done = _search(path, tmp_path)
    _refused_in_one_line(done, "read-only")


def test_a_real_runs_record_on_a_storage_that_cannot_be_written_is_one_warning(tmp_path):
    """Training goes on: the record a loaded run writes to its study in the background meets
    the file-size limit, and the log says so once, where the thread died with a traceback."""
    import shutil

    from conftest import HERE

    journal = tmp_path / "v1.journal"
    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), journal)
    script = (
        "import logging, signal, resource, os\n"
        "logging.basicConfig()\n"
        "from scalertune import AmpConfig, CheckPolicy\n"
        "from scalertune._inrun._run_record import RunRecord\n"
        "from scalertune._storage._run_log import RunLog\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "size = os.path.getsize('v1.journal')\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))\n"
        "log = RunLog('v1.journal', 'short')\n"
        "log(RunRecord(policy=CheckPolicy(), config=AmpConfig(), steps=1))\n"
        "log.close()\n"
        "print('trained on')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0 and done.stdout == "trained on\n", done.stderr
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr
    (said,) = done.stderr.strip().splitlines()
    assert "the run's record cannot be written" in said and "file-size limit" in said


def test_a_heartbeat_that_cannot_be_written_leaves_the_one_line_to_the_worker(tmp_path):
    """Optuna's heartbeat thread writes every few seconds: where the disk refuses its write,
    it ends quietly (a traceback from a thread, before the worker's own line, is not one
    line), and the worker's next write says why."""
    script = (
        "import os, resource, signal, optuna\n"
        "from scalertune._storage._open import open_storage\n"
        "from scalertune._storage._optuna import trial_id\n"
        "from scalertune._storage._outage import Outage\n"
        "storage = open_storage('sqlite:///s.db')\n"
        "trial = optuna.create_study(storage=storage).ask()\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))  # no page, no journal\n"
        "storage.record_heartbeat(trial_id(trial))\n"
        "try:\n"
        "    trial.set_user_attr('x', 'y' * 100_000)\n"
        "except Outage as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    (said,) = done.stdout.strip().splitlines()
    assert said.startswith("storage sqlite:///s.db cannot be written: ")
