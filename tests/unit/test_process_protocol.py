"""What crosses to a run's processes and back, and the rank a failed run is blamed on: the
typed records and the rules, without starting a process (the processes themselves are
tests/integration/test_distributed.py's, test_workers.py's and test_faults.py's)."""

import pickle
import signal

import pytest
from conftest import spec

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedCheckpoint, MissingEvidence, UsageError
from scalertune._processes._blame import Fault, blame
from scalertune._processes._child import failure
from scalertune._processes._main_guard import REENTERED_STATUS
from scalertune._processes._protocol import Failed, JobFailed, TrialCrashed
from scalertune._search._process_jobs import LocateJob, PreflightJob, RunJob, TimeJob
from scalertune._storage._outage import Outage

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def test_every_job_crosses_a_pipe_as_it_was_sent():
    config = AmpConfig(dtype="float16", init_scale=4096.0, fp32_modules=("head",))
    jobs = [
        RunJob(spec=spec("healthy"), config=config, steps=20, seed=3, device="cpu"),
        LocateJob(spec=spec("healthy"), config=config, losses=(1.5, 2.5), seed=3, device="cpu"),
        TimeJob(
            spec=spec("healthy"),
            dtypes=("float32", "float16"),
            clip_norm=1.0,
            seed=3,
            device="cpu",
            memory_gb=2.0,
        ),
        PreflightJob(spec=spec("healthy"), islands=frozenset({"head"}), seed=3, device="cpu"),
    ]
    for job in jobs:
        assert pickle.loads(pickle.dumps(job)) == job
    with pytest.raises(AttributeError):
        jobs[0].steps = 10  # a job is what was sent: frozen


@pytest.mark.parametrize(
    "raised, kind, expected, line",
    [
        (UsageError("no list"), "usage", UsageError, "no list"),
        (DamagedCheckpoint("foreign"), "damaged", DamagedCheckpoint, "foreign"),
        (MissingEvidence("gone"), "missing", MissingEvidence, "gone"),
        (Outage("down"), "outage", Outage, "down"),
        (ValueError("a bug"), "error", JobFailed, "ValueError: a bug"),
        (SystemExit(3), "error", JobFailed, "the workload called sys.exit(3) during the run"),
        (RuntimeError(GLOO), "peer", JobFailed, f"RuntimeError: {GLOO}"),
    ],
)
def test_a_jobs_failure_comes_back_as_the_error_it_raised(raised, kind, expected, line):
    """The child names each failure by kind; the parent raises the same error again (the
    user's own code's as :class:`JobFailed`, a :class:`TrialCrashed`)."""
    try:
        raise raised
    except BaseException as exc:  # as the child catches it
        sent = failure(exc)
    assert sent.kind == kind
    back = pickle.loads(pickle.dumps(sent)).exception()
    assert type(back) is expected
    assert str(back).splitlines()[0] == line
    assert isinstance(back, TrialCrashed) == (kind in ("error", "peer"))


def test_a_rank_that_died_is_blamed_before_the_peers_whose_collectives_broke():
    failures = {0: Failed("peer", f"RuntimeError: {GLOO}"), 1: None}
    blamed = blame(failures, [1, -signal.SIGKILL], silent=[])
    assert isinstance(blamed, Fault) and blamed.kind == "died"
    assert blamed.text.startswith("rank 1 of 2: the trial's process was killed (SIGKILL)")


def test_a_ranks_own_error_is_blamed_before_a_peers_broken_collective():
    failures = {0: Failed("peer", f"RuntimeError: {GLOO}"), 1: Failed("error", "ValueError: x")}
    assert blame(failures, [1, 1], silent=[]) == Failed("error", "rank 1 of 2: ValueError: x")


def test_a_silent_rank_is_blamed_as_hung_when_its_peer_gave_up_waiting():
    blamed = blame({0: Failed("peer", f"RuntimeError: {GLOO}")}, [1, None], silent=[1])
    assert blamed == Fault(
        "hung",
        f"rank 1 of 2 hung: rank 0's collective gave up waiting for it (RuntimeError: {GLOO})",
    )


def test_one_process_is_named_without_a_rank_and_a_reentered_script_is_a_usage_error():
    assert blame({0: None}, [-signal.SIGABRT], silent=[]) == Fault(
        "died", "the trial's process died with SIGABRT (a crash in native code)"
    )
    with pytest.raises(UsageError, match='outside an if __name__ == "__main__": block'):
        blame({0: None}, [REENTERED_STATUS], silent=[])
