"""Where a study's artifact store is, as the study records it: whoever can write the study's
database chooses that record, so a folder outside the storage file's own is used only where
the user names it (``--artifact-dir``), and a folder inside it is recorded relative to it,
so a copied study folder reads and writes its own store (issue 50)."""

import os
import shutil
import subprocess
import sys

import optuna
import pytest
from conftest import HERE, spec

import scalertune
from scalertune._errors import UsageError
from scalertune._storage._names import ARTIFACT_DIR_ATTR
from scalertune._storage._open import load_existing_study, open_storage
from scalertune._storage._store import (
    DEFAULT_ARTIFACT_DIR,
    default_location,
    location_of,
    settle_location,
)


def _study(path, name="s"):
    return optuna.create_study(
        storage=open_storage(str(path)), study_name=name, load_if_exists=True
    )


def _v1_study(folder, recorded):
    """The stored old study (``tests/data/study_v1.journal``) in ``folder``, its artifact
    store's record set to ``recorded``, as whoever can write the journal would."""
    path = folder / "v1.journal"
    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), path)
    load_existing_study(str(path), "short").set_user_attr(ARTIFACT_DIR_ATTR, recorded)
    return path


def _scalertune(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "scalertune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_report_refuses_to_write_pictures_where_the_database_alone_says(tmp_path, how):
    """``report -o`` run by anyone (root included) writes no picture outside the storage
    file's folder because the study says so: one line naming the flag, exit 2, nothing
    written; the user naming the place with the flag writes there."""
    (tmp_path / "study").mkdir()
    outside = tmp_path / "etc"
    outside.mkdir()
    recorded = str(outside) if how == "absolute" else "../etc"
    _v1_study(tmp_path / "study", recorded)
    args = ["report", "--storage", "v1.journal", "--study-name", "short", "-o", "r.yaml"]
    refused = _scalertune(*args, cwd=tmp_path / "study")
    assert refused.returncode == 2, refused.stderr
    said = refused.stderr.strip()
    assert "\n" not in said and "Traceback" not in said
    assert f"--artifact-dir {outside}" in said and "outside the folder" in said
    assert os.listdir(outside) == [] and not (tmp_path / "study" / "r.yaml").exists()
    named = _scalertune(*args, "--artifact-dir", str(outside), cwd=tmp_path / "study")
    assert named.returncode == 0, named.stderr
    assert os.listdir(outside)  # the pictures, where the user said


def test_the_dashboard_refuses_a_store_outside_the_storage_folder_before_it_serves(tmp_path):
    from scalertune._review._dashboard import have_dashboard

    if not have_dashboard():
        pytest.skip("optuna-dashboard is not installed")
    (tmp_path / "study").mkdir()
    outside = tmp_path / "etc"
    outside.mkdir()
    _v1_study(tmp_path / "study", str(outside))
    args = ["dashboard", "--storage", "v1.journal", "--port", "1"]
    refused = _scalertune(*args, cwd=tmp_path / "study")
    assert refused.returncode == 2, refused.stderr
    (said,) = refused.stderr.strip().splitlines()
    assert f"--artifact-dir {outside}" in said and "Traceback" not in refused.stderr
    assert refused.stdout == ""  # no server announced that will not start


def test_a_search_resuming_a_study_whose_store_lies_outside_its_folder_refuses(tmp_path):
    """The stored old study, resumed by the search it was made with (its factory copied
    beside it), after its record was pointed outside: one line, exit 2, nothing there."""
    (tmp_path / "study" / "tests").mkdir(parents=True)
    shutil.copy(os.path.join(HERE, "workloads.py"), tmp_path / "study" / "tests")
    outside = tmp_path / "etc"
    outside.mkdir()
    _v1_study(tmp_path / "study", str(outside))
    args = ["search", "tests/workloads.py:healthy", "--storage", "v1.journal"]
    args += ["--study-name", "short", "--steps", "40", "--n-trials", "3", "--device", "cpu"]
    refused = _scalertune(*args, cwd=tmp_path / "study")
    assert refused.returncode == 2, refused.stderr
    (said,) = refused.stderr.strip().splitlines()
    assert f"pass --artifact-dir {outside} to use it" in said
    assert os.listdir(outside) == []


def test_a_search_refuses_the_recorded_store_outside_the_folder_unless_named(tmp_path):
    outside = str(tmp_path / "etc")
    (tmp_path / "study").mkdir()
    journal = tmp_path / "study" / "s.log"
    study = _study(journal)
    study.set_user_attr(ARTIFACT_DIR_ATTR, outside)
    with pytest.raises(UsageError, match="pass --artifact-dir .*etc to use it"):
        settle_location(study, given=None, default=default_location(str(journal)))
    assert settle_location(study, given=outside, default="unused") == outside
    assert location_of(study, outside) == outside


def test_a_store_inside_the_storage_folder_is_recorded_relative_to_it(tmp_path):
    journal = tmp_path / "s.log"
    study = _study(journal)
    settle_location(study, given=None, default=default_location(str(journal)))
    assert study.user_attrs[ARTIFACT_DIR_ATTR] == DEFAULT_ARTIFACT_DIR
    assert location_of(study) == str(tmp_path / DEFAULT_ARTIFACT_DIR)
    inside = str(tmp_path / "deep" / "store")
    other = _study(tmp_path / "o.db")
    settle_location(other, given=inside, default="unused")
    assert other.user_attrs[ARTIFACT_DIR_ATTR] == os.path.join("deep", "store")
    assert location_of(other) == inside


def test_an_old_study_that_recorded_its_store_absolute_still_reads_it(tmp_path):
    study = _study(tmp_path / "s.db")
    study.set_user_attr(ARTIFACT_DIR_ATTR, str(tmp_path / DEFAULT_ARTIFACT_DIR))
    assert location_of(study) == str(tmp_path / DEFAULT_ARTIFACT_DIR)
    assert settle_location(study, given=None, default="unused") == str(
        tmp_path / DEFAULT_ARTIFACT_DIR
    )


@pytest.mark.parametrize("kind", ["s.log", "s.db"])
def test_a_copied_study_folder_reads_and_writes_its_own_checkpoints(tmp_path, kind):
    """A real checkpoint stored beside a journal or SQLite file; the folder copied and the
    original's store removed: the copy finds its own checkpoint, and what it writes goes to
    its own store, not the original's."""
    from test_storage import _saved

    from scalertune._storage._checkpoints import StoredCheckpoint
    from scalertune._storage._store import Store

    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    study = _study(original / kind)
    location = settle_location(study, given=None, default=default_location(str(original / kind)))
    stored, _ = _saved(location)
    shutil.copytree(original, copy)
    shutil.rmtree(original / DEFAULT_ARTIFACT_DIR)
    copied = Store(location_of(_study(copy / kind)))
    assert copied.location == str(copy / DEFAULT_ARTIFACT_DIR)
    StoredCheckpoint(copied, stored.name).fetch_checked()  # whole, checked, from the copy
    new = StoredCheckpoint(copied, "new.pt")
    path = new.local_path()
    shutil.copy(__file__, path)
    new.publish(path, step=0)
    assert (copy / DEFAULT_ARTIFACT_DIR / "new.pt").exists()
    assert not (original / DEFAULT_ARTIFACT_DIR).exists()


def test_an_old_study_copied_from_elsewhere_uses_the_store_beside_it_and_says_so(tmp_path):
    """``tests/data/study_v1.journal`` recorded ``/tmp/scalertune-study/scalertune-artifacts``
    where it was made: copied here, its pictures go beside the copy, said in one line."""
    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), tmp_path / "v1.journal")
    recorded = load_existing_study(str(tmp_path / "v1.journal"), "short").user_attrs[
        ARTIFACT_DIR_ATTR
    ]
    assert recorded == "/tmp/scalertune-study/scalertune-artifacts"
    there = os.listdir(recorded) if os.path.isdir(recorded) else None
    args = ["report", "--storage", "v1.journal", "--study-name", "short", "-o", "r.yaml"]
    done = _scalertune(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path / DEFAULT_ARTIFACT_DIR} is used" in done.stderr
    assert os.listdir(tmp_path / DEFAULT_ARTIFACT_DIR)
    assert (os.listdir(recorded) if os.path.isdir(recorded) else None) == there


def test_a_store_folder_that_is_a_link_out_of_the_storage_folder_is_used_only_when_named(
    tmp_path,
):
    """Whoever can write the storage file's folder can leave a link in the store's place
    (``scalertune-artifacts`` -> ``/etc``): the store is judged where it really is, so
    ``report -o`` refuses in one line, exit 2, writing nothing there, and a fresh study
    refuses it too (a search leaving no empty study behind); named with ``--artifact-dir``,
    it is used."""
    (tmp_path / "study").mkdir()
    outside = tmp_path / "etc"
    outside.mkdir()
    _v1_study(tmp_path / "study", DEFAULT_ARTIFACT_DIR)
    os.symlink(outside, tmp_path / "study" / DEFAULT_ARTIFACT_DIR)
    args = ["report", "--storage", "v1.journal", "--study-name", "short", "-o", "r.yaml"]
    refused = _scalertune(*args, cwd=tmp_path / "study")
    assert refused.returncode == 2, refused.stderr
    said = refused.stderr.strip()
    assert "\n" not in said and "Traceback" not in said
    assert f"a link to {outside}, outside the folder of its storage file" in said
    assert os.listdir(outside) == [] and not (tmp_path / "study" / "r.yaml").exists()
    store = str(tmp_path / "study" / DEFAULT_ARTIFACT_DIR)
    journal = tmp_path / "study" / "new.log"
    fresh = _study(journal)
    with pytest.raises(UsageError, match=f"would keep its artifact store at {store}, a link"):
        settle_location(fresh, given=None, default=default_location(str(journal)))
    assert ARTIFACT_DIR_ATTR not in fresh.user_attrs
    searched = str(tmp_path / "study" / "searched.log")
    with pytest.raises(UsageError, match=f"would keep its artifact store at {store}, a link"):
        scalertune.search(spec("healthy"), storage=searched, device="cpu", study_name="new")
    assert optuna.get_all_study_names(open_storage(searched)) == []  # no empty study left
    named = _scalertune(*args, "--artifact-dir", store, cwd=tmp_path / "study")
    assert named.returncode == 0, named.stderr
    assert os.listdir(outside)  # the pictures, where the user said
