"""A trial's stored attributes are read and written through its typed records alone (issue 51):
the record modules name each key once, in a field, and no other module reads or writes a
trial's attribute by a string of its name."""

import ast
import dataclasses
import os

import pytest

import scalertune
from scalertune._judge._judged import Figures, Judged, PhaseFigures
from scalertune._storage import _names
from scalertune._storage._trial_record import RETRY_ATTRS, Job, Marks, Recommendation

PACKAGE = os.path.dirname(scalertune.__file__)

#: Every attribute a trial of a study stores of itself: the fields of its records (user
#: attributes), and the system attributes Optuna's retries and the search store.
TRIAL_KEYS = frozenset(
    [f.name for f in dataclasses.fields(Job)]
    + [f.name for f in dataclasses.fields(Marks)]
    + [f.name for f in dataclasses.fields(Recommendation)]
    + [f.name for f in dataclasses.fields(Figures)]
    + [f.name for f in dataclasses.fields(Judged) if f.name not in ("figures", "phase")]
    + [f"phase_{f.name}" for f in dataclasses.fields(PhaseFigures)]
    + list(RETRY_ATTRS)
    + [v for k, v in vars(_names).items() if k.endswith("_ATTR") and isinstance(v, str)]
)

#: The modules that write and read the records (and the float32 reference's, its own), and
#: the one that names the system attributes.
RECORD_MODULES = {
    os.path.join("_storage", "_trial_record.py"),
    os.path.join("_storage", "_names.py"),
    os.path.join("_judge", "_judged.py"),
    os.path.join("_judge", "_reference.py"),
}

#: Module -> the words of those that are keys of something else there, never a trial's
#: attribute. Only these: any other trial key a module names is found.
OTHER_MEANINGS = {
    # the result file's own blocks (config, evidence.seed...), written and read with the
    # YAML's schema
    os.path.join("_amp", "_schema.py"): {"config", "final_scale", "min_scale", "skipped_steps"},
    os.path.join("_review", "_document.py"): {
        "config",
        "final_scale",
        "loss_vs_float32",
        "min_scale",
        "missing",
        "of",
        "skipped_steps",
        "speedup_vs_float32",
        "step_time_s",
        "steps_to_target",
        "time_to_target_s",
        "verdict",
    },
    # a runtime's own state_dict (the config it trains with now)
    os.path.join("_amp", "_runtime.py"): {"config"},
    # a DeepSpeed config's keys (min_loss_scale ...) and the study's settings (seed)
    os.path.join("_export", "_deepspeed.py"): {"config", "min_scale"},
    os.path.join("_export", "_api.py"): {"config"},
    os.path.join("_frameworks", "_deepspeed.py"): {"config"},
    os.path.join("_judge", "_settings.py"): {"seed"},
    # the range of a search's options, a failure's kind, torchao's own config objects
    "_limits.py": {"seed"},
    os.path.join("_processes", "_protocol.py"): {"missing"},
    os.path.join("_export", "_torchao.py"): {"config"},
    os.path.join("_amp", "_torchao_private.py"): {"config"},
    # a run's own in-process record and the in-run check's config
    os.path.join("_run", "_record.py"): {"config"},
    os.path.join("_inrun", "_build.py"): {"config"},
}


def _named_keys(path):
    """(line, key) for each string literal of a trial key used as a mapping's key there: a
    subscript, a ``get``/``pop``/``setdefault``/``set_user_attr``/``set_system_attr``
    argument (the search's own ``set_system_attr(trial, key, value)`` too), an ``in`` test,
    a dict literal's key."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []

    def key(node):
        if isinstance(node, ast.Constant) and node.value in TRIAL_KEYS:
            found.append((node.lineno, node.value))

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            key(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _SETTERS and node.args:
                key(node.args[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "set_system_attr" and len(node.args) > 1:
                key(node.args[1])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key(node.left)
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                key(k)
    return found


_SETTERS = ("get", "pop", "setdefault", "set_user_attr", "set_system_attr")


def _sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, PACKAGE), path


def test_no_module_names_a_trials_attribute_outside_the_record_modules():
    named = {
        relative: keys
        for relative, path in _sources()
        if relative not in RECORD_MODULES
        and (
            keys := [
                (line, k)
                for line, k in _named_keys(path)
                if k not in OTHER_MEANINGS.get(relative, ())
            ]
        )
    }
    assert not named, "\n".join(f"{p}: {keys}" for p, keys in named.items())


def test_the_scan_finds_a_trials_attribute_read_by_its_name(tmp_path):
    """The scan above is no test if it finds nothing: a read by name is found."""
    source = tmp_path / "reader.py"
    source.write_text(
        "def of(trial):\n"
        "    attrs = trial.user_attrs\n"
        "    return attrs['role'], attrs.get('seed'), 'error' in attrs, {'of': 1}\n"
    )
    assert sorted(k for _, k in _named_keys(source)) == ["error", "of", "role", "seed"]
    source.write_text(
        "def mark(trial, study):\n"
        "    set_system_attr(trial, 'scalertune.judged', {})\n"
        "    study.set_system_attr('failed_trial', 3)\n"
    )
    assert sorted(k for _, k in _named_keys(source)) == ["failed_trial", "scalertune.judged"]


@pytest.mark.parametrize("record", [Job, Marks, Recommendation, Figures, PhaseFigures])
def test_each_records_keys_are_its_fields_names(record):
    """A key list is derived from the fields, never written out again."""
    from scalertune._storage import _trial_record

    names = tuple(f.name for f in dataclasses.fields(record))
    if record is Job:
        assert names == _trial_record.JOB_ATTRS
    if record is Marks:
        assert names == _trial_record.MARK_ATTRS
    assert names  # every record stores something


def test_a_job_and_its_judged_record_read_back_as_written():
    from scalertune._amp._config import AmpConfig
    from scalertune._judge._phases import PhaseResult

    job = Job("phase", seed=3, config=AmpConfig(dtype="float16"), of=7, start=0, end=400)
    assert Job.read(job.attrs()) == job and job.from_start
    results = (PhaseResult(0, 200, 1.1, 0.5, False, from_start=True),)
    judged = Judged(
        figures=Figures(skipped_steps=2, steps_run=400),
        measured_step_time_s=0.01,
        phase=PhaseFigures(
            start=0, end=400, ratio=1.1, z=0.5, nonfinite=False, holds=True, results=results
        ),
    )
    assert Judged.read(judged.attrs()) == judged


@pytest.mark.parametrize(
    ("stored", "named"),
    [
        ({"seed": "0"}, "seed is damaged: it is not a whole number"),
        ({"role": 3}, "role is damaged: it is not text"),
        ({"save": "../../etc/passwd"}, "save is damaged: it is not a checkpoint's file name"),
        ({"config": {"dtype": "int4"}}, "config is damaged: it is not an AMP config"),
    ],
)
def test_a_damaged_job_is_named_in_one_line(stored, named):
    from scalertune._errors import DamagedEvidence

    with pytest.raises(DamagedEvidence, match=named):
        Job.read(stored, "trial #4")


@pytest.mark.parametrize("key", ["min_scale", "loss_vs_float32", "phase_ratio", "phase_forward"])
def test_a_nan_figure_is_damaged_evidence_not_a_figure(key):
    """A run never stores NaN (a figure that is not finite is stored as null): a NaN read
    back is damage, named, where a planted one reached the table and the YAML as ``nanx``
    and a phase of ``nanx`` read as holding."""
    from scalertune._errors import DamagedEvidence

    stored = {"steps_run": 40, "phase_start": 0, "phase_end": 40, key: float("nan")}
    with pytest.raises(DamagedEvidence, match=f"{key} is damaged: it is not a number"):
        Judged.read(stored, "trial #5")
    assert Judged.read({**stored, key: float("inf")}).figures.steps_run == 40


def test_a_judged_record_of_a_later_format_is_damaged_not_misread():
    from scalertune._errors import DamagedEvidence

    with pytest.raises(DamagedEvidence, match="format this release does not read"):
        Judged.read({"version": 99, "steps_run": 3})
    assert Judged.read({"steps_run": 3}).figures.steps_run == 3  # before versions: 1


def test_a_retry_chain_reads_as_optuna_writes_it_and_a_damaged_one_as_its_own_chain():
    import optuna

    from scalertune._storage._trial_record import Retry

    def trial(**system):
        return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, system_attrs=system)

    assert Retry.sound(trial(failed_trial=3, retry_history=[3, 4])) == Retry(3, (3, 4))
    assert Retry.sound(trial()).first(7) == 7
    assert Retry.sound(trial(failed_trial="3", retry_history=[3])).first(7) == 7
    assert Retry.sound(trial(retry_history="34")) == Retry()
    assert Retry(3, (3, 4)).attrs() == {"failed_trial": 3, "retry_history": [3, 4]}
    assert Retry().attrs() == {}


def test_a_damaged_job_read_in_part_keeps_the_fields_that_are_sound():
    """Where a line must still name a run (the summary's), a job with one damaged value
    reads its other fields; a sound job reads whole."""
    import optuna

    def trial(**attrs):
        return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=attrs)

    damaged = trial(role="phase", of=4, start="zero", end=400, config={"dtype": "int4"})
    assert Job.partial(damaged) == Job(role="phase", of=4, end=400)
    sound = Job("phase", seed=1, of=4, start=0, end=400)
    assert Job.partial(trial(**sound.attrs())) == sound
