"""Host memory: the peak resident memory of a search against one training run of the model.

Each is measured in its own process (the peak of a process only grows), on a 25M-parameter
model: one float32 run of the search's steps, then a whole search of the same model. A search
trains run after run; what matters is that memory does not grow with every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FACTORY = f"{os.path.join(HERE, 'models.py')}:large"
STEPS, N_TRIALS = 40, 4

_ONE_RUN = f"""
import resource, sys, torch
sys.path.insert(0, {HERE!r})
import models
from scalertune import AmpConfig
from scalertune._run._loop import run_config
run_config(models.large, AmpConfig(dtype="float32"), steps={STEPS}, seed=0,
           device=torch.device("cpu"))
"""


def _peak_mib(cmd: list[str], cwd: str) -> float:
    """Peak resident memory (MiB) of the process ``cmd`` runs."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(err)
    return usage.ru_maxrss / 1024  # Linux reports KiB


def measure() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        one = _peak_mib([sys.executable, "-c", _ONE_RUN], folder)
        search = _peak_mib(
            [
                sys.executable,
                "-m",
                "scalertune",
                "search",
                FACTORY,
                "--storage",
                f"sqlite:///{folder}/m.db",
                "--steps",
                str(STEPS),
                "--n-trials",
                str(N_TRIALS),
                "--device",
                "cpu",
                "-q",
                "-o",
                os.path.join(folder, "m.yaml"),
            ],
            folder,
        )
    return {"one_run_mib": one, "search_mib": search, "ratio": search / one}


if __name__ == "__main__":
    print(measure())
