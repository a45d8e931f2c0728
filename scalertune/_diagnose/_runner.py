"""Real training steps under hooks, on fresh workloads from the same seed, counted as GradScaler
counts them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._scaler import DeviceStep
from scalertune._diagnose._hooks import _Hooks, _row, _sample
from scalertune._diagnose._report import ModuleReport, TensorStats, _Run
from scalertune._errors import UsageError
from scalertune._frameworks._deepspeed import refuse_deepspeed
from scalertune._run._loop import loss_function
from scalertune._workload._contract import Workload, to_device
from scalertune._workload._deepspeed import engine_facts
from scalertune._workload._factory import build_workload
from scalertune._workload._loader import one_line


class _Runner:
    """Runs configs on fresh workloads of one factory, seed and device."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        steps: int,
        seed: int,
        device: torch.device,
        watch_from: int = 0,
    ) -> None:
        self.factory, self.steps, self.seed, self.device = factory, steps, seed, device
        self.watch_from = watch_from
        self.float32_grads: dict[str, torch.Tensor] | None = None

    def __call__(
        self,
        config: AmpConfig,
        *,
        table: dict[str, ModuleReport] | None = None,
        grads: bool = False,
        hooks: bool = True,
        repair: bool = False,
    ) -> _Run:
        """Train ``steps`` steps under ``config``. ``table`` collects per-module statistics
        (with the activation gradients when ``grads``); ``repair`` recomputes, in float32,
        the output of a culprit without submodules, so that one pass finds the next one."""
        workload = build_workload(self.factory, seed=self.seed, device=self.device)
        if engine_facts(workload) is not None:
            refuse_deepspeed("a DeepSpeed workload", "diagnose")
        if config.clip_norm is None and workload.clip_norm is not None:
            config = dataclasses.replace(config, clip_norm=workload.clip_norm)
        model = workload.model
        record = _Run(config, self.steps, [n for n, _ in model.named_modules()])
        amp = _WatchedRuntime(config, self.device, workload, record, table)
        amp.prepare(model)
        watch: _Hooks | None = None
        batches = _cycle(workload.batches)
        model.train()
        try:
            for i in range(self.steps):
                if i == self.watch_from and hooks:
                    watch = _Hooks(
                        model,
                        config.dtype,
                        record,
                        table,
                        grads=grads,
                        repair=repair,
                        device_type=self.device.type,
                    )
                batch = to_device(next(batches), self.device)
                if workload.step is not None:
                    workload.step(model, batch, amp)
                else:
                    amp.train_step(model, workload.optimizer, loss_function(workload), batch)
        finally:
            amp.close()
            if watch is not None:
                watch.remove()
        if config.dtype == "float32":
            self.float32_grads = record.first_grads
        elif (
            config.dtype == "float16"
            and self.float32_grads is not None
            and record.first_grads_finite
        ):
            record.flushed = _flushed(record.first_grads, self.float32_grads)
        return record


class _WatchedRuntime(AmpRuntime):
    """The real runtime, reading what GradScaler decides at each step.

    Before ``unscale_`` it reads the parameter gradients the scaled backward produced; an
    optimizer step hook counts the steps that really happened, so a step GradScaler skipped is
    one the optimizer never took: a count of what PyTorch did, not an inference from the
    scale.
    """

    def __init__(
        self,
        config: AmpConfig,
        device: torch.device,
        workload: Workload,
        record: _Run,
        table: dict[str, ModuleReport] | None,
    ) -> None:
        super().__init__(config, device=device)
        self._record, self._table = record, table
        self._modules = list(workload.model.named_modules())
        self._taken = 0
        self._bad_loss = False
        self._hook = workload.optimizer.register_step_post_hook(self._count)

    def _count(self, *_: Any) -> None:
        self._taken += 1

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            self._bad_loss = True
            self._record.first_bad = self._record.first_bad or "its loss"
        super().backward(loss, **kwargs)

    def step(self, optimizer: torch.optim.Optimizer) -> bool | DeviceStep:
        self._read_gradients()
        taken = self._taken
        stepped = super().step(optimizer)
        self._record.skipped += self._taken == taken
        self._record.bad_loss_steps += self._bad_loss
        self._bad_loss = False
        return stepped

    def _read_gradients(self) -> None:
        first = self.steps == 0
        seen: set[int] = set()
        for name, module in self._modules:
            for pname, p in module.named_parameters(recurse=False):
                if p.grad is None or id(p) in seen:
                    continue
                seen.add(id(p))
                if not bool(torch.isfinite(p.grad).all()):
                    self._record.grads_nonfinite = True
                    self._record.first_bad = self._record.first_bad or "its parameter gradients"
                    self._record.first_grads_finite &= not first
                if self._table is not None:
                    _row(self._table, name, module).params.setdefault(
                        self.config.dtype, TensorStats()
                    ).add(p.grad)
                if first:
                    self._record.first_grads[f"{name}.{pname}"] = _sample(p.grad)

    def close(self) -> None:
        self._hook.remove()


def _attempt(run: _Runner, config: AmpConfig, **kwargs: Any) -> _Run:
    try:
        return run(config, **kwargs)
    except UsageError:
        raise
    except Exception as exc:  # the user's model or step, under this dtype
        raise TrainingFailed(
            f"{config.dtype} training of the workload raised {one_line(exc)}: there is "
            f"nothing to diagnose in {config.dtype} on this device"
        ) from exc


def _flushed(float16: dict[str, torch.Tensor], float32: dict[str, torch.Tensor]) -> float | None:
    """Share of the gradient values nonzero in float32 that are exactly zero in float16."""
    lost = kept = 0
    for key, g32 in float32.items():
        g16 = float16.get(key)
        if g16 is None or g16.shape != g32.shape:
            continue
        nonzero = g32 != 0
        kept += int(nonzero.sum())
        lost += int((nonzero & (g16 == 0)).sum())
    return lost / kept if kept else None


def _of_module(grads: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    prefix = f"{name}."
    return {k: v for k, v in grads.items() if k.startswith(prefix) and "." not in k[len(prefix) :]}


def _cycle(batches: Any) -> Iterator[Any]:
    while True:
        yield from batches


_FLOAT32 = AmpConfig(dtype="float32")


class TrainingFailed(Exception):
    """The workload raised while diagnose trained it: there is nothing to diagnose in that
    dtype (``nn.LSTM`` under CPU float16 autocast, say). The message says which and why."""
