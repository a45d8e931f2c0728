"""The real optuna-dashboard server shows what a scalertune search stored."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import spec

pytestmark = pytest.mark.slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return json.loads(response.read())


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "scalertune", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600, stdin=subprocess.DEVNULL)


def test_dashboard_serves_curves_attributes_notes_and_pictures(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    search = _cli("search", spec("forward_overflow"), "--storage", storage, "--n-trials", "3",
                  "--steps", "40", "--device", "cpu", "--study-name", "fwd", cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    pictures = sorted(p for p in os.listdir(tmp_path) if p.endswith(".png"))
    assert len(pictures) == 2 and any("pytorch-default" in p for p in pictures)

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "scalertune", "dashboard", "--storage", storage,
         "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.time() + 60
        while True:
            try:
                studies = _get(port, "/api/studies")["study_summaries"]
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                assert time.time() < deadline, "the dashboard did not start"
                time.sleep(0.3)
        (study,) = [s for s in studies if s["study_name"] == "fwd"]
        detail = _get(port, f"/api/studies/{study['study_id']}")
        assert detail["objective_names"] == ["time to target (s)"]
        trials = detail["trials"]
        runs = [t for t in trials if t["state"] in ("Complete", "Pruned")
                and not any(a["key"] == "role" and a["value"] == "recommended"
                            for a in t["user_attrs"])]
        # one point per 10-step read-back window, pruned runs included (while finite)
        assert runs and all(len(t["intermediate_values"]) <= 4 for t in runs)
        assert any(t["intermediate_values"] for t in runs if t["state"] == "Complete")
        attrs = {a["key"] for t in trials for a in t["user_attrs"]}
        assert {"skipped_steps", "min_scale", "time_to_target_s", "loss_vs_float32",
                "role", "config"} <= attrs
        pruned = [t for t in trials if t["state"] == "Pruned"]
        assert pruned
        for t in pruned:
            assert "forward overflow" in t["note"]["body"]
            assert "Pruned: forward" in t["note"]["body"]
        note = detail["note"]["body"]
        assert "float32 reference" in note and "pytorch-default" in note
        assert "Verdict" in note and "```yaml" in note and "config:" in note
        names = sorted(a["filename"] for a in detail["artifacts"])
        assert names == pictures
        assert all(a["mimetype"] == "image/png" for a in detail["artifacts"])
        artifact = detail["artifacts"][0]
        url = f"http://127.0.0.1:{port}/artifacts/{study['study_id']}/{artifact['artifact_id']}"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.read(8) == b"\x89PNG\r\n\x1a\n"
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert server.returncode is not None


def test_report_after_two_processes_matches_the_last_search(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    first = _cli("search", spec("healthy"), "--storage", storage, "--n-trials", "2",
                 "--steps", "40", "--device", "cpu", "-o", "first.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = _cli("search", spec("healthy"), "--storage", storage, "--n-trials", "4",
                  "--steps", "40", "--device", "cpu", "-o", "second.yaml", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    report = _cli("report", "--storage", storage, "--study-name", "workloads:healthy",
                  "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    recommended = next(line for line in second.stdout.splitlines()
                       if line.startswith("Recommended:"))
    assert f"trial #{data['evidence']['trial']} " in recommended
    import yaml
    assert data["config"] == yaml.safe_load((tmp_path / "second.yaml").read_text())["config"]


def test_dashboard_without_the_study_database_is_a_usage_error(tmp_path):
    proc = _cli("dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}", cwd=tmp_path)
    assert proc.returncode == 2 and "no such database" in proc.stderr
