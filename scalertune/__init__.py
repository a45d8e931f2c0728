"""scalertune: find the mixed-precision settings that will not NaN on you, and train fastest.

The pipeline, one private subpackage per stage (each ``__init__`` lists its modules):

- ``_workload``: load the user's factory and check what it returns (:class:`Workload`);
- ``_amp``: the canonical AMP step (:class:`AmpRuntime`) and the result YAML, used by trials
  and by training code (:func:`load`, with its guard and watch); never imports Optuna;
- ``_frameworks``: a Hugging Face, Lightning or Accelerate trainer under a runtime
  (:func:`attach`), for training and for the search's trainer workloads;
- ``_run``: run one config and watch it for non-finite values; the step timing, the
  checkpoints and the gradient trace;
- ``_replay``: GradScaler's (and DeepSpeed's) update rule replayed over a trace;
- ``_judge``: the float32 reference (one typed record) and target, outcomes, ranking, stop
  rules, the phases of the horizon; what a study shows and the rules that choose the answer
  (:func:`~scalertune._judge._answer.judge`, which the search asks what to run next);
- ``_storage``: the Optuna storage a study lives in, and recovery after a worker dies;
- ``_search``: :func:`search`, the whole pipeline, with its space and sampler;
- ``_diagnose``: :func:`diagnose`, where float16 overflows or underflows, module by module;
- ``_review``: :class:`SearchResult`, the judge's findings shown: the summary, the pictures,
  the YAML, the dashboard's notes;
- ``_export``: :func:`export`, the config as the objects each training framework takes;
- ``_train``: :func:`load` and :func:`attach`, the result file into training code, the run's
  record into its study;
- ``cli`` (with ``_cli``): the ``scalertune`` command.

This module only names the public API, each name imported on first use.

A policy number lives in the ``_policy`` of the stage that reads it, or in ``_policy`` when
several stages do; the range check of a number a user passes is in ``_limits``.
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalertune._amp._check import AmpCheckError, AmpCheckWarning, CheckPolicy
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._guard import AmpGuardError, Guard
    from scalertune._amp._runtime import AmpRuntime
    from scalertune._amp._schema import load_config
    from scalertune._amp._watch import AmpDriftWarning
    from scalertune._diagnose._api import diagnose
    from scalertune._diagnose._report import (
        Diagnosis,
        ModuleReport,
        ScalerCheck,
        TensorStats,
    )
    from scalertune._errors import SearchError, StorageUnavailable, UsageError
    from scalertune._export._api import FRAMEWORKS, Export, export
    from scalertune._judge._outcome import Outcome
    from scalertune._judge._settings import StudySettings
    from scalertune._judge._speedup import Speedup
    from scalertune._judge._target import Target
    from scalertune._review._analyze import analyze
    from scalertune._review._result import SearchResult
    from scalertune._run._step_times import StepTimes
    from scalertune._search._api import search
    from scalertune._search._options import Isolation
    from scalertune._search._space import SearchSpace
    from scalertune._train._entry import attach, load
    from scalertune._workload._contract import Workload
    from scalertune._workload._lightning import lightning_workload

#: Public name -> the module defining it, imported on first use: the command line answers
#: --help, a bad option or Ctrl-C before torch has loaded (a second or more).
_EXPORTS = {
    "AmpConfig": "_amp._config",
    "AmpCheckError": "_amp._check",
    "AmpCheckWarning": "_amp._check",
    "CheckPolicy": "_amp._check",
    "Guard": "_amp._guard",
    "Diagnosis": "_diagnose._report",
    "ModuleReport": "_diagnose._report",
    "ScalerCheck": "_diagnose._report",
    "TensorStats": "_diagnose._report",
    "diagnose": "_diagnose._api",
    "UsageError": "_errors",
    "FRAMEWORKS": "_export._api",
    "Export": "_export._api",
    "export": "_export._api",
    "lightning_workload": "_workload._lightning",
    "Speedup": "_judge._speedup",
    "Target": "_judge._target",
    "Outcome": "_judge._outcome",
    "StudySettings": "_judge._settings",
    "SearchResult": "_review._result",
    "analyze": "_review._analyze",
    "AmpGuardError": "_amp._guard",
    "AmpRuntime": "_amp._runtime",
    "AmpDriftWarning": "_amp._watch",
    "load_config": "_amp._schema",
    "Isolation": "_search._options",
    "SearchError": "_errors",
    "search": "_search._api",
    "SearchSpace": "_search._space",
    "StorageUnavailable": "_errors",
    "StepTimes": "_run._step_times",
    "Workload": "_workload._contract",
    "load": "_train._entry",
    "attach": "_train._entry",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'scalertune' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"scalertune.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


try:
    __version__ = _metadata.version("scalertune")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"


__all__ = [
    "FRAMEWORKS",
    "AmpCheckError",
    "AmpCheckWarning",
    "AmpConfig",
    "AmpDriftWarning",
    "AmpGuardError",
    "AmpRuntime",
    "CheckPolicy",
    "Diagnosis",
    "Export",
    "Guard",
    "Isolation",
    "ModuleReport",
    "Outcome",
    "SearchError",
    "SearchResult",
    "SearchSpace",
    "ScalerCheck",
    "Speedup",
    "StepTimes",
    "StorageUnavailable",
    "StudySettings",
    "Target",
    "TensorStats",
    "UsageError",
    "Workload",
    "analyze",
    "attach",
    "diagnose",
    "export",
    "lightning_workload",
    "load",
    "load_config",
    "search",
]
