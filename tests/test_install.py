"""A plain, non-editable install ships the search spaces: they load by name outside the checkout."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def test_shipped_spaces_load_by_name_after_a_non_editable_install(tmp_path):
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-cache-dir",
         "--target", str(target), ROOT],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    assert (target / "scalertune" / "search_spaces" / "default.yaml").is_file()
    code = ("import scalertune, sys; from scalertune import SearchSpace; "
            "print(scalertune.__file__); "
            "print(sorted(SearchSpace.load(n).name for n in ('default', 'float16', 'bfloat16')))")
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    installed_at, names = run.stdout.strip().splitlines()
    assert installed_at.startswith(str(target))
    assert names == "['bfloat16', 'default', 'float16']"
