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
- ``_judge``: the float32 target, outcomes, ranking, stop rules, the phases of the horizon;
- ``_storage``: the Optuna storage a study lives in, and recovery after a worker dies;
- ``_search``: :func:`search`, the whole pipeline, with its space and sampler;
- ``_diagnose``: :func:`diagnose`, where float16 overflows or underflows, module by module;
- ``_review``: :class:`SearchResult`, the summary, the pictures, the dashboard's notes;
- ``_export``: :func:`export`, the config as the objects each training framework takes;
- ``cli`` (with ``_cli``): the ``scalertune`` command.

A policy number lives in the ``_policy`` of the stage that reads it, or in ``_policy`` when
several stages do; the range check of a number a user passes is in ``_limits``.
"""

from __future__ import annotations

import importlib
import os
import weakref
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
    from scalertune._search._setup import Isolation
    from scalertune._search._space import SearchSpace
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
    "Isolation": "_search._api",
    "SearchError": "_errors",
    "search": "_search._api",
    "SearchSpace": "_search._space",
    "StorageUnavailable": "_errors",
    "StepTimes": "_run._step_times",
    "Workload": "_workload._contract",
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


def load(
    path: str | os.PathLike[str],
    *,
    device: str = "auto",
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
    check: bool | str | CheckPolicy | None = None,
    storage: str | bool | None = None,
) -> AmpRuntime:
    """Build the runtime that trains with the config a search wrote to ``path``.

    The runtime holds the GradScaler, the autocast context and the clipping of the YAML's
    ``config`` block, applies its float32 islands to the model you :meth:`AmpRuntime.prepare`,
    and adds what keeps a long run honest:

    - the guard the YAML recommends: :class:`AmpGuardError` when the loss scale collapses;
    - a watch that warns once (:class:`AmpDriftWarning`) when the scaler leaves the search's
      prediction;
    - the in-run check: every ``every`` steps of the YAML's ``check`` block (100 by default)
      the step's loss is computed again in float32 at the run's current weights, forward only,
      and compared with the AMP loss by the horizon's rule. When the precision fails, the
      forward overflows, or the scaler leaves the search's prediction, the runtime acts by the
      block's ``action`` (``act``: a float32 island, float32, the scaler's knobs from a replay
      of the run's own gradients; ``warn``; ``stop``), one :class:`AmpCheckWarning` line each.
      It runs where the runtime sees the loss: :meth:`AmpRuntime.train_step`, or
      :meth:`AmpRuntime.loss` in a loop of your own; :meth:`AmpRuntime.report` prints what it
      did.

    The run's record goes, in the background, to the study the YAML came from (when that
    storage can be reached), so ``scalertune report`` and the dashboard show it beside the
    search.

    Args:
        path: A result YAML that ``scalertune search`` (or :meth:`SearchResult.to_yaml`)
            wrote.
        device: Where training runs: ``"auto"`` (CUDA when this machine has it, else the
            CPU), ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        guard: ``False`` leaves out the guard the YAML recommends.
        watch: ``False`` leaves out the watch on the scaler's predicted course.
        best_amp: ``True`` loads the best AMP config that held (``evidence.best_amp``)
            instead of the answer: a search on a CPU answers float32, where AMP steps are
            slower; on a GPU, use this (or run the search there).
        check: ``False`` turns the in-run check off; ``"act"``, ``"warn"`` or ``"stop"`` (or
            a :class:`CheckPolicy`) overrides the YAML's ``check`` block; ``None`` (the
            default) keeps it. A float32 config has nothing to check against and runs none.
        storage: Where the run's record goes: ``None`` (the default) is the YAML's
            ``evidence.storage``; a storage URL replaces it (for one whose password the YAML
            hides); ``False`` records nothing.

    Returns:
        The :class:`AmpRuntime` to train with.

    Raises:
        UsageError: ``path`` is missing or is not a result file, a block of it is malformed,
            ``best_amp=True`` on a file without ``evidence.best_amp``, or ``device`` names a
            device this machine does not have (the command line exits with status 2).

    Example:
        >>> import pathlib, tempfile, torch, scalertune
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "amp.yaml"
        >>> _ = path.write_text("config: {dtype: bfloat16, clip_norm: 1.0}\\n")
        >>> amp = scalertune.load(path, device="cpu", check=False)
        >>> amp.config.describe()
        'bfloat16, clip 1'
        >>> model = amp.prepare(torch.nn.Linear(4, 1))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
        >>> loss = amp.loss(lambda: torch.nn.functional.mse_loss(model(x), y))
        >>> amp.backward(loss)
        >>> amp.step(optimizer)
        True
    """
    from scalertune._inrun._build import runtime_from_yaml

    amp = runtime_from_yaml(
        path, device=device, guard=guard, watch=watch, best_amp=best_amp, check=check
    )
    _record_in_study(amp, path, storage)
    return amp


def attach(
    trainer: Any,
    config: str | os.PathLike[str] | AmpConfig | AmpRuntime,
    *,
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
    check: bool | str | CheckPolicy | None = None,
    storage: str | bool | None = None,
) -> AmpRuntime:
    """Train ``trainer`` under the config a search chose; returns the runtime that does it.

    The training that follows runs:

    - the config's dtype under autocast, on a CPU as on a GPU, whatever ``fp16``, ``bf16``
      or ``precision`` the trainer was given (a float16 config trains in float16 on a CPU);
    - a GradScaler with exactly the config's ``init_scale``, ``growth_factor``,
      ``backoff_factor`` and ``growth_interval``, which the framework itself calls;
    - the config's clipping, as the framework's own, in place of the trainer's
      (``max_grad_norm``, ``gradient_clip_val`` by norm; a config without one turns it off;
      with an Accelerator, ``accelerator.clip_grad_norm_`` in your loop unscales with the
      runtime's scaler first);
    - its float32 islands, and the guard and the watch the YAML recommends, on the steps the
      framework took;
    - the in-run check: every 100 steps the loss of the step's batch again in float32 at the
      run's weights, through the Trainer's ``compute_loss`` or the LightningModule's
      ``training_step`` (its logging held back for that pass); with an Accelerator, hand the
      runtime your loss as ``amp.loss(lambda: loss_fn(model(x), y))``. The run's record
      (checks, actions, the scaler's story) goes to the YAML's study, as with :func:`load`.

    The runtime's ``skipped_steps``, ``steps`` and ``scaler.get_scale()`` read what the
    framework did.

    Args:
        trainer: A Hugging Face ``transformers.Trainer`` (any subclass: TRL's, one with its
            own ``compute_loss``) before ``train()``, a Lightning ``Trainer`` before
            ``fit()``, or an Accelerate ``Accelerator`` before ``prepare()``.
        config: The result YAML a search wrote, an :class:`AmpConfig`, or an
            :class:`AmpRuntime` built already.
        guard: ``False`` leaves out the guard the YAML recommends (a YAML only).
        watch: ``False`` leaves out the watch on the scaler's predicted course (a YAML
            only).
        best_amp: ``True`` takes the YAML's best AMP config that held instead of its answer
            (for a GPU, when the search ran where float32 was faster).
        check: ``False`` leaves the in-run check out; ``"act"``, ``"warn"`` or ``"stop"``
            (or a :class:`CheckPolicy`) overrides the YAML's action; ``None`` keeps it.
        storage: Where the run's record goes, as for :func:`load` (only when ``config`` is a
            YAML path).

    Returns:
        The :class:`AmpRuntime` the framework now calls.

    Raises:
        UsageError: A trainer the runtime cannot drive (DeepSpeed, FSDP, a model loaded in
            half precision, a trainer already trained or prepared, an object of no supported
            framework), a framework release outside the bounds scalertune was checked
            with, a YAML that is missing or malformed, ``best_amp=True`` with a config that
            is not a YAML, or a runtime built for another device than the trainer's; the
            message says why.

    Example:
        >>> import scalertune, transformers  # doctest: +SKIP
        >>> trainer = transformers.Trainer(model=model, args=args,
        ...                                train_dataset=dataset)  # doctest: +SKIP
        >>> amp = scalertune.attach(trainer, "amp.yaml")  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
        >>> amp.skipped_steps, amp.scaler.get_scale()  # doctest: +SKIP
        (0, 4096.0)
    """
    from scalertune._frameworks._attach import attach as attach_runtime

    amp = attach_runtime(trainer, config, guard=guard, watch=watch, best_amp=best_amp, check=check)
    if isinstance(config, (str, os.PathLike)):
        _record_in_study(amp, config, storage)
    return amp


def _record_in_study(
    amp: AmpRuntime, path: str | os.PathLike[str], storage: str | bool | None
) -> None:
    """The run's record to the study ``path`` came from (see :func:`load`)."""
    if amp.check is None or storage is False:
        return
    from scalertune._amp._schema import read_result
    from scalertune._storage._run_log import RunLog, study_of

    path = os.fspath(path)
    where = study_of(read_result(path), path, storage if isinstance(storage, str) else None)
    if where is not None:
        identity = {"yaml": os.path.abspath(path), "device": str(amp.device)}
        log = RunLog(*where, identity=identity)
        run, check = weakref.ref(amp), amp.check
        log.final = lambda: check.summary(a) if (a := run()) is not None else None
        check.sink = log


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
