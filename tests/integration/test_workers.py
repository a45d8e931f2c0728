"""Many workers, crashes and bad trials: nothing is lost, nothing runs twice."""

import collections
import json
import signal
import socket
import subprocess
import sys
import time

import optuna
import pytest
from conftest import (
    amp_answer,
    needs_postgres,
    needs_postgres_server,
    postgres_database,
    postgres_server,
    run_cli,
    spec,
)
from optuna.trial import TrialState

import scalertune
from scalertune import _policy
from scalertune._search._options import Isolation

#: Sampled trials a worker's search asks for: as many as sampling runs on this flat workload
#: before it stops on trials that only tie (``STUDY_TIED_TRIALS``), so that the study's
#: total is exactly the number asked for, and a trial lost or run twice shows.
SAMPLED = _policy.STUDY_TIED_TRIALS


def _worker(storage, *extra, cwd, workload="slow", n_trials=SAMPLED):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec(workload),
            "--storage",
            storage,
            "--study-name",
            "shared",
            "--n-trials",
            str(n_trials),
            "--steps",
            "40",
            "--device",
            "cpu",
            *extra,
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _storage_object(url):
    from scalertune._storage._open import open_storage

    return open_storage(url)


def _trials(url):
    try:
        return optuna.load_study(study_name="shared", storage=_storage_object(url)).trials
    except KeyError:  # the workers have not created the study yet
        return []


#: The trials a worker is killed in the middle of.
KILLED_ROLES = ("search", "baseline")


def _worker_pid(trial):
    pid = str(trial.user_attrs.get("worker", "")).rpartition(":")[2]
    return int(pid) if pid.isdigit() else None


def _cut_off(trial, pid):
    """Whether ``trial`` is one the killed worker ``pid`` did not finish: still RUNNING, or
    failed with no error of its own (by another worker that saw the process gone)."""
    unfinished = trial.state == TrialState.RUNNING or (
        trial.state == TrialState.FAIL and not {"error", "missing"} & set(trial.user_attrs)
    )
    return unfinished and _worker_pid(trial) == pid and trial.user_attrs.get("role") in KILLED_ROLES


def _kill_one_mid_trial(url, workers):
    """SIGKILL a worker while it runs a baseline or sampled trial; return that trial and the
    pids killed.

    The trial cut off is read back after the kill (:func:`_cut_off`): one seen RUNNING may
    have finished in the moment between the read and the signal (a loaded CI machine took
    that long once). A worker that was between such trials is dead too; then another one is
    killed."""
    pids = {w.pid: w for w in workers}
    killed = []
    deadline = time.time() + 180
    while time.time() < deadline and len(pids) > 1:
        for trial in _trials(url):
            pid = _worker_pid(trial)
            if (
                trial.state == TrialState.RUNNING
                and pid in pids
                and trial.user_attrs.get("role") in KILLED_ROLES
            ):
                victim = pids.pop(pid)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed.append(pid)
                cut = [t.number for t in _trials(url) if _cut_off(t, pid)]
                if cut:
                    return max(cut), killed
                break
        time.sleep(0.1)
    raise AssertionError(f"no worker was killed mid-trial (killed between trials: {killed})")


def _table(trials):
    """The study's trials, one line each: what a failed assertion here shows."""
    return "\n".join(
        f"#{t.number} {t.state.name} {t.user_attrs.get('role')} "
        f"worker={t.user_attrs.get('worker')} failed_trial={t.system_attrs.get('failed_trial')} "
        f"error={t.user_attrs.get('error')}"
        for t in trials
    )


def _check_nothing_lost(url, killed_number, cwd):
    trials = _trials(url)
    table = f"killed #{killed_number}; the study:\n{_table(trials)}"
    numbers = [t.number for t in trials]
    assert numbers == list(range(len(trials))), table
    states = collections.Counter(t.state for t in trials)
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0, table
    killed = trials[killed_number]
    assert killed.state == TrialState.FAIL, table
    first = killed.system_attrs.get("failed_trial", killed_number)  # it may be a retry itself
    retries = [
        t
        for t in trials
        if t.system_attrs.get("failed_trial") == first and t.number > killed_number
    ]
    assert len(retries) == 1, table
    assert retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert retries[0].params == killed.params
    assert retries[0].user_attrs["config"] == killed.user_attrs["config"]
    roles = collections.Counter(
        t.user_attrs["role"]
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and "duplicate_of" not in t.user_attrs
    )
    assert roles["search"] == SAMPLED
    baselines = [
        t.user_attrs["baseline"]
        for t in trials
        if t.user_attrs.get("role") == "baseline" and t.state != TrialState.FAIL
    ]
    # each baseline once: PyTorch's defaults, and the article's fix where the replay tells
    assert "pytorch-default" in baselines and sorted(baselines) == sorted(set(baselines))
    references = [t.user_attrs["seed"] for t in trials if t.user_attrs.get("role") == "reference"]
    assert sorted(references) == sorted(set(references)) and 0 in references
    confirms = [
        (t.user_attrs["confirms"], t.user_attrs["seed"])
        for t in trials
        if t.user_attrs.get("role") == "confirm" and t.state != TrialState.FAIL
    ]
    assert len(confirms) == len(set(confirms)) > 0
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "report",
            "--storage",
            url,
            "--study-name",
            "shared",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    result = scalertune.analyze(
        optuna.load_study(study_name="shared", storage=_storage_object(url))
    )
    assert data["config"] == result.config.to_dict()
    assert data["evidence"]["best_amp"]["trial"] == amp_answer(result).number
    assert len([o for o in result.ranking if o.role == "search"]) == SAMPLED


def _three_workers_one_killed(url, cwd):
    workers = [_worker(url, "-q", cwd=cwd) for _ in range(3)]
    try:
        killed_number, killed_pids = _kill_one_mid_trial(url, workers)
        for w in workers:
            if w.pid not in killed_pids:
                _, err = w.communicate(timeout=400)
                assert w.returncode == 0, err
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    _check_nothing_lost(url, killed_number, cwd)


def test_three_workers_on_a_journal_file_survive_a_killed_worker(tmp_path):
    _three_workers_one_killed(str(tmp_path / "study.log"), tmp_path)


@needs_postgres
def test_three_workers_on_postgresql_survive_a_killed_worker(tmp_path):
    with postgres_database("scalertune") as fresh:
        _three_workers_one_killed(fresh(), tmp_path)


def test_ctrl_c_keeps_finished_trials_and_a_rerun_resumes_to_the_total(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    worker = _worker(url, cwd=tmp_path, n_trials=SAMPLED)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            done = [
                t
                for t in _trials(url)
                if t.user_attrs.get("role") == "search"
                and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            ]
            if len(done) >= 2:
                break
            time.sleep(0.2)
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 130, err
    assert "Traceback" not in err
    assert "Interrupted: every finished trial is kept" in out
    if not any(
        t.user_attrs.get("role") == "confirm" and t.state == TrialState.COMPLETE
        for t in _trials(url)
    ):
        # stopped before any confirmation: no verdict it has no evidence for
        assert "Recommended: pending: the search was interrupted before" in out, out
        assert "Verdict:" not in out and "keep training in float32" not in out
    trials = _trials(url)
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    rerun = _worker(url, cwd=tmp_path, n_trials=SAMPLED)
    out, err = rerun.communicate(timeout=400)
    assert rerun.returncode == 0, err
    assert f"resuming study 'shared': {len(finished)} runs finished" in err + out
    after = _trials(url)
    assert all(after[t.number].state == t.state for t in finished)
    searched = [
        t
        for t in after
        if t.user_attrs.get("role") == "search"
        and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and "duplicate_of" not in t.user_attrs
    ]
    assert len(searched) == SAMPLED


def test_a_run_another_worker_held_that_turns_out_a_reused_twin_is_sampled_again(tmp_path):
    """A sampled trial another worker is running counts toward the budget; when that worker
    dies, the trial's queued run can find its config finished already and be reused, which
    does not count: the search samples one more instead of ending a trial short."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = _worker(url, cwd=tmp_path, workload="healthy", n_trials=2)
    first.communicate(timeout=300)
    assert first.returncode == 0
    study = optuna.load_study(study_name="shared", storage=_storage_object(url))
    finished = next(
        t
        for t in study.trials
        if t.user_attrs.get("role") == "search"
        and t.state == TrialState.COMPLETE
        and "duplicate_of" not in t.user_attrs
    )
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        host = socket.gethostname()
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params=finished.params,
                distributions=finished.distributions,
                user_attrs={
                    **{
                        k: v
                        for k, v in finished.user_attrs.items()
                        if k in ("role", "config", "seed")
                    },
                    "worker": f"{host}:{holder.pid}",
                },
            )
        )
        rerun = _worker(url, cwd=tmp_path, workload="healthy", n_trials=3)
        time.sleep(8)  # the rerun counts the held trial and waits for it
        holder.kill()
        out, err = rerun.communicate(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert rerun.returncode == 0, err
    after = optuna.load_study(study_name="shared", storage=_storage_object(url)).trials
    reused = [t for t in after if "duplicate_of" in t.user_attrs]
    assert reused and all(after[t.user_attrs["duplicate_of"]].params == t.params for t in reused)
    trained = [
        t
        for t in after
        if t.user_attrs.get("role") == "search"
        and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and "duplicate_of" not in t.user_attrs
    ]
    assert len(trained) == 3, out


def _isolated(tmp_path, workload, **limits):
    # The two baselines are float16 and crash; the sampled bfloat16 trial runs.
    return scalertune.search(
        spec(workload),
        storage=f"sqlite:///{tmp_path / 's.db'}",
        space="bfloat16",
        n_trials=1,
        steps=30,
        device="cpu",
        isolation=Isolation(**limits),
    )


def _float16_failures(result):
    study = result.study
    return [
        t
        for t in study.trials
        if t.state == TrialState.FAIL and t.user_attrs.get("config", {}).get("dtype") == "float16"
    ]


def test_an_aborting_trial_fails_alone_when_isolated(tmp_path):
    result = _isolated(tmp_path, "aborts_in_float16")
    failures = _float16_failures(result)
    # the float16 baselines (the article's fix too, where the replay tells it apart)
    assert 1 <= len(failures) <= 2
    assert {t.user_attrs["role"] for t in failures} == {"baseline"}
    assert all("SIGABRT" in t.user_attrs["error"] for t in failures)
    assert amp_answer(result) is not None and amp_answer(result).config.dtype == "bfloat16"


def test_a_hanging_trial_is_killed_at_its_time_limit(tmp_path):
    started = time.time()
    result = _isolated(tmp_path, "hangs_in_float16", timeout_s=15)
    failures = _float16_failures(result)
    assert failures and all("timed out" in t.user_attrs["error"] for t in failures)
    assert time.time() - started < 300


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_run_in_its_own_process_sees_the_environment_as_it_is_when_the_run_starts(
    method, monkeypatch
):
    """One server forks every run's processes, started at the first run: each run still sees
    the search's environment as it is when that run starts, and torch uses OMP_NUM_THREADS's
    thread count, as a freshly spawned process (the start method where the platform has no
    forkserver) does."""
    import torch

    from scalertune._amp._config import AmpConfig
    from scalertune._processes import _start
    from scalertune._processes._protocol import TrialCrashed
    from scalertune._search._launch import run_isolated

    monkeypatch.setattr(_start, "START_METHOD", method)
    seen = []
    for mark, threads in (("first", "1"), ("second", "2")):
        monkeypatch.setenv("SCALERTUNE_TEST_MARK", mark)
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        with pytest.raises(TrialCrashed) as raised:
            run_isolated(
                spec("reports_its_environment"),
                AmpConfig(dtype="float32"),
                steps=1,
                seed=0,
                device=torch.device("cpu"),
                timeout_s=120,
                memory_gb=None,
            )
        seen.append(str(raised.value).splitlines()[0])
    assert seen == ["FactoryError: RuntimeError: first 1", "FactoryError: RuntimeError: second 2"]


def test_a_memory_hungry_trial_is_reported_as_out_of_memory(tmp_path):
    result = _isolated(tmp_path, "eats_memory_in_float16", memory_gb=4)
    failures = _float16_failures(result)
    assert failures and all("out of memory" in t.user_attrs["error"] for t in failures)


def test_user_errors_fail_the_trial_and_the_search_moves_on(tmp_path):
    result = scalertune.search(
        spec("raises_in_float16"),
        storage=f"sqlite:///{tmp_path / 's.db'}",
        n_trials=4,
        steps=30,
        device="cpu",
    )
    failures = _float16_failures(result)
    assert failures
    assert all("no float16 implementation" in t.user_attrs["error"] for t in failures)
    assert all("Traceback" in t.system_attrs["scalertune.traceback"] for t in failures)
    assert result.failed == len(failures)


def test_a_broken_workload_stops_the_search_at_once(tmp_path):
    with pytest.raises(scalertune.SearchError, match="labels out of range"):
        scalertune.search(
            spec("always_raises"),
            storage=f"sqlite:///{tmp_path / 's.db'}",
            n_trials=20,
            steps=30,
            device="cpu",
        )
    study = optuna.load_study(
        study_name="workloads:always_raises", storage=f"sqlite:///{tmp_path / 's.db'}"
    )
    assert len([t for t in study.trials if t.state == TrialState.FAIL]) == 5
    # its report judges no config: every AMP run raised, which says nothing of the configs
    from scalertune._review._analyze import analyze

    summary = analyze(study).summary()
    assert "no AMP config was judged: no AMP run finished, and 5 runs raised an error" in summary
    assert "reached the float32 target" not in summary.split("Verdict:")[1]


@pytest.mark.parametrize(
    "url, message",
    [
        ("postgresql://bob:hunter2@127.0.0.1:1/optuna", "cannot open storage"),
        ("notadb://x", "cannot open storage"),
        ("mysql://bob:hunter2@127.0.0.1/optuna", "needs a database driver that is not installed"),
        ("sqlite:////no/such/folder/s.db", "the folder /no/such/folder does not exist"),
    ],
)
def test_storage_errors_are_one_line_and_never_show_the_password(tmp_path, url, message):
    proc = subprocess.run(
        [sys.executable, "-m", "scalertune", "search", spec("healthy"), "--storage", url],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout


def test_a_study_created_with_another_space_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    scalertune.search(
        spec("healthy"), storage=url, n_trials=0, steps=30, device="cpu", space="float16"
    )
    with pytest.raises(scalertune.UsageError, match="created with space='float16'"):
        scalertune.search(
            spec("healthy"), storage=url, n_trials=1, steps=30, device="cpu", space="bfloat16"
        )


@needs_postgres_server
def test_a_storage_not_up_as_a_worker_starts_is_waited_for_where_asked():
    """A worker that opens its storage while the server is down (a restart, a database
    container that starts beside the workers) waits for it with ``--wait-for-storage``,
    saying so once, and opens it once the server is up: here a real server, stopped, and
    started two seconds into the wait."""
    import threading

    from scalertune._storage import _outage
    from scalertune._storage._open import open_storage

    said = []
    with postgres_server() as server:
        server.stop()
        starter = threading.Timer(2.0, server.start)
        _outage.set_log(said.append)
        started = time.monotonic()
        try:
            starter.start()
            storage = open_storage(server.url, wait_s=60)
        finally:
            starter.join()
            _outage.set_log(None)
        waited = time.monotonic() - started
        study = optuna.create_study(storage=storage, study_name="up")
        assert [s.study_name for s in storage.get_all_studies()] == [study.study_name]
    assert waited >= 2.0, waited
    assert len(said) == 2, said
    assert (
        said[0].startswith(f"storage {server.url} is not up (") and "Connection refused" in said[0]
    )
    assert said[0].endswith("waiting for it for up to 60 s (--wait-for-storage)")
    assert said[1] == f"storage {server.url} is up"


def test_a_storage_never_up_within_the_wait_ends_the_search_with_status_3(tmp_path):
    """Past ``--wait-for-storage`` the search ends in one line after the one that said it
    waits, exit status 3 (a scheduler's retry), no password, nothing written; without the
    flag, the same URL is refused at once, exit 2 (a wrong port is likelier)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://bob:hunter2@127.0.0.1:{port}/optuna"
    started = time.monotonic()
    ran = run_cli(
        "search",
        spec("healthy"),
        "--storage",
        url,
        "--wait-for-storage",
        "1.5",
        cwd=tmp_path,
        process=True,
    )
    assert time.monotonic() - started >= 1.5
    assert ran.returncode == 3, ran.stderr
    lines = ran.stderr.strip().splitlines()
    shown = f"postgresql://bob:***@127.0.0.1:{port}/optuna"
    assert len(lines) == 2 and lines[0].startswith(f"storage {shown} is not up ("), lines
    assert lines[1].startswith(
        f"scalertune search: storage {shown} was not up after 1.5 s of --wait-for-storage ("
    ), lines
    assert lines[1].endswith("check the URL, or start the server and rerun the same command")
    assert "hunter2" not in ran.stderr + ran.stdout and not list(tmp_path.iterdir())
