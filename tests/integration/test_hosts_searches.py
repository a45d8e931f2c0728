"""A search whose ranks span hosts, under the user's own launcher: two torchrun "nodes" on
loopback (static rendezvous, one process each, gloo), each running the same
``-m scalertune search`` command on one SQLite study. Its predictions are checked against a
plain GradScaler loop under the same two-node torchrun, and a node killed mid-search is
survived by the other and by the rerun."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import optuna
import pytest
import torch
import yaml
from conftest import run_cli
from plain_loop import random_configs

import scalertune
from scalertune import AmpConfig
from scalertune._judge._rank import skip_tolerance
from tests import hosts_workloads

HORIZON = 400
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-nodes")]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(args, *, cwd, env=None):
    """The same command under torchrun on two nodes: node 0 and node 1, each its own
    process group (a host: killing one kills nothing of the other)."""
    port = _port()
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                *args,
            ],
            cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for node in (0, 1)
    ]


def _search(tmp_path, factory="make_model", extra=(), env=None, horizon=HORIZON):
    return _nodes(
        [
            "-m",
            "scalertune",
            "search",
            f"{hosts_workloads.HERE}:{factory}",
            "--space",
            "float16",
            "--horizon",
            str(horizon),
            "--storage",
            f"sqlite:///{tmp_path / 'study.db'}",
            "--study-name",
            "hosts",
            "-o",
            str(tmp_path / "hosts.yaml"),
            *extra,
        ],
        cwd=tmp_path,
        env=env,
    )


def _finish(procs, timeout):
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            raise
        out.append((p.returncode, stdout, stderr))
    return out


def _own_lines(stderr):
    """What scalertune itself said: not torch's warnings, nor torchrun's report."""
    return [
        line
        for line in stderr.splitlines()
        if line.startswith(("scalertune search", "#", "float32 reference"))
    ]


def _plain_two_node_skips(configs, tmp_path):
    """Each config's skipped steps over the horizon in a plain GradScaler loop of the same
    factory under the same two-node torchrun (a step skipped: the scale fell after it)."""
    out = tmp_path / "plain.json"
    knobs = [
        {
            "dtype": "float16",
            "init_scale": c.init_scale,
            "growth_factor": c.growth_factor,
            "backoff_factor": c.backoff_factor,
            "growth_interval": c.growth_interval,
        }
        for c in configs
    ]
    ran = _finish(
        _nodes([hosts_workloads.HERE, json.dumps(knobs), str(HORIZON), str(out)], cwd=tmp_path),
        timeout=300,
    )
    assert [code for code, _, _ in ran] == [0, 0], ran[0][2][-3000:] + ran[1][2][-3000:]
    return [
        sum(1 for before, after in zip([c.init_scale, *s], s) if after < before)
        for c, s in zip(configs, json.loads(out.read_text()))
    ]


def test_two_nodes_search_together_and_predict_the_plain_two_node_loop(tmp_path):
    """Both nodes exit 0, one YAML is written (by rank 0), the evidence records the world,
    and the study's predictions of 6 float16 configs agree with the plain two-node loop
    within max(2, 20%) on at least 5."""
    (code0, out0, err0), (code1, out1, err1) = _finish(_search(tmp_path), timeout=600)
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    assert "2 ranks per run (2 hosts x 1" in out0
    assert out1 == ""  # rank 1 trained its part of every run, and said nothing of it
    # but where the answer is, on its own host's terminal (a silent host read as idle)
    assert _own_lines(err1)[-1] == (
        "scalertune search: done; rank 0 of 2 (node 0, "
        f"{socket.gethostname()}) printed the summary and wrote the study's answer"
    )
    written = sorted(p.name for p in tmp_path.glob("hosts*.yaml"))
    assert written == ["hosts.yaml"]
    evidence = yaml.safe_load((tmp_path / "hosts.yaml").read_text())["evidence"]
    assert (evidence["nnodes"], len(evidence["hosts"])) == (2, 2)
    # training on another world than the search's is said once, at the first model prepared
    amp = scalertune.load(str(tmp_path / "hosts.yaml"), best_amp=True, check=False)
    model = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.GELU(), torch.nn.Linear(40, 1))
    with pytest.warns(UserWarning) as said:
        amp.prepare(model)
    lines = [str(w.message) for w in said if "was searched on" in str(w.message)]
    assert (
        len(lines) == 1
        and "searched on 2 ranks (2 hosts x 1), and this training runs on 1" in lines[0]
    )

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.load_study(study_name="hosts", storage=storage)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    # the same study on one host, its 2 ranks there: another world, refused in one line
    again = run_cli(
        *("search", f"{hosts_workloads.HERE}:make_model", "--space", "float16"),
        *("--horizon", HORIZON, "--storage", storage, "--study-name", "hosts"),
        *("--nproc-per-node", "2", "-o", tmp_path / "again.yaml"),
        cwd=tmp_path,
        process=True,
    )
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        "scalertune search: error: study 'hosts' was searched on 2 ranks per run (2 hosts x "
        "1), and this search runs on 2 ranks per run (1 host x 2): its evidence is that "
        "world's runs; run it on as many hosts and ranks per host, or pass a new --study-name"
    )
    assert not (tmp_path / "again.yaml").exists()
    result = scalertune.analyze(study, storage=storage)
    configs = [AmpConfig(), *random_configs(5, seed=2024)]
    real = _plain_two_node_skips(configs, tmp_path)
    rows = [(c.describe(), result.predict(c).skipped_steps, r) for c, r in zip(configs, real)]
    print("\n".join(f"{d}: predicted {p} skips, plain two-node loop {r}" for d, p, r in rows))
    held = [row for row in rows if abs(row[1] - row[2]) <= skip_tolerance(row[2])]
    assert len(held) >= 5, rows
    assert len({row[2] for row in rows}) > 2, rows  # the configs skip differently: it can fail


def test_an_fsdp2_model_sharded_over_two_nodes_is_searched(tmp_path):
    """FSDP2 shards the model over the two hosts: every run's group is up before the factory
    shards it, the branches load the reference's checkpoints on both (rank 0's bytes), and
    the search ends with one answer."""
    extra = ("--n-trials", "2", "--steps", "40")
    (code0, out0, err0), (code1, _, err1) = _finish(
        _search(tmp_path, "make_model_fsdp2", extra, horizon=80), timeout=600
    )
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    assert "2 ranks per run (2 hosts x 1" in out0 and "holds" in out0
    assert (tmp_path / "hosts.yaml").exists()
    failed = [line for line in _own_lines(err0) if "failed" in line or "missing" in line]
    assert failed == []


def _kill_node(pid):
    """SIGKILL to torchrun ``pid`` and every process under it, at once: its elastic agent
    starts each rank in a session of its own, so its process group is torchrun's alone."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
    node, grew = {pid}, True
    while grew:
        under = {p for p, parent in parents.items() if parent in node} - node
        node, grew = node | under, bool(under)
    for p in node:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def test_a_node_killed_mid_search_ends_the_other_and_the_rerun_completes(tmp_path):
    """Node 1 dies whole (SIGKILL to torchrun and its processes) as a run starts, before its
    part can join the run's group (a new user's node 0 then waited 333 s): node 0 ends by
    itself within a minute under the default --host-timeout (300 s), status 3, naming rank
    1 and its host, the trial recorded as a failed run and queued again (never a verdict);
    the same command on both nodes resumes the study to the end, with nothing left RUNNING
    and no run trained twice."""
    extra = ("--n-trials", "4", "--steps", "60")
    node0, node1 = _search(tmp_path, "make_model", extra, horizon=120)
    said0: list[str] = []
    reader = threading.Thread(target=lambda: said0.extend(node0.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 400
    try:  # the first sampled trial's line: rank 0 starts the next run at once
        while not any(line.startswith("#") for line in said0):
            assert time.monotonic() < deadline and node0.poll() is None, "".join(said0)[-3000:]
            time.sleep(0.02)
        _kill_node(node1.pid)
        killed = time.monotonic()
        code0 = node0.wait(timeout=120)
        ended = time.monotonic() - killed
    finally:
        for p in (node0, node1):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    reader.join(timeout=10)
    node0.stdout.close()
    node1.communicate()
    err0 = "".join(said0)
    assert ended < 60, err0[-3000:]
    # torchrun exits 1 for a rank that failed, and names the rank's own status: 3
    assert code0 == 1 and "exitcode  : 3 " in err0, err0[-3000:]
    said = _own_lines(err0)
    assert said[-1].startswith("scalertune search: rank 1 of 2 (node 1, "), said
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.load_study(study_name="hosts", storage=storage)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and all("verdict" not in t.user_attrs for t in failed)
    assert all("rank 1 of 2" in t.user_attrs.get("missing", "") for t in failed)

    (code0, out0, err0), (code1, _, err1) = _finish(
        _search(tmp_path, "make_model", extra, horizon=120), timeout=600
    )
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    assert (tmp_path / "hosts.yaml").exists()
    study = optuna.load_study(study_name="hosts", storage=storage)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    done = [
        (t.user_attrs.get("role"), json.dumps(t.user_attrs.get("config"), sort_keys=True))
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("role") == "search"
    ]
    assert len(done) == len(set(done))  # no run trained twice
