"""What scalertune adds for optuna-dashboard: pictures, rounding for reading, the commands.

The dashboard itself, served and rendered in a browser, is tested in test_browser.py.
"""

import math

import optuna
from conftest import run_cli

from scalertune._text import readable


def test_readable_rounds_floats_for_reading_and_leaves_the_rest():
    assert readable(0.0030449795900123) == 0.003045
    assert readable({"min_scale": 0.001953125, "skipped_steps": 25, "role": "search",
                     "steps_to_target": None, "loss_vs_float32": math.inf}) == {
        "min_scale": 0.001953, "skipped_steps": 25, "role": "search",
        "steps_to_target": None, "loss_vs_float32": math.inf}
    assert readable([12345.678, True]) == [12350.0, True]


def test_dashboard_without_the_study_database_is_a_usage_error(tmp_path):
    proc = run_cli("dashboard", "--storage", f"sqlite:///{tmp_path / 'none.db'}", cwd=tmp_path)
    assert proc.returncode == 2 and "no such database" in proc.stderr


def test_dashboard_on_a_storage_without_studies_is_a_usage_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.storages.RDBStorage(url).remove_session()
    proc = run_cli("dashboard", "--storage", url, cwd=tmp_path)
    assert proc.returncode == 2 and "holds no study" in proc.stderr, proc.stderr
