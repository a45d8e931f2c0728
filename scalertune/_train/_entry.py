"""The result file taken into training code: :func:`load` (a runtime for your loop) and
:func:`attach` (a trainer under one), each sending the run's record (the in-run check's
checks and actions) to the study the file came from."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalertune._amp._check import CheckPolicy
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._runtime import AmpRuntime


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
            ``best_amp=True`` on a file without ``evidence.best_amp``, ``device`` names a
            device this machine does not have (the command line exits with status 2), or the
            answer is a DeepSpeed ``fp16`` block (export it into ``ds_config.json``, or
            :func:`attach` it to a DeepSpeed Trainer).

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
    from scalertune._amp._config import DeepSpeedFp16Config

    if isinstance(amp.config, DeepSpeedFp16Config):
        from scalertune._frameworks._deepspeed import refuse_deepspeed

        what = "best AMP config" if best_amp else "answer"
        flag = " --best-amp" if best_amp else ""
        refuse_deepspeed(f"{os.fspath(path)}'s {what}", "load", path=os.fspath(path), flag=flag)
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

    A Trainer made with ``deepspeed=`` trains in DeepSpeed's engine under DeepSpeed's own
    loss scaler: the YAML's ``fp16`` block (as a search of that Trainer found it), ``bf16``
    and ``gradient_clipping`` go into its DeepSpeed config before ``train()`` makes the
    engine, float16 is allowed on a CPU, and the runtime is bound to the engine, so that its
    ``skipped_steps`` and ``scale`` are DeepSpeed's own and the watch follows them (the
    guard is DeepSpeed's: it raises at ``min_loss_scale``). The in-run check is left out
    there: the engine casts the model itself to float16 and keeps float32 master weights in
    its optimizer, so a float32 forward at the model's weights is no float32 check (silently
    by default; where ``check=`` asks for one, one :class:`AmpCheckWarning` line says so).

    The runtime's ``skipped_steps``, ``steps`` and ``scaler.get_scale()`` read what the
    framework did.

    Args:
        trainer: A Hugging Face ``transformers.Trainer`` (any subclass: TRL's, one with its
            own ``compute_loss``; one made with ``deepspeed=`` too) before ``train()``, a
            Lightning ``Trainer`` before ``fit()``, or an Accelerate ``Accelerator`` before
            ``prepare()``.
        config: The result YAML a search wrote, an :class:`AmpConfig`, or an
            :class:`AmpRuntime` built already (for a DeepSpeed Trainer, a DeepSpeed answer:
            the YAML of a search of that Trainer, or a ``DeepSpeedFp16Config``).
        guard: ``False`` leaves out the guard the YAML recommends (a YAML only).
        watch: ``False`` leaves out the watch on the scaler's predicted course (a YAML
            only).
        best_amp: ``True`` takes the YAML's best AMP config that held instead of its answer
            (for a GPU, when the search ran where float32 was faster).
        check: ``False`` leaves the in-run check out; ``"act"``, ``"warn"`` or ``"stop"``
            (or a :class:`CheckPolicy`) overrides the YAML's action; ``None`` keeps it (a
            DeepSpeed Trainer is not checked, see above).
        storage: Where the run's record goes, as for :func:`load` (only when ``config`` is a
            YAML path).

    Returns:
        The :class:`AmpRuntime` the framework now calls.

    Raises:
        UsageError: A trainer the runtime cannot drive (an Accelerator or a Lightning Trainer
            running DeepSpeed, FSDP, a model loaded in half precision, a trainer already
            trained or prepared, an object of no supported framework, a DeepSpeed Trainer
            given an answer searched outside DeepSpeed or a runtime with an in-run check), a
            framework release outside the bounds scalertune was checked with, a YAML that is
            missing or malformed, ``best_amp=True`` with a config that is not a YAML, or a
            runtime built for another device than the trainer's; the message says why.

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
    from scalertune._inrun._checker import InRunCheck

    check = amp.check
    if not isinstance(check, InRunCheck) or storage is False:
        return
    from scalertune._storage._run_log import RunLog, study_of

    if check.origin is None:
        return
    path = os.fspath(path)
    where = study_of(check.origin, path, storage if isinstance(storage, str) else None)
    if where is not None:
        log = RunLog(*where, yaml=os.path.abspath(path), device=str(amp.device))
        run = weakref.ref(amp)
        log.final = lambda: check.summary(a) if (a := run()) is not None else None
        check.sink = log
