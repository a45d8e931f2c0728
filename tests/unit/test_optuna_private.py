"""Each private part of Optuna that scalertune relies on, checked against the installed Optuna
on real storages (SQLite, a journal file, memory): the adapter that holds them all,
``scalertune._storage._optuna``, does what its callers expect. A new Optuna release that
moves one of them fails here, by name, before a search meets it; ``pyproject.toml`` bounds
optuna to the releases this file passed on."""

import dataclasses
import json
import math
import pathlib
import re

import optuna
import pytest
from optuna.trial import TrialState

import scalertune
from scalertune._storage import _optuna
from scalertune._storage._open import open_storage

#: How the package spells a private name of Optuna's: an attribute of an Optuna object, or a
#: private module of Optuna's.
PRIVATE = re.compile(
    r"\._(trial_id|study_id|storage|backend|cached_frozen_trial"
    r"|pop_waiting_trial_id)\b|optuna\.[a-z_.]*\._[a-z]|_create_scoped_session"
)


@pytest.fixture(params=["sqlite", "journal", "memory"])
def study(request, tmp_path):
    """A study on each kind of storage a search opens (through scalertune's own opener)."""
    kind = request.param
    storage = {
        "sqlite": lambda: open_storage(f"sqlite:///{tmp_path / 's.db'}"),
        "journal": lambda: open_storage(str(tmp_path / "s.log")),
        "memory": optuna.storages.InMemoryStorage,
    }[kind]()
    return optuna.create_study(storage=storage, study_name="private")


def test_the_ids_are_the_ones_the_storage_knows_the_study_and_trials_by(study):
    other = optuna.create_study(storage=_optuna.storage_of(study), study_name="other")
    other.ask()  # a trial of another study first: ids and numbers part ways
    trial = study.ask()
    storage = _optuna.storage_of(study)
    assert storage.get_study_id_from_name("private") == _optuna.study_id(study)
    assert storage.get_study_id_from_name("other") != _optuna.study_id(study)
    frozen = study.trials[0]
    assert _optuna.trial_id(trial) == _optuna.trial_id(frozen)
    assert storage.get_trial(_optuna.trial_id(trial)).number == trial.number == 0
    assert storage.get_trial_id_from_study_id_trial_number(
        _optuna.study_id(study), 0
    ) == _optuna.trial_id(frozen)
    summary = next(s for s in storage.get_all_studies() if s.study_name == "private")
    assert _optuna.study_id(summary) == _optuna.study_id(study)


def test_the_storage_is_the_one_the_study_reads_and_writes(study):
    storage = _optuna.storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage)
    again = optuna.load_study(study_name="private", storage=storage)
    again.add_trial(optuna.trial.create_trial(value=1.0))
    assert [t.value for t in study.trials] == [1.0]


def test_a_running_trials_system_attribute_is_written_where_frozen_trials_read_it(study):
    trial = study.ask()
    _optuna.set_system_attr(trial, "scalertune.example", {"losses": [1.0, 2.0]})
    study.tell(trial, 1.0)
    assert study.trials[0].system_attrs["scalertune.example"] == {"losses": [1.0, 2.0]}
    assert "scalertune.example" not in study.trials[0].user_attrs


def test_a_queued_trials_fixed_params_are_the_ones_it_was_queued_with(study):
    study.enqueue_trial({"dtype": "bfloat16"}, user_attrs={"role": "baseline"})
    queued = study.ask()
    assert _optuna.fixed_params(queued) == {"dtype": "bfloat16"}
    assert queued.suggest_categorical("dtype", ["float16", "bfloat16"]) == "bfloat16"
    assert _optuna.fixed_params(study.ask()) == {}  # a sampled trial has none


def test_taking_a_waiting_trial_makes_it_running_as_ask_does(study):
    assert _optuna.take_waiting_trial(study) is None
    study.enqueue_trial({}, user_attrs={"role": "baseline"})
    taken = _optuna.take_waiting_trial(study)
    (trial,) = study.trials
    assert taken == _optuna.trial_id(trial) and trial.state == TrialState.RUNNING
    assert trial.user_attrs == {"role": "baseline"}


def test_a_note_is_saved_on_a_finished_trial_through_its_handle(study):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    study.tell(study.ask(), 2.0)
    handle = _optuna.trial_handle(study, study.trials[0])
    optuna_dashboard.save_note(handle, "### a note")
    assert optuna_dashboard.get_note(handle) == "### a note"
    assert handle.number == 0


def test_the_longest_study_name_is_the_one_an_rdb_storage_holds(tmp_path):
    longest = _optuna.max_study_name_length()
    assert longest >= 128
    storage = open_storage(f"sqlite:///{tmp_path / 'names.db'}")
    optuna.create_study(storage=storage, study_name="n" * longest)
    assert optuna.load_study(study_name="n" * longest, storage=storage).study_name


def test_curve_points_on_an_rdb_storage_take_the_one_session_path(tmp_path):
    """The parts the batched write uses are all there (else it would quietly fall back to one
    write per point), behind the cache Optuna puts in front of an RDB storage."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="c")
    trial = study.ask()
    assert type(_optuna.storage_of(study)).__name__ == "_CachedStorage"
    assert isinstance(_optuna.rdb_backend(trial), optuna.storages.RDBStorage)
    _optuna.write_points(trial, [(0.5, 9), (math.inf, 19), (-0.25, 29)])
    # what the trial object itself holds (Optuna's own report keeps it) reads the same
    assert trial._cached_frozen_trial.intermediate_values == {9: 0.5, 19: math.inf, 29: -0.25}
    assert study.trials[0].intermediate_values == {9: 0.5, 19: math.inf, 29: -0.25}
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        _optuna.write_points(trial, [(1.0, 39)])


def test_other_storages_have_no_rdb_backend(tmp_path):
    for storage in (optuna.storages.InMemoryStorage(), open_storage(str(tmp_path / "j.log"))):
        trial = optuna.create_study(storage=storage).ask()
        assert _optuna.rdb_backend(trial) is None


def test_the_artifact_records_are_the_ones_optuna_lists(tmp_path):
    """What ``upload_artifact`` writes is what the adapter reads as the study's records."""
    from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact

    study = optuna.create_study(storage=open_storage(str(tmp_path / "a.log")))
    picture = tmp_path / "p.png"
    picture.write_bytes(b"png")
    store = FileSystemArtifactStore(str(tmp_path))
    upload_artifact(artifact_store=store, file_path=str(picture), study_or_trial=study)
    records = _optuna.artifact_records(study)
    (meta,) = get_all_artifact_meta(study)
    assert [json.loads(text) for text in records.values()] == [dataclasses.asdict(meta)]


def test_no_other_file_names_a_private_part_of_optuna():
    """The adapter and this file are the two that do."""
    root = pathlib.Path(scalertune.__file__).parents[1]
    here = pathlib.Path(__file__).resolve()
    adapter = pathlib.Path(_optuna.__file__).resolve()
    naming = sorted(
        str(path.relative_to(root))
        for folder in ("scalertune", "tests", "benchmarks", "examples")
        for path in (root / folder).rglob("*.py")
        if path.resolve() not in (here, adapter)
        and PRIVATE.search(_code(path.read_text(encoding="utf-8")))
    )
    assert naming == []


def _code(text: str) -> str:
    """``text`` without the package's own module paths (``scalertune._storage._open``)."""
    return re.sub(r"scalertune(\._\w+)+", "", text)


def test_every_storage_call_the_outage_retries_is_one_the_rdb_storage_has():
    from optuna.storages import RDBStorage
    from optuna.storages._cached_storage import _CachedStorage

    from scalertune._storage._outage import RDB_CALLS

    assert all(callable(getattr(RDBStorage, name, None)) for name in RDB_CALLS)
    # what Optuna's cache calls on the storage behind it is among them
    import inspect
    import re

    called = set(re.findall(r"self\._backend\.(\w+)\(", inspect.getsource(_CachedStorage)))
    no_database = {
        "get_heartbeat_interval",
        "get_heartbeat_stale_trial_callback",
        "record_heartbeat",
    }
    assert called - no_database <= set(RDB_CALLS)


def test_the_storage_file_is_the_database_or_journal_the_study_is_kept_in(study, tmp_path, request):
    """What the artifact store is recorded relative to (``_store.record_location``): the
    SQLite file (behind Optuna's cache) or the journal file, absolute; none in memory."""
    kind = request.node.callspec.params["study"]
    kept = {"sqlite": str(tmp_path / "s.db"), "journal": str(tmp_path / "s.log"), "memory": None}
    assert _optuna.storage_file(study) == kept[kind]
