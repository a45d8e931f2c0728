"""scalertune: find the mixed-precision settings that will not NaN on you, and train fastest.

The pipeline, one module per stage:

- ``_workload``: load the user's factory and check what it returns (:class:`Workload`);
- ``_space``: the search space (:class:`SearchSpace`);
- ``_runtime``: the canonical AMP step (:class:`AmpRuntime`), used by trials and training code;
- ``_run``: run one config and watch it for non-finite values;
- ``_judge``: the float32 target, time to target, the verdict;
- ``_rank``: ranking and confirmation;
- ``_study``: the Optuna study that stores it all;
- ``_search``: :func:`search`, the whole pipeline;
- ``_diagnose``: :func:`diagnose`, where float16 overflows or underflows, module by module;
- ``_result``: :class:`SearchResult`, the YAML file and :func:`load`;
- ``_export``: :func:`export`, the config as the objects each training framework takes;
- ``_frameworks``: :func:`lightning_workload`, searching a LightningModule as it is.
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._guard import AmpGuardError, Guard
    from scalertune._amp._runtime import AmpRuntime
    from scalertune._amp._schema import load_config
    from scalertune._diagnose._api import diagnose
    from scalertune._diagnose._report import Diagnosis, ModuleReport, ScalerCheck, TensorStats
    from scalertune._errors import SearchError, UsageError
    from scalertune._export._api import FRAMEWORKS, Export, export
    from scalertune._judge._outcome import Outcome
    from scalertune._judge._speedup import Speedup
    from scalertune._judge._target import Target
    from scalertune._review._result import SearchResult, analyze
    from scalertune._run._timing import StepTimes
    from scalertune._search._api import Isolation, search
    from scalertune._search._space import SearchSpace
    from scalertune._workload._contract import Workload
    from scalertune._workload._lightning import lightning_workload

#: Public name -> the module defining it, imported on first use: the command line answers
#: --help, a bad option or Ctrl-C before torch has loaded (a second or more).
_EXPORTS = {
    "AmpConfig": "_amp._config", "Guard": "_amp._guard",
    "Diagnosis": "_diagnose._report", "ModuleReport": "_diagnose._report", "ScalerCheck": "_diagnose._report",
    "TensorStats": "_diagnose._report", "diagnose": "_diagnose._api",
    "UsageError": "_errors",
    "FRAMEWORKS": "_export._api", "Export": "_export._api", "export": "_export._api",
    "lightning_workload": "_workload._lightning",
    "Speedup": "_judge._speedup", "Target": "_judge._target",
    "Outcome": "_judge._outcome",
    "SearchResult": "_review._result", "analyze": "_review._result",
    "AmpGuardError": "_amp._guard", "AmpRuntime": "_amp._runtime",
    "load_config": "_amp._schema",
    "Isolation": "_search._api", "SearchError": "_errors", "search": "_search._api",
    "SearchSpace": "_search._space",
    "StepTimes": "_run._timing",
    "Workload": "_workload._contract",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'scalertune' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"scalertune.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


try:
    __version__ = _metadata.version("scalertune")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"


def load(path: str, *, device: str = "auto", guard: bool = True) -> "AmpRuntime":
    """The runtime for the config in a result YAML: GradScaler, autocast and clipping,
    float32 islands, and the guard the YAML recommends (``guard=False`` turns it off).

    Example:
        >>> import scalertune
        >>> amp = scalertune.load("codepoints.yaml", device="cuda")  # doctest: +SKIP
        >>> with amp.autocast():  # doctest: +SKIP
        ...     loss = loss_fn(model(x), y)
        >>> amp.backward(loss)  # doctest: +SKIP
        >>> amp.step(optimizer)  # doctest: +SKIP
    """
    from scalertune._amp._runtime import AmpRuntime

    return AmpRuntime.from_yaml(path, device=device, guard=guard)


__all__ = [
    "FRAMEWORKS", "AmpConfig", "AmpGuardError", "AmpRuntime", "Diagnosis", "Export", "Guard",
    "Isolation", "ModuleReport", "Outcome", "SearchError", "SearchResult", "SearchSpace",
    "ScalerCheck", "Speedup", "StepTimes", "Target", "TensorStats", "UsageError", "Workload", "analyze",
    "diagnose", "export",
    "lightning_workload", "load", "load_config", "search",
]
