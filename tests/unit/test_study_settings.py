"""A study's settings as one typed record: its rules about the horizon, the trial and the
windows, its round trip through storage, and the studies written before it existed, which
still review as they did.

``tests/data/study_v1.journal`` holds two studies written by scalertune before the record
had a version (a 40-step search of ``tests/workloads.py:healthy``, and one of
``tests/late_workloads.py:readings_near_1000`` over a horizon of 200), with what
``scalertune report --json`` and ``scalertune report`` printed for each then
(``study_v1.NAME.json``, ``study_v1.NAME.summary.txt``).
"""

import dataclasses
import json
import os
import shutil

import optuna
import pytest
import yaml
from conftest import HERE, ROOT, run_cli

import scalertune
from scalertune._amp._config import AmpConfig
from scalertune._errors import ParameterError, UsageError
from scalertune._judge._settings import VERSION, StudySettings
from scalertune._storage._names import SETTINGS_ATTR
from scalertune._storage._open import open_storage

DATA = os.path.join(HERE, "data")
V1_JOURNAL = "written_by_0.1.journal"


def _settings(**changes):
    base = {
        "factory": "model.py:make_model",
        "steps": 200,
        "horizon": 2000,
        "seed": 0,
        "space": {"name": "default", "params": {"dtype": {"choices": ["bfloat16"]}}},
        "device_type": "cpu",
        "device": "cpu (x86_64, 2 threads)",
        "reference": AmpConfig(dtype="float32", clip_norm=1.0),
    }
    return StudySettings(**{**base, **changes})


def test_the_record_round_trips_through_its_stored_form_with_its_version():
    settings = _settings(instance="abcd1234")
    stored = json.loads(json.dumps(settings.to_dict()))  # as a storage keeps it
    assert stored["version"] == VERSION and stored["reference"]["clip_norm"] == 1.0
    assert StudySettings.from_dict(stored) == settings
    assert settings.clip_norm == 1.0 and settings.space_dtypes == ("bfloat16",)


def test_the_horizon_rules_live_in_the_record():
    long, short = _settings(), _settings(horizon=200)
    assert long.long and long.windows == [(1000, 1200), (1800, 2000)]
    assert not short.long and short.windows == []
    # a tie is float32's seed spread of the horizon where it goes past a trial
    assert long.noise(0.05).margin(100) == pytest.approx(100.0)
    assert short.noise(0.05).margin(100) == pytest.approx(5.0)
    with pytest.raises(ParameterError, match="horizon must be at least a trial's steps"):
        _settings(horizon=100)


def test_the_horizon_defaults_to_the_factorys_then_to_the_trial():
    from scalertune import _limits

    assert _limits.horizon(200) == 200
    assert _limits.horizon(200, None, 5000) == 5000
    assert _limits.horizon(200, 3000, 5000) == 3000
    with pytest.raises(ParameterError, match="got 100"):
        _limits.horizon(200, 100)


def test_older_stored_settings_read_with_the_defaults_of_their_time():
    oldest = {
        "factory": "m.py:f",
        "steps": 200,
        "seed": 3,
        "space": {"name": "float16"},
        "device_type": "cuda",
        "device": "cuda:0 (A100)",
    }
    settings = StudySettings.from_dict(oldest)
    # no horizon: the trial was the evidence; no reference: float32 without a clip
    assert (settings.version, settings.horizon, settings.long) == (1, 200, False)
    assert settings.reference == AmpConfig(dtype="float32") and settings.instance == ""
    assert settings.space_dtypes == ("float16",)


def test_settings_from_a_newer_scalertune_are_refused_in_words():
    with pytest.raises(UsageError, match=f"newer than this scalertune reads \\({VERSION}\\)"):
        StudySettings.from_dict({**_settings().to_dict(), "version": VERSION + 1})


def test_a_rerun_compares_the_settings_that_make_trials_comparable():
    settings = _settings()
    assert settings.differs_from(_settings(device="cpu (1 thread)")) is None
    assert settings.differs_from(_settings(horizon=4000)) == "horizon"
    assert settings.differs_from(_settings(steps=100, horizon=2000)) == "steps"
    assert settings.differs_from(_settings(reference=AmpConfig(dtype="float32"))) == "reference"


def test_a_rerun_on_another_model_differs_in_its_fingerprint_only_where_both_have_one():
    one = {"tensors": 4, "values": 337, "sha256": "0123456789abcdef"}
    other = {"tensors": 4, "values": 401, "sha256": "fedcba9876543210"}
    assert _settings(model=one).differs_from(_settings(model=dict(one))) is None
    assert _settings(model=one).differs_from(_settings(model=other)) == "model"
    # a study written before fingerprints, or a model with flattened parameters: no telling
    assert _settings().differs_from(_settings(model=other)) is None
    assert _settings(model=one).differs_from(_settings()) is None
    # the settings that make trials comparable come first
    assert _settings(model=one).differs_from(_settings(horizon=4000, model=other)) == "horizon"


def test_a_study_without_settings_says_so():
    study = optuna.create_study()
    settings = StudySettings.of(study)
    assert not settings.stored and settings.windows == []
    study.set_user_attr(SETTINGS_ATTR, _settings().to_dict())
    assert StudySettings.of(study) == _settings()


@pytest.fixture
def v1(tmp_path):
    """The studies written before the record had a version, in a folder of their own."""
    shutil.copy(os.path.join(DATA, "study_v1.journal"), tmp_path / V1_JOURNAL)
    return tmp_path


@pytest.mark.parametrize("name", ["short", "long"])
def test_a_study_written_before_the_record_reports_as_it_did(v1, name):
    with open(os.path.join(DATA, f"study_v1.{name}.summary.txt"), encoding="utf-8") as f:
        summary = f.read()
    with open(os.path.join(DATA, f"study_v1.{name}.json"), encoding="utf-8") as f:
        document = json.load(f)
    ran = run_cli("report", "--storage", V1_JOURNAL, "--study-name", name, cwd=v1)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == summary
    ran = run_cli("report", "--storage", V1_JOURNAL, "--study-name", name, "--json", cwd=v1)
    assert json.loads(ran.stdout) == document
    study = optuna.load_study(study_name=name, storage=open_storage(str(v1 / V1_JOURNAL)))
    settings = StudySettings.of(study)
    assert settings.version == 1 and settings.stored
    assert settings.long == (name == "long") and settings.instance


def test_report_reads_a_storages_only_study_without_its_name_and_names_them_where_several(v1):
    ran = run_cli("report", "--storage", V1_JOURNAL, cwd=v1)
    assert ran.returncode == 2 and ran.stdout == ""
    assert (
        ran.stderr.strip()
        .splitlines()[-1]
        .endswith("holds 2 studies (long, short): name one with --study-name")
    ), ran.stderr
    optuna.delete_study(study_name="long", storage=open_storage(str(v1 / V1_JOURNAL)))
    ran = run_cli("report", "--storage", V1_JOURNAL, cwd=v1)
    assert ran.returncode == 0, ran.stderr
    with open(os.path.join(DATA, "study_v1.short.summary.txt"), encoding="utf-8") as f:
        assert ran.stdout == f.read()


def test_the_horizon_picture_says_of_a_finalist_without_evidence_what_the_summary_says(v1):
    """The long study's answer held with its first finalist: the others were not needed.
    The summary's phases table says "not run" of them, and so does the picture's legend."""
    from scalertune._review._analyze import analyze
    from scalertune._review._horizon_plot import horizon_figure

    study = optuna.load_study(study_name="long", storage=open_storage(str(v1 / V1_JOURNAL)))
    result = analyze(study)
    with open(os.path.join(DATA, "study_v1.long.summary.txt"), encoding="utf-8") as f:
        table = [line.rstrip() for line in f if line.startswith(("pytorch-default ", "trial #"))]
    unjudged = [run for run in result.finalists if result.holds(run) is None]
    assert sum(line.endswith(" not run") for line in table) == len(unjudged) == 2
    figure = horizon_figure(result)
    labels = [label for ax in figure.axes for label in ax.get_legend_handles_labels()[1]]
    for run in unjudged:
        (label,) = [label for label in labels if label.startswith(f"{run.label} [")]
        assert label.endswith(": not run"), label


def test_a_search_resumes_a_study_written_before_the_record(v1):
    """The same search again on the old study: its settings compare equal, nothing is
    refused, and the answer it already had is the answer."""
    shutil.copytree(
        os.path.join(ROOT, "tests"),
        v1 / "tests",
        ignore=shutil.ignore_patterns("data", "__pycache__", "unit", "integration"),
    )
    before = os.getcwd()
    os.chdir(v1)
    try:
        result = scalertune.search(
            "tests/workloads.py:healthy",
            storage=V1_JOURNAL,
            study_name="short",
            steps=40,
            n_trials=3,
            device="cpu",
        )
    finally:
        os.chdir(before)
    with open(os.path.join(DATA, "study_v1.short.json"), encoding="utf-8") as f:
        document = json.load(f)
    assert result.config.to_dict() == document["config"]
    assert result.settings.version == 1


def test_report_trial_writes_that_run_as_chosen_by_hand_and_refuses_before_printing(v1):
    ran = run_cli(
        "report", "--storage", V1_JOURNAL, "--study-name", "short", "--trial", "7",
        "-o", "t7.yaml", cwd=v1,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    written = yaml.safe_load((v1 / "t7.yaml").read_text())
    assert written["config"]["init_scale"] == 4096.0 and written["evidence"]["trial"] == 7
    verdict = written["evidence"]["verdict"]
    assert "init-scale-4096, chosen by hand (report --trial 7), not the search's answer" in verdict
    assert "the best AMP config" not in verdict
    ran = run_cli(
        "report", "--storage", V1_JOURNAL, "--study-name", "short", "--trial", "0",
        "-o", "t0.yaml", cwd=v1,
    )  # fmt: skip
    assert ran.returncode == 2 and ran.stdout == "" and not (v1 / "t0.yaml").exists()
    assert "--trial must be a finished AMP run of this study" in ran.stderr
    # the factory file the study was searched with is no place for its YAML
    (v1 / "tests").mkdir()
    factory = v1 / "tests" / "workloads.py"
    factory.write_text("def healthy():\n    ...\n")
    ran = run_cli(
        "report", "--storage", V1_JOURNAL, "--study-name", "short", "-o", "tests/workloads.py",
        cwd=v1,
    )  # fmt: skip
    assert ran.returncode == 2 and ran.stdout == "", ran.stderr
    assert "is the study's factory file" in ran.stderr
    assert factory.read_text() == "def healthy():\n    ...\n"


def test_report_with_an_artifact_dir_it_cannot_write_leaves_the_studys_store_as_it_was(v1):
    from scalertune._storage._names import ARTIFACT_DIR_ATTR

    def recorded():
        study = optuna.load_study(study_name="short", storage=open_storage(str(v1 / V1_JOURNAL)))
        return study.user_attrs.get(ARTIFACT_DIR_ATTR)

    before = recorded()
    (v1 / "blocked").write_text("a file, where the folder's parent would be\n")
    ran = run_cli(
        "report", "--storage", V1_JOURNAL, "--study-name", "short", "-o", "x.yaml",
        "--artifact-dir", "blocked/art", cwd=v1,
    )  # fmt: skip
    assert ran.returncode == 0 and (v1 / "x.yaml").exists(), ran.stderr
    assert "could not add notes and pictures to the study" in ran.stderr
    assert recorded() == before
    ran = run_cli(
        "report", "--storage", V1_JOURNAL, "--study-name", "short", "-o", "y.yaml", cwd=v1
    )
    assert ran.returncode == 0, ran.stderr


def _short_findings(v1):
    from scalertune._review._analyze import analyze

    study = optuna.load_study(study_name="short", storage=open_storage(str(v1 / V1_JOURNAL)))
    return analyze(study)


def test_a_run_chosen_by_hand_that_was_pruned_is_not_said_to_have_reached_the_target(v1):
    """``report --trial N`` on a run pruned as slower: the evidence it covers stops where it
    was pruned, not "after reaching the target" (a new user's YAML said both)."""
    from scalertune._review._verdict import covers

    found = _short_findings(v1)
    chosen = found.best_amp
    pruned = dataclasses.replace(
        chosen,
        state="pruned",
        prune_kind="slower",
        figures=dataclasses.replace(chosen.figures, steps_to_target=None, steps_run=30),
    )
    said = covers(dataclasses.replace(found, best_amp=pruned, confirmations={}, by_hand=True))
    assert "stopped at step 30 on seed 0, pruned (slower than the best) without reaching" in said
    assert "after reaching the target" not in said
    reached = dataclasses.replace(
        chosen, figures=dataclasses.replace(chosen.figures, steps_to_target=25, steps_run=30)
    )
    said = covers(dataclasses.replace(found, best_amp=reached, confirmations={}))
    assert "stopped at step 30 on seed 0, after reaching the target" in said


def test_a_float32_loss_that_rose_after_the_run_stopped_is_said_to_have_risen(v1):
    """What the evidence covers compares float32's loss where the run stopped with its last:
    a loss that rose is said to rise, not to fall by a negative share (a new user read "fell
    -1.2% further")."""
    from scalertune._review._verdict import covers

    found = _short_findings(v1)
    chosen = found.best_amp
    stopped = dataclasses.replace(
        chosen, figures=dataclasses.replace(chosen.figures, steps_to_target=25, steps_run=30)
    )
    ref = found.references[chosen.seed]
    curve = list(ref.target.reference_curve)
    rising = (*[1.0] * 30, *[1.0125] * (len(curve) - 30))  # flat, then up 1.25%
    references = {**found.references, chosen.seed: dataclasses.replace(ref, losses=rising)}
    said = covers(
        dataclasses.replace(found, best_amp=stopped, confirmations={}, references=references)
    )
    assert f"rose 1.2% by step {len(curve)}" in said and "fell -" not in said, said


def test_no_amp_verdict_says_what_the_amp_runs_did_not_that_they_went_non_finite(v1):
    """Where no AMP run reached the target, the verdict counts what was pruned and for what,
    and how close the runs that trained on ended: a new user's float8 study, where nothing went
    non-finite, read "no AMP config reached the float32 target without going non-finite"."""
    from scalertune._review._verdict import verdict

    found = _short_findings(v1)
    amp = [o for o in found.ranking if o.config.dtype != "float32"]
    never, far = (
        dataclasses.replace(
            o,
            figures=dataclasses.replace(
                o.figures, steps_to_target=None, loss_vs_float32=ratio, loss_vs_float32_step=40
            ),
        )
        for o, ratio in zip(amp[:2], (750.0, 9080.0), strict=True)
    )
    pruned = [dataclasses.replace(o, state="pruned", prune_kind="float8") for o in amp[2:]]
    ranking = [o for o in found.ranking if o.config.dtype == "float32"] + [never, far, *pruned]
    nothing = dataclasses.replace(
        found, ranking=ranking, pool=[], candidates=[], best_amp=None, recommended=None
    )
    said = verdict(nothing)
    assert "non-finite" not in said
    assert (
        f"no AMP config reached the float32 target: of {len(amp)} AMP runs, {len(pruned)} "
        f"pruned (float8 loses a layer) and 2 trained on without reaching it (the closest, "
        f"{never.label}, at 750x float32's loss at step 40)"
    ) in said


def test_no_float16_run_at_the_target_draws_no_keep_the_defaults_advice(v1):
    """Where no float16 run reached the target, "PyTorch's defaults ... keep them" read as
    advice to train float16 beside a float32 answer (a Lightning example's summary)."""
    from scalertune._review._scaler_advice import scaler_advice

    found = _short_findings(v1)
    assert "keep them" in scaler_advice(found)
    pool = [o for o in found.pool if o.config.dtype != "float16"]
    said = scaler_advice(dataclasses.replace(found, pool=pool))
    assert "keep them" not in said
    assert said.endswith(
        "no float16 run reached the target whatever its scaler: the scaler's knobs are not "
        "what fails here"
    )


def test_a_long_study_without_finalists_prints_no_empty_phases_table(v1):
    """A horizon study where no run reached the target has no finalist: no table of none
    (its header alone was printed)."""
    from scalertune._review._analyze import analyze
    from scalertune._review._summary import _phases

    study = optuna.load_study(study_name="long", storage=open_storage(str(v1 / V1_JOURNAL)))
    found = analyze(study)
    assert _phases(found)[0].startswith("phases of the horizon")
    never = [
        dataclasses.replace(o, figures=dataclasses.replace(o.figures, steps_to_target=None))
        if o.config.dtype != "float32"
        else o
        for o in found.ranking
    ]
    none = dataclasses.replace(found, ranking=never, pool=[], islands=[], float32_clip=None)
    assert none.finalists == [] and _phases(none) == []
    assert "phases of the horizon" not in none.summary()


def test_a_timing_on_a_busy_cpu_says_so_beside_its_step_times(v1):
    """A new user's search on a CPU at load 5-9 (2 cores) answered bfloat16 "2.11x faster
    than float32": the summary says the CPU was busy while timing, and what to do."""
    from scalertune._run._step_times import StepTimes

    found = _short_findings(v1)
    seed = found.settings.seed
    times = found.references[seed].step_times
    assert "busy while timing" not in found.summary()
    for load, said in ((1.0, False), (4.2, True)):
        reference = dataclasses.replace(
            found.references[seed], step_times=dataclasses.replace(times, load=load)
        )
        busy = dataclasses.replace(found, references={**found.references, seed: reference})
        line = "the CPU was busy while timing (load 4.2 per core): the step times, and their"
        assert (line in busy.summary()) is said
        if said:  # timed on 2 threads: one is the advice; on one already, it is not
            assert "set OMP_NUM_THREADS=1, or time on a quiet machine" in busy.summary()
    one = dataclasses.replace(times, load=4.2, threads=1)
    reference = dataclasses.replace(found.references[seed], step_times=one)
    quiet = dataclasses.replace(found, references={**found.references, seed: reference})
    assert "far off; time on a quiet machine" in quiet.summary()
    assert "OMP_NUM_THREADS" not in quiet.summary()
    # kept with the timing, as the study stores it
    stored = dataclasses.replace(times, load=4.2, threads=1).to_dict()
    back = StepTimes.from_dict(stored)
    assert back.load == 4.2 and back.busy and back.threads == 1
