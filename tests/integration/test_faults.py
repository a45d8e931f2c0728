"""Faults repeated until they stop finding anything: workers interrupted (SIGINT once or twice,
SIGTERM) or killed (SIGKILL) at random moments, on a journal file, SQLite and PostgreSQL, a
PostgreSQL database that drops every connection and refuses new ones for a few seconds, and,
over a horizon with each worker started in its own folder, a worker killed the moment a
checkpoint it stored is damaged (cut short, emptied, garbled, gone); after every round the
same command resumes the study, which must then hold exactly what one uninterrupted search
would: nothing RUNNING, nothing lost, no evidence missing, nothing run twice but a declared
retry, the float32 references and the baselines once, float32's losses over the horizon those
of one undisturbed run, and the recommendation ``report`` gives.

Bounded by rounds and by time (``SCALERTUNE_FAULT_ROUNDS`` rounds per loop, 1 by default;
none started after ``SCALERTUNE_FAULT_BUDGET_S`` seconds per loop; each worker and rerun
within ``STUCK_S``): CI runs one round of each, a different random one every time; a long
hunt raises both (``benchmarks/soak.py``).
``SCALERTUNE_FAULT_SEED`` replays one sequence of faults; a failure names its seed.
"""

import collections
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import optuna
import pytest
import yaml
from conftest import (
    HERE,
    HORIZON_SEARCH,
    horizon_answer,
    needs_postgres,
    needs_postgres_server,
    postgres_database,
    postgres_server,
    reference_is_float32s_own,
    run_cli,
    spec,
)
from optuna.trial import TrialState

#: Rounds per loop: one in CI (the seven loops' rounds took 321 s together on a 2-core machine
#: at load average 5-8, other work running beside), a different random one every run; the soak
#: runs many.
ROUNDS = int(os.environ.get("SCALERTUNE_FAULT_ROUNDS", "1"))
#: No round starts after this many seconds of a loop (the first always runs).
BUDGET_S = float(os.environ.get("SCALERTUNE_FAULT_BUDGET_S", "40"))
SEED = int(os.environ.get("SCALERTUNE_FAULT_SEED", str(random.randrange(2**31))))
N_TRIALS, STEPS = 3, 20
#: Where each round that held notes the faults it injected, one JSON list a line
#: (``benchmarks/soak.py`` counts them); nowhere unless set.
FAULT_LOG = os.environ.get("SCALERTUNE_FAULT_LOG")
#: What can happen to one worker: nothing, Ctrl-C once or twice, SIGTERM, SIGKILL from outside
#: at a random moment, or one of them from inside its N-th storage write (``fault_launcher``).
FAULTS = ("none", "int", "int-int", "term", "kill", "int@write", "term@write", "kill@write")
#: ... on PostgreSQL, the database closed to every worker for a few seconds at that moment;
OUTAGE = "outage"
#: ... with an S3 artifact store, its server (moto's) stopped for a few seconds and started;
S3_OUTAGE = "s3-outage"
#: ... under a team's load, the PostgreSQL server itself stopped at once and started again.
PG_RESTART = "pg-restart"
#: ... over a horizon, its N-th stored checkpoint damaged (or replaced, with a manifest to
#: match, by a pickle that runs a command on load, or by another model's checkpoint) and the
#: worker SIGKILLed at once.
DAMAGED = tuple(
    f"{how}@checkpoint" for how in ("truncated", "emptied", "garbled", "gone", "planted", "foreign")
)
#: A search here makes a few hundred storage writes; N is drawn below this.
WRITES = 400
#: ... and, over ``HORIZON``, stores a few checkpoints (float32's, a finalist's own).
HORIZON, CHECKPOINTS = 200, 5


@dataclasses.dataclass(frozen=True)
class Loop:
    """What one fault loop runs: the faults drawn, whether the search covers a horizon, and
    whether each worker starts in its own folder (as on its own host)."""

    faults: tuple = FAULTS
    horizon: bool = False
    own_folders: bool = False
    #: The S3 endpoint (``conftest.S3Endpoint``) whose bucket is the artifact store, if any.
    s3: object = None

    def args(self):
        horizon = ["--horizon", str(HORIZON)] if self.horizon else []
        return [*horizon, *(["--artifact-dir", self.s3.bucket] if self.s3 else [])]


PLAIN = Loop()
LAUNCHER = os.path.join(HERE, "fault_launcher.py")
#: A worker or a resume that runs longer than this is stuck (a whole search takes ~10 s).
STUCK_S = 150


def _command(storage, study, output, fault="none", rng=None, loop=PLAIN):
    args = [
        "search",
        spec("healthy"),
        "--storage",
        storage,
        "--study-name",
        study,
        "--n-trials",
        str(N_TRIALS),
        "--steps",
        str(STEPS),
        "--device",
        "cpu",
        *([] if loop.s3 else ["-q"]),  # an outage of the artifact store is said, not quiet
        "-o",
        output,
        *loop.args(),
    ]
    if fault.endswith("@checkpoint"):
        how = fault.split("@")[0]
        return [
            sys.executable,
            LAUNCHER,
            "checkpoint",
            how,
            str(rng.randrange(1, CHECKPOINTS)),
            *args,
        ]
    if fault.endswith("@write"):
        signal_name = fault.split("@")[0].upper()
        return [sys.executable, LAUNCHER, signal_name, str(rng.randrange(1, WRITES)), *args]
    return [sys.executable, "-m", "scalertune", *args]


def _start(command, cwd, env=None):
    return subprocess.Popen(
        command,
        cwd=cwd,
        # A worker found stuck is aborted, and its stacks show where it waited (_stacks_of).
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


_STORAGES = {}


def _study(storage, name):
    from scalertune._storage._open import open_storage

    if storage not in _STORAGES:
        _STORAGES[storage] = open_storage(storage)
    return optuna.load_study(study_name=name, storage=_STORAGES[storage])


def _folder(cwd, i, loop):
    """Where worker ``i`` starts: the round's folder, or one of its own."""
    if not loop.own_folders:
        return cwd
    folder = os.path.join(cwd, f"worker{i}")
    os.makedirs(folder, exist_ok=True)
    return folder


def _from(storage, folder):
    """The storage as a worker in ``folder`` names it: a file by its path from there."""
    return storage if "://" in storage else os.path.relpath(storage, folder)


def _faulted_workers(storage, study, workers, rng, cwd, loop):
    """Start ``workers`` processes on one study, hit each (at least one) with a random fault
    at a random moment, and return ``[(fault, returncode, stderr)]``."""
    faults = [rng.choice(loop.faults) for _ in range(workers)]
    if all(f == "none" for f in faults):
        faults[rng.randrange(workers)] = rng.choice(loop.faults[1:])
    folders = [_folder(cwd, i, loop) for i in range(workers)]
    procs = [
        _start(
            _command(_from(storage, folders[i]), study, f"{study}.w{i}.yaml", fault, rng, loop),
            folders[i],
        )
        for i, fault in enumerate(faults)
    ]
    try:
        for i in sorted(
            (i for i, f in enumerate(faults) if f not in ("none",) and "@" not in f),
            key=lambda _: rng.random(),
        ):
            if faults[i] == S3_OUTAGE:
                _wait_for_a_checkpoint(loop.s3, study, procs)
            else:
                _wait_for_a_moment(storage, study, procs, rng)
            if faults[i] == OUTAGE:
                _outage(storage, rng.uniform(1.0, 5.0))
            elif faults[i] == S3_OUTAGE:
                loop.s3.stop()
                time.sleep(rng.uniform(1.0, 5.0))
                loop.s3.start()
            else:
                _hit(procs[i], faults[i], rng)
        out = []
        for i, (fault, proc) in enumerate(zip(faults, procs)):
            try:
                _, err = proc.communicate(timeout=STUCK_S)
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"{storage} {study} (SCALERTUNE_FAULT_SEED={SEED}): worker {i} of {faults} "
                    f"is stuck after {STUCK_S} s; where it waits:\n{_stacks_of(proc)}"
                )
            out.append((fault, proc.returncode, err))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _stacks_of(proc):
    """The end of what a stuck worker printed, with its threads' stacks: it is aborted, and
    Python's fault handler (``PYTHONFAULTHANDLER``, which ``_start`` sets) prints them."""
    proc.send_signal(signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err[-6000:]


def _wait_for_a_moment(storage, study, procs, rng):
    """Wait for a random moment: one in five during start-up (importing torch, the float32
    check, opening the storage), the others once the study holds a random number of trials
    (the reference, the baselines, sampled trials, the confirmations), a few milliseconds into
    whatever runs then. Never before every worker handles signals: a process that Python is
    still starting dies of any signal, whatever program it will run."""
    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline and not all(_handles_signals(p) for p in procs):
        time.sleep(0.01)
    if rng.random() < 0.2:
        time.sleep(rng.uniform(0.0, 2.5))
        return
    wanted = rng.randrange(1, 3 + N_TRIALS + 3 * 2 + 2)
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        try:
            if len(_study(storage, study).get_trials(deepcopy=False)) >= wanted:
                break
        except KeyError:  # not created yet
            pass
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.25))


def _wait_for_a_checkpoint(s3, study, procs):
    """Wait until the bucket holds a checkpoint of ``study`` whole (its manifest): the
    float32 reference is saving its checkpoints, and the branches will read them. (The
    bucket outlives a round: an earlier round's checkpoints, named by their study, do not
    count.)"""
    import boto3

    client, bucket = boto3.client("s3"), s3.bucket[len("s3://") :]
    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        ours = [o["Key"].rpartition("/")[2] for o in listed]
        if any(k.startswith(f"{study}-") and k.endswith(".pt.json") for k in ours):
            return
        time.sleep(0.05)


def _handles_signals(proc):
    """Whether the process catches SIGTERM (Linux): scalertune's handlers are in place; or it
    has exited already."""
    if proc.poll() is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/status", encoding="ascii") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):  # gone already, or not Linux
        return True
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def _hit(proc, fault, rng):
    if proc.poll() is not None:
        return
    if fault == "kill":
        proc.send_signal(signal.SIGKILL)
    elif fault == "term":
        proc.send_signal(signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGINT)
        if fault == "int-int":
            time.sleep(rng.uniform(0.01, 0.4))
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)


def _outage(storage, seconds):
    """Close the PostgreSQL database to connections and drop the open ones, for ``seconds``:
    what every worker sees of a restart, of its database alone."""
    import sqlalchemy
    from conftest import POSTGRES

    name = storage.rsplit("/", 1)[1]
    admin = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
            c.execute(
                sqlalchemy.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}'"
                )
            )
        time.sleep(seconds)
    finally:
        with admin.connect() as c:
            c.execute(sqlalchemy.text(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        admin.dispose()
        _STORAGES.pop(storage, None)  # this process's own connections were dropped too


def _check_exits(results, context):
    for fault, code, err in results:
        where = f"{context}, worker hit by {fault}"
        assert "Traceback" not in err, f"{where}: {err}"
        if fault.startswith("kill") or fault.endswith("@checkpoint"):
            # 0 when it finished, or another worker stored the checkpoints first
            assert code in (0, -signal.SIGKILL), f"{where}: exit {code}: {err}"
        elif fault in ("none", OUTAGE, S3_OUTAGE):
            assert code == 0, f"{where}: a worker nobody touched exited {code}: {err}"
        else:
            # 0 only when the search had finished before the signal arrived
            assert code in (0, 130), f"{where}: exit {code}, not 130: {err}"


def _finished(trials):
    return {
        t.number: (t.state, t.values)
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    }


def _check_study(study, before, context, loop=PLAIN):
    """The invariants of a finished study, whatever happened to its workers."""
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == list(range(len(trials))), context
    states = collections.Counter(t.state for t in trials)
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0, (
        f"{context}: left {states}"
    )
    after = _finished(trials)
    assert all(after.get(n) == v for n, v in before.items()), f"{context}: a finished trial changed"

    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # A sampled config the study had finished already is reused, not trained: it does not
    # count, and it must name a finished trial of that config.
    trained = [
        t
        for t in done
        if t.user_attrs.get("role") == "search" and "duplicate_of" not in t.user_attrs
    ]
    stopped = study.user_attrs.get("scalertune.stopped_early")
    assert len(trained) == N_TRIALS or (stopped and len(trained) < N_TRIALS), (
        f"{context}: {len(trained)} sampled trials trained (stopped early: {stopped})"
    )
    for t in done:
        if "duplicate_of" in t.user_attrs:
            original = trials[t.user_attrs["duplicate_of"]]
            assert original.state in (TrialState.COMPLETE, TrialState.PRUNED), context
            assert original.user_attrs["config"] == t.user_attrs["config"], context
    roles = collections.Counter(t.user_attrs.get("role") for t in done)
    assert roles["recommended"] == 1, f"{context}: {roles}"
    references = [t.user_attrs["seed"] for t in trials if t.user_attrs.get("role") == "reference"]
    assert sorted(references) == sorted(set(references)) and 0 in references, (
        f"{context}: float32 references {references}"
    )
    baselines = [t.user_attrs["baseline"] for t in done if t.user_attrs.get("role") == "baseline"]
    # PyTorch's defaults are trained; the article's fix only where the replay tells it from
    # them (never over a horizon)
    assert "pytorch-default" in baselines and len(baselines) == len(set(baselines)), (
        f"{context}: {baselines}"
    )
    assert not loop.horizon or baselines == ["pytorch-default"], f"{context}: {baselines}"
    from scalertune._storage._recovery import missing_of

    assert not missing_of(trials), f"{context}: evidence missing {missing_of(trials)}"
    if loop.horizon:
        reference_is_float32s_own(study, HORIZON, context)
    confirms = [
        (t.user_attrs["confirms"], t.user_attrs["seed"])
        for t in done
        if t.user_attrs.get("role") == "confirm"
    ]
    assert len(confirms) == len(set(confirms)) > 0, f"{context}: confirmations {confirms}"
    assert {seed for _, seed in confirms} <= set(references), context

    for t in trials:
        if t.state == TrialState.FAIL and t.user_attrs.get("role") != "surplus":
            # The healthy workload never fails on its own: a stored error is an interruption
            # or a storage error recorded as if the config had failed.
            assert "error" not in t.user_attrs, (
                f"{context}: trial #{t.number} failed with {t.user_attrs['error']!r}"
            )
    retries = collections.Counter(
        t.system_attrs["failed_trial"] for t in done if "failed_trial" in t.system_attrs
    )
    assert all(n == 1 for n in retries.values()), f"{context}: retried twice: {retries}"
    assert all(trials[n].state == TrialState.FAIL for n in retries), context


def _check_report(storage, study, output, cwd, context):
    report = run_cli("report", "--storage", storage, "--study-name", study, "--json", cwd=cwd)
    assert report.returncode == 0, f"{context}: report: {report.stderr}"
    with open(os.path.join(cwd, output), encoding="utf-8") as f:
        written = yaml.safe_load(f)
    assert json.loads(report.stdout) == written, f"{context}: report differs from the search"


def _held(faults, started):
    """A round started at ``started`` (``time.monotonic()``) held after ``faults`` (their
    kinds): noted in ``FAULT_LOG`` with its seconds."""
    if FAULT_LOG:
        seconds = round(time.monotonic() - started, 1)
        with open(FAULT_LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"faults": list(faults), "seconds": seconds}) + "\n")


def _rounds(storage, workers, cwd, loop=PLAIN):
    rng = random.Random(SEED)
    deadline = time.monotonic() + BUDGET_S
    done = 0
    while done < ROUNDS and (done == 0 or time.monotonic() < deadline):
        study, started = f"round{done}", time.monotonic()
        context = f"{storage} round {done} (SCALERTUNE_FAULT_SEED={SEED})"
        results = _faulted_workers(storage, study, workers, rng, cwd, loop)
        _check_exits(results, context)
        if any(fault == S3_OUTAGE for fault, _, _ in results):  # and it was ridden out
            said = "\n".join(err for _, _, err in results)
            assert f"artifact store {loop.s3.bucket} is unreachable" in said, f"{context}: {said}"
            assert f"artifact store {loop.s3.bucket} is back" in said, f"{context}: {said}"
        try:
            before = _finished(_study(storage, study).get_trials(deepcopy=False))
        except KeyError:  # every worker was stopped before it created the study
            before = {}
        output = f"{study}.yaml"
        resume = _start(_command(storage, study, output, loop=loop), cwd)
        try:
            out, err = resume.communicate(timeout=STUCK_S)
        except subprocess.TimeoutExpired:
            stacks = _stacks_of(resume)
            running = [
                t.number for t in _study(storage, study).trials if t.state == TrialState.RUNNING
            ]
            pytest.fail(
                f"{context}: the resume hangs; RUNNING trials {running} after "
                f"{[r[0] for r in results]}; where it waits:\n{stacks}"
            )
        assert resume.returncode == 0, f"{context}: the resume exited {resume.returncode}: {err}"
        _check_study(_study(storage, study), before, context, loop)
        _check_report(storage, study, output, cwd, context)
        # Interrupted and lost runs are counted as such, never as runs that raised an error;
        # a run retried for want of evidence is neither.
        lost = sum(
            t.state == TrialState.FAIL
            and t.user_attrs.get("role") != "surplus"
            and "missing" not in t.user_attrs
            for t in _study(storage, study).get_trials(deepcopy=False)
        )
        assert "raised an error" not in out and "Missing evidence" not in out, f"{context}: {out}"
        assert (f"{lost} run{'s' if lost != 1 else ''} interrupted or lost" in out) == (lost > 0), (
            f"{context}: {lost} failed trials; {out}"
        )
        _held((fault for fault, _, _ in results if fault != "none"), started)
        done += 1


def test_faults_on_a_journal_file(tmp_path):
    _rounds(str(tmp_path / "study.log"), 3, tmp_path)


def test_faults_on_sqlite_one_worker(tmp_path):
    _rounds(f"sqlite:///{tmp_path / 'study.db'}", 1, tmp_path)


@needs_postgres
def test_faults_on_postgresql(tmp_path):
    with postgres_database("scalertune_faults") as fresh:
        _rounds(fresh(), 3, tmp_path, Loop(faults=(*FAULTS, OUTAGE)))


def test_faults_over_a_horizon_with_each_worker_in_its_own_folder(tmp_path, monkeypatch):
    """Checkpoints in the study's artifact store, beside the journal file: a worker killed as
    its checkpoint is damaged (or replaced by a pickle that runs a command on load, which no
    worker ever runs), and the others (started in other folders) go on."""
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("SCALERTUNE_TEST_PLANTED", str(mark))
    _rounds(
        str(tmp_path / "study.log"),
        2,
        str(tmp_path),
        Loop(faults=("none", "kill", *DAMAGED), horizon=True, own_folders=True),
    )
    assert not mark.exists()


def test_an_s3_artifact_store_down_for_seconds_is_ridden_out_like_a_database(tmp_path):
    """Over a horizon, every checkpoint in an S3 bucket, the workers in folders of their own
    (as on their own hosts): the S3 endpoint is stopped for a few seconds at a random moment
    and started again; the workers wait for it as for a database, within the same bound,
    and the study holds what one uninterrupted search would."""
    from conftest import s3_endpoint

    with s3_endpoint() as s3:
        _rounds(
            str(tmp_path / "study.log"),
            2,
            str(tmp_path),
            Loop(faults=("none", S3_OUTAGE), horizon=True, own_folders=True, s3=s3),
        )


# -- the same faults, replayed step by step where a random moment finds them only by chance --


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _journal_study(tmp_path, name="replay"):
    from scalertune._storage._open import open_storage

    return optuna.create_study(study_name=name, storage=open_storage(str(tmp_path / "j.log")))


def _left_running_by_a_dead_worker(study, **user_attrs):
    """A RUNNING trial (params ``x`` = 0.5) whose worker, on this host, is a process gone."""
    from scalertune._storage._recovery import WORKER

    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.RUNNING,
            params={"x": 0.5},
            distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
            user_attrs={**user_attrs, "worker": f"{WORKER.rpartition(':')[0]}:{_dead_pid()}"},
        )
    )


def test_a_retry_belongs_to_the_worker_that_runs_it(tmp_path):
    """Worker A dies in a trial; C fails it and queues it again; B takes the copy; C (or a
    fourth worker) recovers again while B runs it: B's trial must stay B's."""
    from scalertune._storage._recovery import recover, take

    study = _journal_study(tmp_path)
    _left_running_by_a_dead_worker(
        study, role="search", seed=0, config={"dtype": "bfloat16"}, steps_run=7
    )
    lines = []
    recover(study, lines.append)  # C
    original, copy = study.get_trials(deepcopy=False)
    assert original.state == TrialState.FAIL and copy.state == TrialState.WAITING
    assert copy.user_attrs == {"role": "search", "seed": 0, "config": {"dtype": "bfloat16"}}
    assert copy.params == {"x": 0.5} and copy.system_attrs["failed_trial"] == 0
    assert "process" in lines[0] and "queued again" in lines[0]

    trial = study.ask()  # B pops the copy ...
    recover(study, lines.append)  # ... C recovers before B has named itself ...
    take(trial)
    recover(study, lines.append)  # ... and after
    assert study.get_trials(deepcopy=False)[1].state == TrialState.RUNNING
    assert trial.suggest_float("x", 0, 1) == 0.5
    study.tell(trial, 1.0)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert len(lines) == 1


def test_a_surplus_trial_left_running_by_a_dead_worker_is_failed_not_queued_again(tmp_path):
    """A worker that took a trial over the budget dies after naming it surplus and before
    failing it: recovery fails it, and queues nothing, since it names no run (a copy would
    carry no config for the next worker to train)."""
    from scalertune._storage._recovery import recover

    study = _journal_study(tmp_path)
    _left_running_by_a_dead_worker(study, role="surplus")
    lines = []
    recover(study, lines.append)
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    assert lines[0].endswith("which is gone: marked failed"), lines


class _KilledAfter:
    """A running trial whose worker is killed after ``writes`` of its attributes: every
    later write is lost."""

    def __init__(self, trial, writes):
        self.trial, self.left = trial, writes

    def set_user_attr(self, key, value):
        if self.left == 0:
            raise KeyboardInterrupt  # the kill: nothing after it is written
        self.left -= 1
        self.trial.set_user_attr(key, value)


def test_a_sampled_trials_role_is_stored_with_its_whole_job_wherever_its_worker_dies(tmp_path):
    """A sampled trial's job is three writes (config, seed, role): a worker killed between
    them leaves either no role, or a role with the config and seed the retry and the report
    read (a kill between role and config once left a failed run of no config)."""
    from scalertune._amp._config import AmpConfig
    from scalertune._storage._trial_record import Job

    job = Job(role="search", config=AmpConfig(dtype="bfloat16"), seed=0)
    study = _journal_study(tmp_path)
    for writes in range(len(job.attrs()) + 1):
        trial = study.ask()
        with contextlib.suppress(KeyboardInterrupt):
            job.write(_KilledAfter(trial, writes))
        stored = study.get_trials(deepcopy=False)[trial.number].user_attrs
        assert "role" not in stored or Job.read(stored) == job, (writes, stored)
    assert Job.read(stored) == job


def test_the_retry_of_a_sampled_trial_killed_before_its_role_counts_and_is_never_surplus(
    tmp_path,
):
    """A worker killed before its sampled trial's role leaves a failed trial of no role and a
    queued copy of none either: the copy counts in the budget while it waits (another
    worker would sample one config too many), and when it runs it is the run it copies,
    never a surplus trial dropped."""
    from scalertune._judge._view import StudyView
    from scalertune._search._trials import _a_retry, _surplus, counted_search_trials
    from scalertune._storage._recovery import recover
    from scalertune._storage._trial_record import Marks

    study = _journal_study(tmp_path)
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE,
            value=1.0,
            params={"x": 0.25},
            distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
            user_attrs={"role": "search", "seed": 0, "config": {"dtype": "float16"}},
        )
    )
    _left_running_by_a_dead_worker(study, seed=0, config={"dtype": "bfloat16"})
    recover(study, lambda line: None)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert "role" not in trials[2].user_attrs and trials[2].params == {"x": 0.5}
    assert counted_search_trials(trials, Marks.sound) == 2
    view = StudyView(study)
    assert _surplus(view, trials, 3, n_trials=2)  # a trial asked next is over the budget
    assert _a_retry(trials, 2) and not _a_retry(trials, 0)


def test_a_trial_taken_by_a_worker_that_died_before_naming_itself_is_recovered(
    tmp_path, monkeypatch
):
    """A trial RUNNING with no worker and no heartbeat (the worker died right after taking
    it) is failed and queued again once it has stayed so for the grace period."""
    from scalertune._storage import _policy as _storage_policy
    from scalertune._storage._optuna import take_waiting_trial
    from scalertune._storage._recovery import recover

    monkeypatch.setattr(_storage_policy, "HEARTBEAT_GRACE_S", 0.5)
    study = _journal_study(tmp_path)
    study.enqueue_trial(
        {},
        user_attrs={
            "role": "baseline",
            "baseline": "pytorch-default",
            "seed": 0,
            "config": {"dtype": "float16"},
        },
    )
    take_waiting_trial(study)  # taken, and its worker died at once
    lines = []
    recover(study, lines.append)
    assert [t.state for t in study.trials] == [TrialState.RUNNING]
    time.sleep(0.6)
    recover(study, lines.append)
    original, copy = study.trials
    assert original.state == TrialState.FAIL and copy.state == TrialState.WAITING
    assert copy.user_attrs["baseline"] == "pytorch-default"
    assert "died before naming itself" in lines[0]


def _descendants(pid):
    """The processes below ``pid``: its children (a run's process, or the server that forks
    them) and theirs."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    below, level = [], [pid]
    while level:
        level = [p for p, parent in parents.items() if parent in level]
        below += level
    return below


def _gone(pid, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_an_isolated_trial_dies_with_its_parent(tmp_path, signum):
    hang = tmp_path / "hang.pid"
    proc = _start(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec("hangs_in_float16"),
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--space",
            "float16",
            "--n-trials",
            "1",
            "--steps",
            "20",
            "--device",
            "cpu",
            "--isolate",
            "-q",
        ],
        tmp_path,
        env={"SCALERTUNE_TEST_HANG": str(hang)},
    )
    try:
        # Every float16 step 3 hangs (the step timing after the float32 reference, then each
        # trial), its process saying so first. Whichever it is, it is below the search's.
        deadline = time.monotonic() + STUCK_S
        while not hang.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert hang.exists(), "no run of the search reached its hang"
        hanging = _descendants(proc.pid)
        assert int(hang.read_text()) in hanging
        proc.send_signal(signum)
        proc.wait(timeout=60)
        assert all(_gone(pid, within_s=10) for pid in hanging), "a trial outlived its parent"
        if signum != signal.SIGKILL:
            assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_interrupt_out_of_code_evaluated_from_c_still_exits_130(tmp_path):
    # CPython marks such an interrupt, and at the end of `python -m` exits through SIGINT
    # (-2) whatever status the program chose, unless the mark is cleared
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec("interrupted_in_code_evaluated_from_c"),
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--steps",
            "20",
            "--device",
            "cpu",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=STUCK_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 130 and proc.stderr == "scalertune: interrupted\n", proc.stderr


def test_ctrl_c_waits_for_an_import_to_finish_and_then_stops(tmp_path):
    # An import cut by a KeyboardInterrupt inside an extension's C++ (torch's pybind11
    # modules) aborts the process; scalertune lets imports finish and stops after them.
    (tmp_path / "model.py").write_text(
        "import os, pathlib, signal\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "pathlib.Path('imported').write_text('whole')\n"
        "def make_model():\n"
        "    raise AssertionError('the search went on after Ctrl-C')\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            "model.py:make_model",
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--steps",
            "20",
            "--device",
            "cpu",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=STUCK_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 130 and proc.stderr == "scalertune: interrupted\n", proc.stderr
    assert (tmp_path / "imported").read_text() == "whole"


@pytest.mark.parametrize(
    "workload, extra, message",
    [
        (
            "aborts_in_every_run",
            [],
            "the float32 reference failed: the trial's process died with SIGABRT",
        ),
        ("hangs_in_every_run", ["--trial-timeout", "3"], "the float32 reference failed: timed out"),
    ],
)
def test_isolation_covers_the_float32_reference(tmp_path, workload, extra, message):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec(workload),
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--n-trials",
            "1",
            "--steps",
            "20",
            "--device",
            "cpu",
            "--isolate",
            "-q",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=STUCK_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


_OPEN_AT = """
import sys, time
from scalertune._storage._open import open_storage
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    open_storage(sys.argv[1])
    print("ok")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def _cold_starts(url_of_round, cwd, rounds=4, workers=3):
    for i in range(rounds):
        url = url_of_round(i)
        start = time.time() + 1.5  # after every process has imported what it needs
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _OPEN_AT, url, str(start)],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(workers)
        ]
        outs = [p.communicate(timeout=120)[0].strip() for p in procs]
        assert outs == ["ok"] * workers, f"round {i}: {outs}"


def test_workers_opening_a_new_sqlite_file_at_once_all_open_it(tmp_path):
    _cold_starts(lambda i: f"sqlite:///{tmp_path / f'cold{i}.db'}", tmp_path)


@needs_postgres
def test_workers_opening_a_new_postgresql_database_at_once_all_open_it(tmp_path):
    with postgres_database("scalertune_cold") as fresh:
        _cold_starts(lambda i: fresh(), tmp_path)


# -- a rank of a 2-process run killed at random points ------------------------------------------

#: A rank is killed as it starts a step drawn up to this one: every run that trains gets there.
RANK_KILL_STEPS = 10


def _start_ranks_search(folder, kill=None):
    """``scalertune search`` of a DDP factory that declares 2 ranks (gloo on the CPU), whose
    rank ``kill[0]`` SIGKILLs itself as it starts step ``kill[2]`` of its ``kill[1]``-th run
    that trains (``distributed_workloads.ddp_rank_killed``), started in ``folder``."""
    import distributed_workloads

    os.makedirs(folder, exist_ok=True)
    rank, run, step = kill or (0, 10**6, 1)
    return _start(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            f"{distributed_workloads.HERE}:ddp_rank_killed",
            "--steps",
            str(STEPS),
            "--n-trials",
            "0",
            "--space",
            "float16",
            "--device",
            "cpu",
            "--storage",
            "study.log",
            "--study-name",
            "ranks",
            "-o",
            "amp.yaml",
        ],
        folder,
        env={"SCALERTUNE_TEST_RANK_KILL": f"{os.path.join(folder, 'killed')}:{rank}:{run}:{step}"},
    )


def _ranks_search_ended(proc, folder):
    """What the search :func:`_start_ranks_search` started did: exit status, output, answer,
    the runs that trained on the rank to kill, and whether it was killed."""
    out, err = proc.communicate(timeout=STUCK_S * 2)
    marker = os.path.join(folder, "killed")
    with open(os.path.join(folder, "amp.yaml"), encoding="utf-8") as f:
        answer = yaml.safe_load(f)["evidence"]["best_amp"]["config"]
    runs = os.path.getsize(f"{marker}.runs") if os.path.exists(f"{marker}.runs") else 0
    return proc.returncode, out, err, answer, runs, os.path.exists(marker)


def test_a_rank_killed_at_random_points_fails_its_run_naming_the_rank_and_the_answer_holds(
    tmp_path,
):
    """Round after round, one rank of a run on 2 ranks is SIGKILLed at a random step of a
    random run that trains (a float32 reference, the first round's, run beside the
    undisturbed search; then a baseline, a sampled trial, a confirmation): the search
    finishes by itself with exit status 0, the run fails naming the rank, as missing
    evidence (never an error of the run), and is run again, nothing is left RUNNING or
    WAITING, and the answer is the one the same search gives undisturbed."""
    rng = random.Random(SEED)
    deadline = time.monotonic() + BUDGET_S
    undisturbed = _start_ranks_search(tmp_path / "undisturbed")
    # the first round kills a rank of the float32 reference (the first run that trains)
    kill = (rng.randrange(2), 1, rng.randrange(2, RANK_KILL_STEPS))
    running, started = _start_ranks_search(tmp_path / "round0", kill), time.monotonic()
    try:
        code, out, err, answer, runs, killed = _ranks_search_ended(
            undisturbed, tmp_path / "undisturbed"
        )
        assert code == 0 and not killed and runs > 3, err
        # the ranks every run trained on, in the summary and in the result file
        assert ", 2 ranks per run" in out, out[:2000]
        written = (tmp_path / "undisturbed" / "amp.yaml").read_text()
        assert yaml.safe_load(written)["evidence"]["nproc_per_node"] == 2
        done = 0
        while True:
            _check_rank_round(running, tmp_path / f"round{done}", kill, answer, done)
            _held(["rank-kill"], started)
            done += 1
            if done >= ROUNDS or time.monotonic() >= deadline:
                break
            kill = (rng.randrange(2), rng.randrange(1, runs + 1), rng.randrange(2, RANK_KILL_STEPS))
            running, started = (
                _start_ranks_search(tmp_path / f"round{done}", kill),
                time.monotonic(),
            )
    finally:
        for proc in (undisturbed, running):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _check_rank_round(proc, folder, kill, undisturbed, done):
    from scalertune._review._analyze import analyze
    from scalertune._storage._recovery import missing_of

    context = f"rank round {done}: rank, run, step {kill} (SCALERTUNE_FAULT_SEED={SEED})"
    code, out, err, answer, _, killed = _ranks_search_ended(proc, folder)
    assert code == 0 and "Traceback" not in err, f"{context}: exit {code}: {err[-3000:]}"
    assert killed, f"{context}: the rank was never killed"
    assert answer == undisturbed, context
    study = _study(str(folder / "study.log"), "ranks")
    assert analyze(study).settings.nproc_per_node == 2, context
    trials = study.get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    # missing evidence, retried: never an error of the run, nor evidence left missing
    assert "error" not in failed.user_attrs, context
    why = failed.user_attrs["missing"]
    assert why.startswith(f"rank {kill[0]} of 2: the trial's process was killed"), context
    assert not missing_of(trials), context
    assert "raised an error" not in out and "Missing evidence" not in out, f"{context}: {out}"
    again = [
        t
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and t.number > failed.number
        and all(
            t.user_attrs.get(k) == failed.user_attrs.get(k)
            for k in ("role", "seed", "config", "confirms", "baseline")
        )
    ]
    assert again, f"{context}: the run the rank died in was not run again"
    assert "Recommended:" in out, f"{context}: {out}"


# -- a team's load: many workers on one PostgreSQL, killed, its server restarted ------------

#: Workers on one study: 4 in CI (2 cores), 8 in the soak (``benchmarks/soak.py``); of them,
#: three in eight are SIGKILLed (at least one).
LOAD_WORKERS = int(os.environ.get("SCALERTUNE_LOAD_WORKERS", "4"))
LOAD_KILLS = max(1, LOAD_WORKERS * 3 // 8)


def _load_command(storage, output):
    return [
        sys.executable,
        "-m",
        "scalertune",
        "search",
        spec("healthy"),
        "--storage",
        storage,
        "--study-name",
        "shared",
        "-q",
        "-o",
        output,
        # as a team's workers are started (docs/guides/workers.md): one that opens the study
        # while the server restarts waits for it, where a typo'd port is said at once
        "--wait-for-storage",
        "60",
        *HORIZON_SEARCH,
    ]


def _load_moment(procs, rng):
    """A random moment once every worker handles signals: within the first seconds of the
    search, while the workers claim the references, the baselines and the branches."""
    deadline = time.monotonic() + STUCK_S
    while time.monotonic() < deadline and not all(_handles_signals(p) for p in procs):
        time.sleep(0.01)
    time.sleep(rng.uniform(0.2, 3.0))


@needs_postgres_server
@pytest.mark.xdist_group("evidence")  # beside the tests of the undisturbed search it compares with
def test_many_workers_on_one_postgresql_killed_and_its_server_restarted_lose_nothing(
    tmp_path, undisturbed
):
    """A team's load: ``LOAD_WORKERS`` workers start on one study, on a PostgreSQL server of
    this test's own, at once; at random moments ``LOAD_KILLS`` of them are SIGKILLed and the
    server is stopped at once (as a crash does: every connection and open transaction cut)
    and started again a few seconds later. The workers left finish, the same command run
    once more finishes the study, and then nothing is RUNNING or WAITING, no run's evidence
    is missing, no run was trained twice but a declared retry, and the answer is the one a
    single worker gives (``undisturbed``). Round after round, while the budget lasts (one
    round in CI)."""
    rng = random.Random(SEED)
    deadline = time.monotonic() + BUDGET_S
    done = 0
    with postgres_server() as server, postgres_database("scalertune_load", server.url) as fresh:
        while done == 0 or (done < ROUNDS and time.monotonic() < deadline):
            context = f"load round {done} (SCALERTUNE_FAULT_SEED={SEED})"
            storage, started = fresh(), time.monotonic()
            folder = tmp_path / f"round{done}"
            folder.mkdir()
            _load_round(storage, server, folder, rng, context)
            study = _study(storage, "shared")
            _check_load(study, context)
            assert horizon_answer(folder / "load.yaml") == undisturbed["answer"], context
            _STORAGES.pop(storage, None)
            _held([*["kill"] * LOAD_KILLS, PG_RESTART], started)
            done += 1


def _load_round(storage, server, folder, rng, context):
    """The workers started, hit and finished, and the same command once more."""
    procs = [_start(_load_command(storage, f"w{i}.yaml"), folder) for i in range(LOAD_WORKERS)]
    killed = set(rng.sample(range(LOAD_WORKERS), LOAD_KILLS))
    hits = [*(("kill", i) for i in killed), (PG_RESTART, None)]
    rng.shuffle(hits)
    deadline = time.monotonic() + STUCK_S
    try:
        for what, i in hits:
            _load_moment(procs, rng)
            if what == PG_RESTART:
                server.restart(rng.uniform(1.0, 5.0))
                _STORAGES.pop(storage, None)  # this process's connections were cut too
            else:
                _hit(procs[i], "kill", rng)
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for i, (code, proc) in enumerate(zip(codes, procs)):
        err = proc.stderr.read()
        assert "Traceback" not in err, f"{context}, worker {i}: {err}"
        expected = (0, -signal.SIGKILL) if i in killed else (0,)
        assert code in expected, f"{context}, worker {i}: {err}"
    resume = _start(_load_command(storage, "load.yaml"), folder)
    assert resume.wait(timeout=STUCK_S) == 0, f"{context}: {resume.stderr.read()}"


def _check_load(study, context):
    from scalertune._storage._recovery import missing_of

    trials = study.get_trials(deepcopy=False)
    left = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert not left and not missing_of(trials), context
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    runs = collections.Counter(
        json.dumps(
            {k: t.user_attrs.get(k) for k in ("role", "seed", "config", "baseline", "confirms")}
            | {"phase": t.user_attrs.get("phase_start")},
            sort_keys=True,
        )
        for t in done
        if "duplicate_of" not in t.user_attrs
    )
    assert all(n == 1 for n in runs.values()), [r for r, n in runs.items() if n > 1]
    retries = collections.Counter(
        t.system_attrs["failed_trial"] for t in done if "failed_trial" in t.system_attrs
    )
    assert all(n == 1 for n in retries.values()), f"{context}: {retries}"
    reference_is_float32s_own(study, 200, context)
