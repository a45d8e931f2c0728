"""The search under the user's own launcher, in its parts: the world read from torchrun's and
srun's environments, the run's message read back from scalertune's records only, the
settings that refuse a rerun in another world, and the one-line refusals and time bounds
of a rank left alone."""

import dataclasses
import io
import os
import pickle
import socket
import time

import pytest
from conftest import run_cli, spec

from scalertune._amp._config import AmpConfig
from scalertune._judge._settings import StudySettings
from scalertune._judge._stopping import StopRule
from scalertune._judge._target import Target
from scalertune._processes._hosts import Crew, _blamed, _SafeUnpickler
from scalertune._processes._protocol import RankFailed
from scalertune._processes._world import World, first_host, launched
from scalertune._search._process_jobs import RunJob

HEALTHY = spec("healthy")


def test_torchruns_environment_is_read_as_its_ranks_nodes_and_rendezvous():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    assert launched(env) == World("torchrun", 3, 4, 1, 2, 1, "node0", 29500, agent_store=True)
    assert launched({}) is None
    assert launched({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no crew


def test_an_srun_step_is_read_with_its_first_host_as_the_rendezvous():
    env = {
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    world = launched(env)
    assert world == World("srun", 2, 4, 0, 2, 1, "gpu07", 15456)
    # a batch script's own step (no srun) is no crew, whatever the allocation holds
    assert launched({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) is None
    assert first_host("cpu1,gpu[03-05,09]") == "cpu1"
    assert first_host("gpu[03-05,09],cpu1") == "gpu03"


def test_each_rank_runs_its_part_of_a_run_in_a_group_of_the_runs_own():
    world = World("torchrun", 1, 2, 0, 1, 1, "10.0.0.1", 29500, agent_store=True)
    env = world.run_env(40123)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("1", "2", "40123")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # the run's rank 0 holds its store


def test_a_runs_message_holds_scalertunes_records_and_nothing_else():
    """A run crosses to the other hosts pickled; it is read back with scalertune's classes
    and plain values only: a function, or another module's class, is refused."""
    job = RunJob(
        spec="model.py:make_model",
        config=AmpConfig(dtype="float16", fp32_modules=("head",)),
        steps=200,
        seed=0,
        device="cpu",
        stop=StopRule(Target.from_reference([10.0 - i * 0.04 for i in range(200)])),
    )
    data = pickle.dumps((job, 1234, 60.0))
    back, port, timeout_s = _SafeUnpickler(io.BytesIO(data)).load()
    assert (back.config, back.steps, port, timeout_s) == (job.config, 200, 1234, 60.0)
    assert back.stop.target.loss == job.stop.target.loss

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch /tmp/scalertune-pwned",))

    for evil in (Payload(), dataclasses.replace):
        with pytest.raises(pickle.UnpicklingError, match="may not hold"):
            _SafeUnpickler(io.BytesIO(pickle.dumps(evil))).load()


def test_a_rerun_in_another_world_is_refused_by_the_settings():
    one = StudySettings(
        factory="m.py:f",
        steps=200,
        horizon=200,
        seed=0,
        space={"name": "default", "params": {}},
        device_type="cpu",
        device="c",
    )
    two_hosts = dataclasses.replace(one, nnodes=2, hosts=("a", "b"))
    assert one.differs_from(two_hosts) == "nnodes"
    assert two_hosts.differs_from(dataclasses.replace(two_hosts, hosts=("c", "d"))) is None
    assert StudySettings.from_dict(two_hosts.to_dict()) == two_hosts
    assert "nnodes" not in one.to_dict()  # a one-host study's record as before


def _launcher_env(monkeypatch, rank, port, **more):
    for name, value in {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        **more,
    }.items():
        monkeypatch.setenv(name, value)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_incomplete_launcher_environment_is_one_line(tmp_path, monkeypatch):
    _launcher_env(monkeypatch, 1, 29500)
    monkeypatch.delenv("MASTER_ADDR")
    proc = run_cli("search", HEALTHY, "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "scalertune search: error: this search runs under a launcher whose environment is "
        "incomplete (MASTER_ADDR is not set): start it with torchrun or srun, which set it"
    )


def test_nproc_per_node_under_the_launcher_is_refused_in_one_line(tmp_path, monkeypatch):
    _launcher_env(monkeypatch, 0, _free_port())
    proc = run_cli("search", HEALTHY, "--nproc-per-node", "2", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "scalertune search: error: --nproc-per-node is torchrun's under torchrun: drop it "
        "(each host runs the 1 ranks its launcher started)"
    )


def test_rank_0_alone_names_the_rank_that_did_not_come_and_writes_nothing(tmp_path, monkeypatch):
    _launcher_env(monkeypatch, 0, _free_port())
    started = time.monotonic()
    proc = run_cli("search", HEALTHY, "--rendezvous-timeout", "2", cwd=tmp_path)
    assert time.monotonic() - started < 30
    assert proc.returncode == 3
    assert proc.stderr.strip() == (
        "scalertune search: rank 1 of 2 (node 1) did not come within 2 s (--rendezvous-timeout): "
        "start the same command on every host (a host whose command was refused before it came "
        "says why in its own output)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_rank_whose_rank_0_never_comes_ends_in_one_line(tmp_path, monkeypatch):
    _launcher_env(monkeypatch, 1, _free_port())
    started = time.monotonic()
    proc = run_cli("search", HEALTHY, "--rendezvous-timeout", "2", cwd=tmp_path)
    assert time.monotonic() - started < 30
    assert proc.returncode == 3
    assert proc.stderr.startswith(
        "scalertune search: rank 1 could not reach the rendezvous at 127.0.0.1:"
    )
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def _crew(argvs=((), ())):
    world = World("torchrun", 0, len(argvs), 0, 1, 0, "127.0.0.1", 29500)
    roster = [{"node": r, "host": f"h{r}", "argv": list(a)} for r, a in enumerate(argvs)]
    return Crew(world, None, roster, 60.0)


def test_a_ranks_own_error_is_blamed_over_the_collective_it_broke_on_rank_0():
    """Rank 1's factory raises; rank 0's part fails in the collective it waited in, its error
    wrapped by the factory's (so not marked a peer's): rank 1 and its own words are named."""
    crew = _crew()
    gloo = "FactoryError: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]"
    blamed = _blamed(
        crew.where,
        {
            0: {"kind": "failed", "failure": "error", "text": gloo + " Connection closed by peer"},
            1: {"kind": "failed", "failure": "error", "text": "RuntimeError: broken on rank 1"},
        },
    )
    assert str(blamed) == "rank 1 of 2 (node 1, h1): RuntimeError: broken on rank 1"


def test_a_run_that_ran_past_its_time_limit_on_every_host_blames_no_rank():
    """Each host kills its ranks at the same --trial-timeout: rank 0's own report comes first,
    but it is no more to blame than the others. A rank that ran past the limit while the
    others finished is still named."""
    crew = _crew()
    late = "timed out: the trial ran past its 30 s limit (--trial-timeout) and was killed"
    broken = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    for other in (
        {"kind": "crashed", "text": late},
        {"kind": "aborted", "text": "ended at rank 0's word"},
        {"kind": "failed", "failure": "peer", "text": broken},
    ):
        blamed = _blamed(crew.where, {0: {"kind": "crashed", "text": late}, 1: other})
        assert isinstance(blamed, RankFailed) and str(blamed) == late, other
    blamed = _blamed(crew.where, {0: {"kind": "ok"}, 1: {"kind": "crashed", "text": late}})
    assert str(blamed) == f"rank 1 of 2 (node 1, h1): {late}"


def test_a_rank_whose_process_is_gone_is_lost_at_once_not_after_the_host_timeout():
    """A node killed as a run starts, before its part joined the run's group: rank 0's part
    waited on the group (300 s) and the rank's pulse for --host-timeout (300 s), and the
    search ended 333 s after the kill. Its lifeline closes with its process: rank 0 knows
    at once, runs nothing more, and names it; a stranger's connection is not a rank."""
    from scalertune._processes._hosts import HostLost, _hold_lifeline, _Lifelines

    lifelines = _Lifelines(3)
    crew = _crew(((), (), ()))
    crew._lifelines = lifelines
    world = World("torchrun", 1, 3, 1, 1, 1, "127.0.0.1", 29500)
    one = _hold_lifeline(world, lifelines.port, 5)
    two = _hold_lifeline(dataclasses.replace(world, rank=2, node=2), lifelines.port, 5)
    with socket.create_connection(("127.0.0.1", lifelines.port)) as stranger:
        stranger.sendall(b"0\n")  # not a rank past 0: its closing says nothing
    time.sleep(0.5)
    assert lifelines.gone() == set()
    two.close()  # rank 2's process ends
    deadline = time.monotonic() + 5
    while not lifelines.gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lifelines.gone() == {2}
    with pytest.raises(HostLost) as lost:
        crew.launch(None, None, lambda reply: None)  # nothing posted: the store is unused
    assert str(lost.value) == (
        "rank 2 of 3 (node 2, h2) is gone: its connection to rank 0 closed (its process was "
        "killed, or its host went down). The search ends on every host: run the same command "
        "on every host again to resume it"
    )
    one.close()


def test_a_rank_running_another_command_is_found():
    assert _crew(((["search", "m.py:f"]), (["search", "m.py:f"]))).other_command() is None
    assert _crew((["search", "m.py:f"], ["search", "m.py:f", "--steps", "9"])).other_command() == 1


_FROZEN_RANK0 = """
import datetime, json, os, socket, sys, time, torch
server = torch.distributed.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=60))
store = torch.distributed.PrefixStore("scalertune/", server)
lifelines = socket.create_server(("127.0.0.1", 0))  # rank 1 connects, and stays connected
store.set("lifeline", str(lifelines.getsockname()[1]))
roster = [{"rank": r, "node": r, "host": "h%d" % r, "argv": None} for r in range(2)]
store.set("roster", json.dumps(roster))
print("up", flush=True)
store.wait(["rank/1"])  # rank 1 joined: it reads the roster, then waits for a run
time.sleep(2)
os.kill(os.getpid(), 19)  # SIGSTOP: a frozen host; its connections stay open
"""


def test_a_rank_whose_rank_0_freezes_ends_within_the_host_timeout(tmp_path, monkeypatch):
    """Rank 0's host stops without closing its connections (SIGSTOP): a call to its store
    waits in recv whatever the store's timeout, and the rank ends, in one line with status
    3, once --host-timeout has passed."""
    import subprocess
    import sys

    port = _free_port()
    frozen = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_RANK0, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert frozen.stdout.readline().strip() == "up"
        _launcher_env(monkeypatch, 1, port)
        started = time.monotonic()
        proc = run_cli(
            *("search", HEALTHY, "--host-timeout", "4", "--rendezvous-timeout", "10"),
            cwd=tmp_path,
            process=True,
            timeout=60,
        )
        waited = time.monotonic() - started
    finally:
        frozen.kill()
        frozen.wait()
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines()[-1] == (
        "scalertune search: rank 0 of 2 (node 0, h0) stopped answering (its store did not "
        "answer for 4 s, --host-timeout): the search ends on this host; run the same command "
        "on every host again to resume it"
    )
    assert waited < 40


def test_a_rank_with_another_command_is_told_where_it_differs_and_no_password_shown():
    """ "runs another command than rank 0 (its arguments differ)" left a new user to find which
    of a dozen flags; the first difference is named, a storage URL's password hidden."""
    url = "postgresql://me:hunter22@db/optuna"
    same = ["search", "m.py:f", "--storage", url]
    crew = _crew((same + ["--n-trials", "4"], same + ["--n-trials", "6"]))
    assert crew.other_command() == 1
    assert crew.argv_difference(1) == "after --n-trials, rank 0 has '4' where it has '6'"
    crew = _crew((same, ["search", "m.py:f", "--storage", url.replace("hunter22", "other")]))
    said = crew.argv_difference(1)
    assert said.startswith("after --storage, rank 0 has 'postgresql://me:***@db/optuna'")
    assert "hunter22" not in said and "other" not in said
    crew = _crew((same, same + ["-q"]))
    assert crew.argv_difference(1) == "it also has '-q'"
