"""optuna-dashboard tells the same story as the recommendation, in a real browser.

Three real searches write one SQLite storage (the shipped codepoints example, whose float16
baselines never reach the float32 target; a tiny workload whose float16 trials overflow
forward and are pruned; and a search over a horizon of 1000 steps on a workload where bfloat16
falls behind late, whose finalists are branched at two phase windows). ``scalertune
dashboard`` serves them, and headless Chromium (Debian's ``chromium`` package) renders its
pages; the test reads what the browser rendered, what the dashboard's HTTP API returns and
what ``scalertune report`` prints. The searches are kept small (about a minute of CPU in all,
on two cores), the pages few (each render starts a browser).

The browser test needs ``chromium`` on PATH: it is skipped without it, except in CI
(``CI=true``), where ``.ci/run`` installs it and its absence is a failure. The API tests run
everywhere.
"""

import hashlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import optuna
import pytest
import yaml
from conftest import ROOT, run_cli, spec

from scalertune._storage._optuna import study_id

# one xdist worker for the whole file: its module fixture runs three searches and a server
pytestmark = pytest.mark.xdist_group("dashboard")

CODEPOINTS = "codepoints:make_model"
LATE = "late"
_NOTE_KEY = re.compile(r"^dashboard:([^:]+:)?note_(ver|str:\d+)$")
_CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
_AMP_ROLES = ("baseline", "search", "confirm", "recommended")
_HORIZON_ROLES = ("phase", "island", "replay")
_PHASE_ATTRS = {"of", "start", "end", "phase_ratio", "phase_z", "phase_nonfinite", "phase_holds"}


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; CI must install it (.ci/run does)")
    pytest.skip("chromium is not installed (apt-get install chromium); CI runs this test")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stored(url):
    """Everything the storage holds except optuna-dashboard's notes."""
    storage = optuna.storages.RDBStorage(url)
    state = {}
    for study in storage.get_all_studies():
        sid = study_id(study)
        # a pruned run's curve ends in NaN, which equals nothing, itself included
        trials = [
            (
                t.number,
                t.state,
                t.values,
                t.params,
                t.user_attrs,
                t.system_attrs,
                {k: "nan" if math.isnan(v) else v for k, v in t.intermediate_values.items()},
                t.datetime_start,
                t.datetime_complete,
            )
            for t in storage.get_all_trials(sid)
        ]
        system = {
            k: v for k, v in storage.get_study_system_attrs(sid).items() if not _NOTE_KEY.match(k)
        }
        state[study.study_name] = (storage.get_study_user_attrs(sid), system, trials)
    storage.remove_session()
    return state


class Dashboard:
    """A study of a real search, served by ``scalertune dashboard``, seen by Chromium."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.url = f"sqlite:///{tmp / 'study.db'}"
        self.port = _free_port()

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return r.read()

    def api(self, path):
        return json.loads(self.get(path))

    def render(self, page, expect):
        """The DOM Chromium rendered for ``page``, once it shows ``expect``."""
        for _ in range(3):
            with tempfile.TemporaryDirectory(dir=self.tmp) as profile:
                dom = subprocess.run(
                    [
                        _chromium(),
                        *_CHROMIUM_FLAGS,
                        f"--user-data-dir={profile}",
                        "--window-size=1400,2400",
                        "--virtual-time-budget=20000",
                        "--dump-dom",
                        f"http://127.0.0.1:{self.port}{page}",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=180,
                ).stdout
            if expect in dom:
                return dom
        raise AssertionError(f"{page} never showed {expect!r}; last DOM:\n{dom[-3000:]}")


def _searches(d, tmp):
    d.search = run_cli(
        "search",
        os.path.join(ROOT, "examples", "codepoints.py:make_model"),
        "--storage",
        d.url,
        "--n-trials",
        "4",
        "--steps",
        "60",
        "--device",
        "cpu",
        "-q",
        "-o",
        "codepoints.yaml",
        cwd=tmp,
    )
    run_cli(
        "search",
        spec("forward_overflow"),
        "--storage",
        d.url,
        "--study-name",
        "fwd",
        "--n-trials",
        "2",
        "--steps",
        "30",
        "--device",
        "cpu",
        "-q",
        "-o",
        "fwd.yaml",
        cwd=tmp,
    )
    late = run_cli(
        "search",
        spec("readings_near_1000", "late_workloads.py"),
        "--storage",
        d.url,
        "--study-name",
        LATE,
        "--n-trials",
        "4",
        "--steps",
        "100",
        "--horizon",
        "1000",
        "--device",
        "cpu",
        "-q",
        "-o",
        "late.yaml",
        cwd=tmp,
    )
    assert late.returncode == 0, late.stderr
    d.yaml = yaml.safe_load((tmp / "codepoints.yaml").read_text())
    d.late_yaml = yaml.safe_load((tmp / "late.yaml").read_text())


@pytest.fixture(scope="session")  # once per worker: its group may interleave with other modules
def dashboard(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    d = Dashboard(tmp)
    _searches(d, tmp)
    storage = optuna.storages.RDBStorage(d.url)
    codepoints = optuna.load_study(study_name=CODEPOINTS, storage=storage)
    d.artifacts_after_search = optuna.artifacts.get_all_artifact_meta(codepoints)
    d.report_json = json.loads(
        run_cli("report", "--storage", d.url, "--study-name", CODEPOINTS, "--json", cwd=tmp).stdout
    )
    run_cli("report", "--storage", d.url, "--study-name", CODEPOINTS, "-o", "again.yaml", cwd=tmp)
    d.artifacts_after_report = optuna.artifacts.get_all_artifact_meta(codepoints)
    # An outdated note: the dashboard's refresh must replace it, and change nothing else.
    from optuna_dashboard import save_note

    save_note(codepoints, "an outdated note")
    storage.remove_session()

    d.before = _stored(d.url)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalertune",
            "dashboard",
            "--storage",
            d.url,
            "--port",
            str(d.port),
        ],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                d.studies = {
                    s["study_name"]: s["study_id"] for s in d.api("/api/studies")["study_summaries"]
                }
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.3)
        d.after = _stored(d.url)
        d.details = {name: d.api(f"/api/studies/{sid}") for name, sid in d.studies.items()}
        d.detail, d.late = d.details[CODEPOINTS], d.details[LATE]
        yield d
    finally:
        server.terminate()
        server.wait(timeout=30)


def _trials(detail):
    return {t["number"]: t for t in detail["trials"]}


def _attrs(trial):
    return {a["key"]: a["value"] for a in trial["user_attrs"]}


def _recommended(detail):
    """The study's latest ``recommended`` trial: its answer."""
    return max(
        (t for t in detail["trials"] if _attrs(t).get("role") == "recommended"),
        key=lambda t: t["number"],
    )


def _answer_time(document):
    """The answer's time to target as the YAML holds it: the recommended AMP run's, float32
    at the best AMP config's clip, or the float32 reference's."""
    evidence = document["evidence"]
    if "trial" in evidence:
        return evidence["time_to_target_s"]
    same_clip = evidence.get("float32_same_clip")
    if same_clip is not None and same_clip["config"] == document["config"]:
        return same_clip["time_to_target_s"]
    return evidence["float32"]["time_to_target_s"]


def _finite(value):
    return value not in ("inf", "-inf", "nan") and math.isfinite(float(value))


def test_serves_every_study_in_the_storage(dashboard):
    assert set(dashboard.studies) == {CODEPOINTS, "fwd", LATE}
    assert dashboard.detail["objective_names"] == ["time to target (s)"]


def test_report_json_equals_the_yaml_and_report_uploads_nothing_twice(dashboard):
    assert dashboard.report_json == dashboard.yaml
    again = yaml.safe_load((dashboard.tmp / "again.yaml").read_text())
    assert again == dashboard.yaml
    ids = sorted(a.artifact_id for a in dashboard.artifacts_after_search)
    assert len(ids) == 2
    assert sorted(a.artifact_id for a in dashboard.artifacts_after_report) == ids
    # the pictures report wrote beside again.yaml are the same bytes as the search's
    for path in dashboard.tmp.glob("again.*.png"):
        twin = dashboard.tmp / path.name.replace("again.", "codepoints.", 1)
        assert (
            hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(twin.read_bytes()).digest()
        )


def test_refreshing_notes_changes_nothing_but_notes(dashboard):
    assert dashboard.after == dashboard.before
    note = dashboard.detail["note"]["body"]
    assert "an outdated note" not in note
    assert f"storage: {dashboard.url}" in note


def test_best_trial_is_the_recommendation_with_its_curve_figures_and_time(dashboard):
    for name, document in ((CODEPOINTS, dashboard.yaml), (LATE, dashboard.late_yaml)):
        detail = dashboard.details[name]
        (best,) = detail["best_trials"]
        recommended = _recommended(detail)
        assert best["number"] == recommended["number"], name
        assert json.loads(_attrs(best)["config"]) == document["config"], name
        # the run it repeats: its curve and figures, and its time as the summary reads it
        assert best["intermediate_values"], name
        assert {"steps_to_target", "step_time_s", "time_to_target_s"} <= set(_attrs(best))
        # shown to 4 significant digits, rounded from full precision (the YAML's 6 digits
        # rounded again can differ by one in the last: 0.039665 -> 0.03966, not 0.03967)
        (value,) = best["values"]
        assert float(value) == float(f"{float(value):.4g}"), (name, value)
        assert float(value) == pytest.approx(_answer_time(document), rel=1e-3), (name, value)


def test_every_run_has_a_role_params_and_the_constraint_the_dashboard_reads(dashboard):
    roles = {}
    for name in (CODEPOINTS, LATE):
        for number, trial in _trials(dashboard.details[name]).items():
            attrs = _attrs(trial)
            roles.setdefault(name, set()).add(attrs.get("role"))
            assert attrs.get("role") in (
                "reference",
                "float32-clip",
                *_AMP_ROLES,
                *_HORIZON_ROLES,
            ), (number, attrs)
            if attrs["role"] in ("baseline", "search", "confirm", "island", "replay"):
                assert {
                    "config",
                    "skipped_steps",
                    "min_scale",
                    "steps_to_target",
                    "time_to_target_s",
                    "loss_vs_float32",
                } <= set(attrs), number
            if attrs["role"] == "phase":
                assert set(attrs) >= _PHASE_ATTRS, number
            assert trial["params"], f"trial {number} has no params"
            if trial["state"] != "Complete" or attrs["role"] == "reference":
                continue
            assert trial["constraints"], f"trial {number}: no constraints for the dashboard"
            feasible = attrs["role"] in ("recommended", "phase") or (
                attrs.get("steps_to_target") != "null"
            )
            assert (max(trial["constraints"]) <= 0) == feasible, (number, trial["constraints"])
    assert "phase" in roles[LATE], "the horizon search branches its finalists"


def test_curves_are_relative_to_the_target_and_branches_sit_in_their_windows(dashboard):
    from scalertune import _policy

    steps = dashboard.yaml["evidence"]["steps"]
    for number, trial in _trials(dashboard.detail).items():
        attrs = _attrs(trial)
        if (
            trial["state"] != "Complete"
            or attrs["role"] == "recommended"
            or "duplicate_of" in attrs
        ):
            continue  # pruned runs below; the others trained nothing, the run they repeat did
        values = trial["intermediate_values"]
        assert 0 < len(values) <= steps // _policy.READBACK_INTERVAL + 1, number
        if attrs["role"] == "reference":
            # float32's smoothed loss ends at the target over (1 + tolerance), in log10
            assert values[-1]["value"] == pytest.approx(
                math.log10(1 / (1 + _policy.TARGET_TOLERANCE)), rel=1e-6
            )
    late = _trials(dashboard.late)
    horizon = dashboard.late_yaml["evidence"]["horizon"]
    reference = next(
        t for t in late.values() if _attrs(t)["role"] == "reference" and _attrs(t)["seed"] == "0"
    )
    assert reference["intermediate_values"][-1]["step"] >= horizon - _policy.READBACK_INTERVAL
    for trial in late.values():
        attrs = _attrs(trial)
        if attrs["role"] == "phase":
            start, end = int(attrs["start"]), int(attrs["end"])
            assert trial["intermediate_values"], trial["number"]
            assert all(start <= v["step"] < end for v in trial["intermediate_values"])


def test_pruned_trials_have_no_objective_value_and_the_history_plot_only_times(dashboard):
    pruned = [t for d in dashboard.details.values() for t in d["trials"] if t["state"] == "Pruned"]
    assert pruned, "the forward-overflow study prunes its float16 runs"
    for trial in pruned:
        # a log10 loss ratio on the time-to-target axis is what Optuna wrote before
        assert not trial.get("values"), trial["number"]


def test_notes_explain_roles_curves_and_mark_the_recommendation(dashboard):
    note = dashboard.detail["note"]["body"]
    assert "0 is the target" in note and "one point per" in note
    for role in ("reference", "baseline", "search", "confirm", *_HORIZON_ROLES):
        assert f"| {role} |" in note
    assert "```yaml" in note and "Verdict" in note
    trials = _trials(dashboard.detail)
    for number, trial in trials.items():
        body = trial["note"]["body"]
        assert body.startswith(f"### Trial {number}: "), (number, body)
        assert f"*{_attrs(trial)['role']}*" in body
    evidence = dashboard.yaml["evidence"]
    if "trial" in evidence:
        assert "★ recommended" in trials[evidence["trial"]]["note"]["body"]
        assert f"★ trial {evidence['trial']}" in note
    for trial in trials.values():
        attrs = _attrs(trial)
        if (
            trial["state"] == "Complete"
            and attrs["role"] in ("baseline", "search", "confirm")
            and attrs["steps_to_target"] == "null"
        ):
            assert "**Infeasible**" in trial["note"]["body"]
    for trial in dashboard.details["fwd"]["trials"]:
        if trial["state"] == "Pruned":
            assert "Pruned: forward" in trial["note"]["body"]


def test_the_horizon_study_note_and_a_branchs_note_name_the_windows_and_float32(dashboard):
    note = dashboard.late["note"]["body"]
    horizon = dashboard.late_yaml["evidence"]["horizon"]
    assert f"evidence covers steps 0-{horizon} of the horizon" in note
    assert "### Phases of the horizon" in note
    reference = next(
        n
        for n, t in _trials(dashboard.late).items()
        if _attrs(t)["role"] == "reference" and _attrs(t)["seed"] == "0"
    )
    for number, trial in _trials(dashboard.late).items():
        attrs = _attrs(trial)
        if attrs["role"] != "phase":
            continue
        body, window = trial["note"]["body"], f"{attrs['start']}-{attrs['end']}"
        if attrs["start"] == "0":  # the leading finalist, trained from step 0
            assert f"trial {attrs['of']}'s config from step 0 to {attrs['end']}" in body, body
            assert "judged at each phase window it reached" in body
        else:
            assert f"branch of trial {attrs['of']} at steps {window}" in body, body
            assert f"checkpoint at step {attrs['start']} (trial {reference}" in body
        assert f"**float32's continuation** over steps {window}" in body
        assert f"`trial #{reference}`" in body and f"`trial #{number}`" in body
        assert re.search(r"\*\*(Holds|Falls behind float32|Non-finite)\*\*", body)


def test_pictures_are_artifacts_and_shown_full_size_in_the_notes(dashboard):
    for name, count in ((CODEPOINTS, 2), (LATE, 3)):
        detail, sid = dashboard.details[name], dashboard.studies[name]
        artifacts = detail["artifacts"]
        assert len(artifacts) == count and all(a["mimetype"] == "image/png" for a in artifacts), (
            name,
            artifacts,
        )
        urls = {f"/artifacts/{sid}/{a['artifact_id']}" for a in artifacts}
        embedded = set(re.findall(r"!\[[^\]]*\]\((/artifacts/[^)]+)\)", detail["note"]["body"]))
        assert embedded == urls, name
        for url in urls:
            assert dashboard.get(url)[:8] == b"\x89PNG\r\n\x1a\n"
    default = next(
        t for t in dashboard.detail["trials"] if _attrs(t).get("baseline") == "pytorch-default"
    )
    assert re.search(r"!\[[^\]]*\]\(/artifacts/", default["note"]["body"])
    assert any(a["filename"] == "late.horizon.png" for a in dashboard.late["artifacts"])
    assert (dashboard.tmp / "late.horizon.png").exists()


def _history_points(page):
    """Markers the History plot drew (Plotly leaves out a trial without a finite value)."""
    start = page.index('id="plot-history"')
    return page[start : page.index("Hyperparameter Importance", start)].count('class="point"')


def test_the_browser_shows_best_trial_infeasible_runs_note_and_pictures(dashboard):
    sid = dashboard.studies[CODEPOINTS]
    best = _recommended(dashboard.detail)
    study_page = dashboard.render(f"/dashboard/studies/{sid}", "Best Trial (number=")
    shown = int(re.search(r"Best Trial \(number=(\d+)\)", study_page).group(1))
    assert shown == best["number"]
    never = {
        n: t
        for n, t in _trials(dashboard.detail).items()
        if _attrs(t)["role"] in ("baseline", "search", "confirm")
        and _attrs(t).get("steps_to_target") == "null"
    }
    assert never, "the codepoints float16 baselines never reach the target"
    # Whether they run to the end or are pruned as slower than the best depends on the step
    # timing: a complete one is infeasible, a pruned one has no value and no feasibility.
    for number, trial in never.items():
        label = f'data-unformatted="trial #{number} (infeasible)"'
        assert (label in study_page) is (trial["state"] == "Complete"), (number, trial)
    if any(t["state"] == "Complete" for t in never.values()):
        assert 'data-unformatted="Infeasible"' in study_page  # the timeline's legend
    for artifact in dashboard.detail["artifacts"]:  # the Study Artifacts card
        assert f'alt="{artifact["filename"]}"' in study_page

    note_page = dashboard.render(f"/dashboard/studies/{sid}/note", "Reading this study")
    assert f"scalertune: {CODEPOINTS}" in note_page and "Recommendation YAML" in note_page
    assert len(re.findall(rf'<img [^>]*src="/artifacts/{sid}/', note_page)) == 2


def test_the_browser_shows_the_horizon_studys_best_trial_history_and_branch(dashboard):
    sid, late = dashboard.studies[LATE], dashboard.late
    best = _recommended(late)
    page = dashboard.render(f"/dashboard/studies/{sid}", "Best Trial (number=")
    card = re.search(r"Best Trial \(number=(\d+)\)</h6><h3[^>]*>([^<]+)</h3>", page)
    assert int(card.group(1)) == best["number"]
    assert float(card.group(2)) == float(best["values"][0])  # 4 digits, not 16
    assert f'data-unformatted="trial #{best["number"]} "' in page  # its curve, plotted
    timed = [t for t in late["trials"] if t["state"] == "Complete" and _finite(t["values"][0])]
    assert _history_points(page) == len(timed)

    note_page = dashboard.render(f"/dashboard/studies/{sid}/note", "Phases of the horizon")
    assert len(re.findall(rf'<img [^>]*src="/artifacts/{sid}/', note_page)) == 3
    assert 'alt="the horizon: each finalist' in note_page

    branch, attrs = next(
        (n, _attrs(t)) for n, t in _trials(late).items() if _attrs(t)["role"] == "phase"
    )
    title = "config from step 0 to" if attrs["start"] == "0" else "branch of trial"
    trials_page = dashboard.render(
        f"/dashboard/studies/{sid}/trials?numbers={best['number']},{branch}",
        f"Trial {branch}: " + (f"trial {attrs['of']}'s " if attrs["start"] == "0" else "") + title,
    )
    assert f"Trial {best['number']}: ★ the recommendation" in trials_page
    assert "float32's continuation" in trials_page
