"""Each framework internal that scalertune relies on, checked against the installed framework:
the modules that list them (``scalertune._frameworks._accelerate_private``,
``_transformers_private``, ``_lightning_private``, ``_deepspeed_private``) do what their
callers expect, each name
and each replaced or overridden method is one the framework has and calls. A new release that
moves one fails here, by name, before a search or a training meets it; ``pyproject.toml``
bounds each framework to the releases this file passed on, and a release outside the bound
(or one without a listed name) is refused in one line naming the releases to install."""

import inspect
import pathlib
import re
import types

import deepspeed_workloads as dsw
import pytest
import tomllib
import torch
import trainers
from torch import nn

import scalertune
from scalertune import _releases
from scalertune._amp._config import DeepSpeedFp16Config
from scalertune._frameworks import (
    _accelerate_private,
    _deepspeed,
    _deepspeed_private,
    _lightning_private,
    _transformers_private,
)

#: How the package spells a private name of Accelerate, transformers or Lightning (those a
#: Trainer made with ``deepspeed=`` relies on from the third line on).
HF_PRIVATE = (
    r"\._models\b|\._optimizers\b|_is_overflow|_set_sync_gradients|_configure_optimizers"
    r"|_configure_schedulers_automatic_opt|_lightning_optimizers"
    r"|deepspeed_plugin|hf_ds_config|deepspeed_engine_wrapped"
    r"|integrations\.deepspeed|DummyScheduler|\.model_wrapped =|\.deepspeed ="
)
#: How it spells one of DeepSpeed's.
DEEPSPEED_PRIVATE = (
    r"(?<!fp16)\.loss_scaler\b|__compatible_ops__|is_fp16_supported =|\bds_id\b|_hp_mapping"
    r"|\.optimizer\.optimizer\b"
)
PRIVATE = re.compile(f"{HF_PRIVATE}|{DEEPSPEED_PRIVATE}")
ROOT = pathlib.Path(scalertune.__file__).parents[1]


def _accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def _prepared():
    accelerator = _accelerator()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator, *accelerator.prepare(model, optimizer)


# --- Accelerate -----------------------------------------------------------------------------


def test_prepared_anything_and_its_optimizers_are_what_prepare_made():
    accelerator = _accelerator()
    _accelerate_private.check(accelerator)  # every listed name there
    assert not _accelerate_private.prepared_anything(accelerator)
    assert _accelerate_private.prepared_optimizers(accelerator) == []
    model = nn.Linear(4, 1)
    accelerator.prepare(model)
    assert _accelerate_private.prepared_anything(accelerator)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    assert _accelerate_private.prepared_optimizers(accelerator) == [optimizer]


def test_a_step_marked_skipped_is_what_step_was_skipped_and_the_accelerator_read():
    accelerator, _, optimizer = _prepared()
    for skipped in (True, False):
        _accelerate_private.set_step_skipped(optimizer, skipped)
        assert optimizer.step_was_skipped is skipped
        assert accelerator.optimizer_step_was_skipped is skipped


def test_the_sync_flag_is_the_one_the_accelerator_and_its_no_sync_read():
    accelerator, model, _ = _prepared()
    for sync in (False, True):
        _accelerate_private.set_sync_gradients(accelerator, sync)
        assert accelerator.sync_gradients is sync
        assert accelerator.gradient_state.sync_gradients is sync


def test_every_replaced_method_is_one_accelerate_itself_calls():
    """Replaced on one Accelerator, each is called by Accelerate's own prepare(), backward
    and clip_grad_norm_: what the runtime puts there is what runs."""
    accelerator = _accelerator()
    called = []
    for name in ("backward", "prepare_model", "prepare_optimizer", "unscale_gradients"):
        original = getattr(accelerator, name)

        def record(*args, _name=name, _original=original, **kwargs):
            called.append(_name)
            return _original(*args, **kwargs)

        setattr(accelerator, name, record)
    model = nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.ones(2, 4)).sum()
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert sorted(set(called)) == sorted(_accelerate_private.REPLACED[:4])


def test_the_replaced_scaler_and_autocast_switch_are_the_ones_prepare_reads():
    """With its autocast switch on, prepare_model puts Accelerate's autocast wrapper on the
    forward; off, as the route sets it, the forward is the model's; prepare_optimizer hands
    the Accelerator's scaler to the optimizer it makes."""
    switched_on, switched_off = _accelerator(), _accelerator()
    switched_on.native_amp, switched_off.native_amp = True, False
    for accelerator, wrapped in ((switched_on, True), (switched_off, False)):
        model = nn.Linear(4, 1)
        forward = model.forward
        assert (accelerator.prepare_model(model).forward != forward) is wrapped
    scaler = torch.amp.GradScaler("cpu")
    switched_off.scaler = scaler
    optimizer = switched_off.prepare_optimizer(torch.optim.SGD(nn.Linear(4, 1).parameters()))
    assert optimizer.scaler is scaler
    assert {"native_amp", "scaler"} == set(_accelerate_private.REPLACED[4:])


def test_a_prepared_optimizers_step_is_the_method_an_lr_scheduler_wraps():
    accelerator, model, optimizer = _prepared()
    assert _accelerate_private.OPTIMIZER_REPLACED == ("step",)
    calls = []
    accelerated = type(optimizer).step

    def step(self, *args, **kwargs):
        calls.append(1)
        return accelerated(self, *args, **kwargs)

    optimizer.step = types.MethodType(step, optimizer)  # a method, as the route sets it
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    before = model.weight.detach().clone()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert calls == [1] and not torch.equal(before, model.weight)


def test_accelerates_own_float8_is_what_prepare_reads_and_set_aside_it_converts_nothing(
    monkeypatch,
):
    """An Accelerator made with mixed_precision="fp8" has float8 handlers (``FP8_SET``) that
    its prepare() reads through ``fp8_backend`` to convert the Linear layers (torchao's own
    skips the first and the last); set aside, prepare() converts none, unless the variable
    it falls back to names a backend."""
    pytest.importorskip("torchao")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from torchao.float8.float8_linear import Float8Linear

    def converted(accelerator):
        model = accelerator.prepare(nn.Sequential(*(nn.Linear(32, 32) for _ in range(4))))
        return [isinstance(m, Float8Linear) for m in model]

    AcceleratorState._reset_state(reset_partial_state=True)  # one Accelerator per process
    try:
        own, set_aside = (Accelerator(cpu=True, mixed_precision="fp8") for _ in range(2))
        assert all(hasattr(own, n) for n in _accelerate_private.FP8_SET)
        _accelerate_private.check(own)
        assert _accelerate_private.fp8_backend(own) == "AO"
        assert converted(own) == [False, True, True, False]
        _accelerate_private.leave_out_fp8(set_aside)
        assert _accelerate_private.fp8_backend(set_aside) == "NO"
        assert converted(set_aside) == [False] * 4
        assert _accelerate_private.fp8_backend(None) == "NO"
        monkeypatch.setenv(_accelerate_private.FP8_BACKEND_VARIABLE, "AO")
        assert _accelerate_private.fp8_backend(None) == "AO"
        assert _accelerate_private.fp8_backend(set_aside) == "AO"  # what prepare() reads then
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


# --- transformers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_trainer():
    return trainers.hf_trainer()


def test_trains_steps_are_methods_train_calls_with_the_arguments_the_search_passes(hf_trainer):
    from transformers import Trainer

    source = inspect.getsource(Trainer)
    for name in _transformers_private.TRAIN_STEPS:
        assert f"self.{name}(" in source, name
    parameters = {
        name: list(inspect.signature(getattr(Trainer, name)).parameters)[1:]
        for name in _transformers_private.TRAIN_STEPS
    }
    assert parameters["set_initial_training_values"][:2] == ["args", "dataloader"]
    assert parameters["create_scheduler"][:2] == ["num_training_steps", "optimizer"]
    assert parameters["get_batch_samples"][:3] == ["epoch_iterator", "num_batches", "device"]
    assert parameters["training_step"][:3] == ["model", "inputs", "num_items_in_batch"]
    loader = hf_trainer.get_train_dataloader()
    max_steps = hf_trainer.set_initial_training_values(hf_trainer.args, loader)[-1]
    assert max_steps == trainers.HF_STEPS
    micro, items = hf_trainer.get_batch_samples(iter(loader), 2, hf_trainer.args.device)
    assert len(micro) == 2 and int(items) > 0


def test_what_the_search_sets_on_a_trainer_is_what_its_steps_read(hf_trainer):
    from transformers import Trainer

    source = inspect.getsource(Trainer.training_step)
    assert "self.current_gradient_accumulation_steps" in source
    assert _transformers_private.SET[0] == "current_gradient_accumulation_steps"
    for path in _transformers_private.SET[1:]:
        owner, _, name = path.rpartition(".")
        assert hasattr(getattr(hf_trainer, owner), name), path
    for name in _transformers_private.READ:
        assert hasattr(hf_trainer, name), name
    owner, _, name = _transformers_private.CALLBACKS.rpartition(".")
    callbacks = getattr(getattr(hf_trainer, owner), name)
    assert isinstance(callbacks, list) and callbacks, callbacks
    assert hf_trainer.is_deepspeed_enabled is False and hf_trainer.is_fsdp_enabled is False


def test_a_trl_trainer_is_checked_against_trls_bound_too(monkeypatch):
    trainer = trainers.sft_trainer()
    _transformers_private.check(trainer)
    monkeypatch.setattr(
        _releases, "_installed", lambda d: "99.0.0" if d == "trl" else _installed(d)
    )
    with pytest.raises(scalertune.UsageError, match=r"pip install 'trl>=0\.19,<1\.17'$"):
        scalertune.attach(trainer, scalertune.AmpConfig())


#: The installed releases, as read before a test pretends another.
_installed = _releases._installed


# --- DeepSpeed ------------------------------------------------------------------------------


def _engine(fp16=None):
    parts = dsw.regression()
    config = {**dsw.CONFIG, "fp16": fp16 or {"enabled": False}}
    return _deepspeed.initialize(parts["model"], parts["optimizer"], config), parts


def test_float16_trains_on_this_cpu_once_allowed():
    from deepspeed.accelerator import get_accelerator

    _deepspeed_private.check()  # every listed name there
    _deepspeed_private.allow_float16()
    assert get_accelerator().is_fp16_supported()
    engine, _ = _engine({"enabled": True})
    assert engine.fp16_enabled() and next(engine.module.parameters()).dtype == torch.float16
    engine.destroy()


def test_a_search_compiles_no_shared_memory_all_reduce():
    import deepspeed.comm.comm as comm
    import deepspeed.ops

    _deepspeed_private.leave_shared_memory_unbuilt()
    assert deepspeed.ops.__compatible_ops__[_deepspeed_private.SHARED_MEMORY_OP] is False
    _deepspeed.process_group()  # as a search's process makes its group
    assert torch.distributed.get_world_size() == 1
    assert comm.cdb is not None and comm.cdb.shm_comm_op is None


def test_zeros_loss_scaler_holds_the_state_the_replay_keeps():
    from scalertune._replay._deepspeed import DeepSpeedScaler, update_deepspeed_scales

    block = {"enabled": True, "initial_scale_power": 20, "hysteresis": 2, "loss_scale_window": 3}
    engine, parts = _engine(block)
    overflows = []
    for i in range(8):
        x, y = parts["batches"][i]
        engine.backward(parts["loss_fn"](engine(x.half()), y))
        engine.step()
        overflows.append(not engine.was_step_applied())
    scales, _ = update_deepspeed_scales(overflows, DeepSpeedScaler.from_fp16_block(block))
    state = _deepspeed_private.scaler_state(engine)
    assert state["scale"] == _deepspeed_private.scale(engine) == scales[-1]
    assert state["iteration"] == 8 and set(state) == set(_deepspeed_private.SCALER_FIELDS)
    assert state["last_overflow"] == max(i for i, o in enumerate(overflows) if o)
    _deepspeed_private.load_scaler_state(engine, {"scale": 8.0, "hysteresis": 1})
    scaler = _deepspeed_private.loss_scaler(engine)
    assert type(scaler).__name__ == "DynamicLossScaler"
    assert (scaler.cur_scale, scaler.cur_hysteresis) == (8.0, 1)
    x, y = parts["batches"][0]  # the next backward is scaled by the scale set
    engine.backward(parts["loss_fn"](engine(x.half()), y))
    engine.step()
    assert engine.was_step_applied() and _deepspeed_private.scale(engine) == 8.0
    engine.destroy()


def test_the_base_optimizer_holds_the_step_count():
    engine, parts = _engine()
    x, y = parts["batches"][0]
    for _ in range(3):
        engine.backward(parts["loss_fn"](engine(x), y))
        engine.step()
    base = _deepspeed_private.base_optimizer(engine)
    assert isinstance(base, torch.optim.Adam)
    assert [float(s["step"]) for s in base.state.values()] == [3.0]
    saved = _deepspeed.full_state(engine)
    assert float(saved["scalars"]["step"]) == 3.0
    assert set(saved["state"]) == {"exp_avg", "exp_avg_sq"}
    engine.destroy()


def test_the_error_at_the_minimum_scale_starts_with_its_words():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(
        init_scale=1.0, scale_window=10, min_scale=1.0, delayed_shift=1,
        consecutive_hysteresis=False, raise_error_at_min_scale=True,
    )  # fmt: skip
    with pytest.raises(Exception) as caught:
        scaler.update_scale(True)
    assert str(caught.value).startswith(_deepspeed_private.AT_MINIMUM)
    assert _deepspeed_private.at_minimum(caught.value)
    assert not _deepspeed_private.at_minimum(RuntimeError("CUDA out of memory"))


def test_what_deepspeed_initialize_made_is_told_from_what_it_did_not():
    parts = dsw.regression()
    assert not _deepspeed_private.made_by_initialize(parts["model"])
    assert not _deepspeed_private.made_by_initialize(parts["optimizer"])
    engine = _deepspeed.initialize(
        parts["model"], parts["optimizer"], {**dsw.CONFIG, "fp16": {"enabled": False}}
    )
    for made in (engine, engine.optimizer, parts["model"]):  # its parameters are marked
        assert _deepspeed_private.made_by_initialize(made), type(made).__name__
    engine.destroy()


# --- a Trainer made with deepspeed=: Accelerate's and transformers' internals ----------------


def test_a_deepspeed_accelerators_config_is_the_one_prepare_makes_the_engine_from():
    trainer = dsw.trainer(max_steps=2)
    accelerator = trainer.accelerator
    _accelerate_private.check_deepspeed(accelerator)
    for path in _accelerate_private.DEEPSPEED_READ:  # before prepare(), as attach reads them
        owner, _, name = path.rpartition(".")
        assert hasattr(getattr(accelerator, owner) if owner else accelerator, name), path
    plugin = _accelerate_private.deepspeed_plugin(accelerator)
    assert plugin is accelerator.state.deepspeed_plugin is not None
    config = _accelerate_private.deepspeed_config(accelerator)
    assert config is plugin.deepspeed_config is plugin.hf_ds_config.config  # one dict
    config["fp16"] = {"enabled": True, "initial_scale_power": 12}
    config["gradient_clipping"] = 0.5
    assert _accelerate_private.deepspeed_engine(accelerator) is None
    _deepspeed_private.allow_float16()
    _deepspeed.process_group()
    optimizer = torch.optim.Adam(trainer.model.parameters(), lr=1e-3)
    engine, _ = accelerator.prepare(trainer.model, optimizer)
    assert _accelerate_private.deepspeed_engine(accelerator) is engine
    assert engine.fp16_enabled() and _deepspeed_private.scale(engine) == 2.0**12
    assert engine.gradient_clipping() == 0.5
    engine.destroy()


def test_a_config_scheduler_is_the_one_deepspeed_init_hands_on():
    trainer = dsw.trainer(max_steps=2)
    _accelerate_private.deepspeed_config(trainer.accelerator)["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_num_steps": 1},
    }
    optimizer, scheduler = _transformers_private.deepspeed_init(trainer, 2)
    assert _accelerate_private.is_config_scheduler(scheduler)
    assert _accelerate_private.DUMMY_SCHEDULER == ("accelerate.utils", "DummyScheduler")
    plain = dsw.trainer(max_steps=2)
    optimizer, scheduler = _transformers_private.deepspeed_init(plain, 2)
    assert isinstance(optimizer, torch.optim.Optimizer)  # the Trainer's own, made for it
    assert scheduler is None or not _accelerate_private.is_config_scheduler(scheduler)


def test_the_replaced_backward_is_the_one_a_deepspeed_trainers_training_step_calls():
    trainer = dsw.trainer(max_steps=2)
    assert _accelerate_private.DEEPSPEED_REPLACED == ("backward",)
    engine = _deepspeed.init_trainer_engine(trainer, 2)
    called = []
    _accelerate_private.replace_backward(trainer.accelerator, lambda loss, **_: called.append(loss))
    inputs = next(iter(trainer.get_train_dataloader()))
    trainer.current_gradient_accumulation_steps = 1  # as the search sets it (and train())
    trainer.training_step(engine, inputs)
    assert len(called) == 1 and called[0].requires_grad
    engine.destroy()


def test_a_deepspeed_trainers_input_dtype_is_what_its_prepare_inputs_casts_to():
    trainer = dsw.trainer(max_steps=2)
    _transformers_private.check_deepspeed(trainer)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        _transformers_private.set_input_dtype(trainer, dtype)
        batch = trainer._prepare_inputs({"x": torch.ones(2), "ids": torch.ones(2, dtype=int)})
        assert batch["x"].dtype == dtype and batch["ids"].dtype == torch.int64


def test_what_train_sets_once_the_engine_is_made_is_what_set_engine_sets():
    from transformers import Trainer

    source = inspect.getsource(Trainer)
    for name in _transformers_private.DEEPSPEED_SET:
        assert re.search(rf"self\.{name}\b[^\n=]*=\s", source), name
    module, name = _transformers_private.DEEPSPEED_INIT
    assert f"{name}(" in source and module == "transformers.integrations.deepspeed"
    trainer = dsw.trainer(max_steps=2)
    engine = _deepspeed.init_trainer_engine(trainer, 2)  # deepspeed_init, then prepare
    assert all(getattr(trainer, n) is engine for n in _transformers_private.DEEPSPEED_SET)
    assert _deepspeed.trainer_engine(trainer) is engine
    _transformers_private.set_engine(trainer, None)
    assert all(getattr(trainer, n) is None for n in _transformers_private.DEEPSPEED_SET)
    engine.destroy()


def test_a_deepspeed_trainers_precision_is_set_where_its_engine_and_inputs_read_it():
    trainer = dsw.trainer(max_steps=2)
    config = _deepspeed.trainer_config(trainer)
    wanted = _deepspeed.engine_config(config, DeepSpeedFp16Config(init_scale=2.0**12))
    _deepspeed.set_trainer_precision(trainer, wanted)
    plugin = _accelerate_private.deepspeed_plugin(trainer.accelerator)
    assert plugin.hf_ds_config.dtype() == torch.float16
    engine = _deepspeed.init_trainer_engine(trainer, 2)
    assert engine.fp16_enabled() and _deepspeed_private.scale(engine) == 2.0**12
    assert trainer._prepare_inputs({"x": torch.ones(2)})["x"].dtype == torch.float16
    engine.destroy()


def test_a_deepspeed_trainers_release_without_a_listed_name_is_refused_in_one_line(
    monkeypatch,
):
    import transformers.integrations.deepspeed as integration

    trainer = dsw.trainer(max_steps=2)
    monkeypatch.delattr(integration, "deepspeed_init")  # a release that moved it
    with pytest.raises(scalertune.UsageError) as refused:
        scalertune.attach(trainer, DeepSpeedFp16Config())
    assert str(refused.value) == (
        f"transformers {_transformers_private.RELEASES.installed()} has no "
        "transformers.integrations.deepspeed.deepspeed_init, which scalertune relies on: "
        f"pip install 'transformers=={_transformers_private.RELEASES.checked}.*', the release "
        "it was checked on"
    )


# --- Lightning ------------------------------------------------------------------------------


def _module(configure):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def configure_optimizers(self):
            return configure(self)

    return Module()


def test_configured_optimizers_read_every_shape_as_lightning_does():
    def adam(module):
        return torch.optim.Adam(module.parameters())

    optimizers, configs = _lightning_private.configured_optimizers(_module(adam))
    assert len(optimizers) == 1 and configs == []

    def with_schedule(module):
        optimizer = adam(module)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 10)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "frequency": 2}}

    _, (config,) = _lightning_private.configured_optimizers(_module(with_schedule))
    assert (config.interval, config.frequency, config.reduce_on_plateau) == ("epoch", 2, False)

    def plateau(module):
        optimizer = adam(module)
        schedule = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return [optimizer], [{"scheduler": schedule, "monitor": "train_loss"}]

    _, (config,) = _lightning_private.configured_optimizers(_module(plateau))
    assert config.reduce_on_plateau and config.monitor == "train_loss"
    with pytest.raises(Exception, match="configure_optimizers"):
        _lightning_private.configured_optimizers(_module(lambda module: "nonsense"))


def test_a_lightning_object_is_told_by_its_package_and_checked_by_name(monkeypatch):
    import lightning.pytorch as pl

    trainer, module = trainers.lightning_trainer(), trainers.lightning_module()
    assert _lightning_private.package(trainer, "Trainer") == "lightning.pytorch"
    assert _lightning_private.package(module, "LightningModule") == "lightning.pytorch"
    assert _lightning_private.package(_accelerator(), "Trainer") is None
    _lightning_private.check(trainer, "Trainer")  # every listed name there
    monkeypatch.delattr(pl.core.optimizer, "_configure_schedulers_automatic_opt")
    with pytest.raises(scalertune.UsageError, match="_configure_schedulers_automatic_opt"):
        _lightning_private.check(module, "LightningModule")


def test_a_modules_optimizers_are_what_it_reads_of_its_trainers_strategy():
    import lightning.pytorch as pl

    source = inspect.getsource(pl.LightningModule.optimizers)
    assert f"self.trainer.strategy.{_lightning_private.STRATEGY_OPTIMIZERS}" in source
    module = trainers.lightning_module()
    workload = scalertune.lightning_workload(module, trainers.lightning_loader())
    assert module.optimizers() is workload.optimizer


def test_the_overridden_plugin_methods_and_the_set_attributes_are_lightnings():
    from lightning.pytorch.plugins import precision

    parameters = {
        (cls, name): list(inspect.signature(getattr(getattr(precision, cls), name)).parameters)
        for cls, names in _lightning_private.OVERRIDDEN.items()
        for name in names
    }
    assert parameters[("MixedPrecision", "optimizer_step")][:4] == [
        "self",
        "optimizer",
        "model",
        "closure",
    ]
    assert (
        parameters[("Precision", "optimizer_step")][:4]
        == parameters[("MixedPrecision", "optimizer_step")][:4]
    )
    assert parameters[("MixedPrecision", "convert_module")] == ["self", "module"]
    assert parameters[("MixedPrecision", "forward_context")] == ["self"]
    trainer = trainers.lightning_trainer()
    for path in _lightning_private.SET:
        owner = trainer
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        assert hasattr(owner, name), path
    module = trainers.lightning_module()
    for name in (*_lightning_private.MODULE_SET, *_lightning_private.MODULE_CALLED):
        assert hasattr(type(module), name), name


# --- the bounds -----------------------------------------------------------------------------


def test_the_bounds_are_the_ones_pyproject_declares_and_the_installed_releases_are_inside():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    for releases in (
        _accelerate_private.RELEASES,
        _transformers_private.RELEASES,
        _transformers_private.TRL_RELEASES,
        _lightning_private.RELEASES["lightning"],
        _deepspeed_private.RELEASES,
    ):
        assert releases.requirement in declared, releases.requirement
        assert releases.takes(releases.installed()), releases.installed()
        installed = releases.installed()
        assert installed == releases.checked or installed.startswith(releases.checked + "."), (
            installed
        )


@pytest.mark.parametrize("distribution", ["accelerate", "transformers", "lightning"])
def test_a_release_outside_the_bound_is_refused_in_one_line_naming_the_releases(
    distribution, monkeypatch
):
    trainer = {
        "accelerate": _accelerator,
        "transformers": trainers.hf_trainer,
        "lightning": trainers.lightning_trainer,
    }[distribution]()
    monkeypatch.setattr(
        _releases, "_installed", lambda d: "99.1.0" if d == distribution else _installed(d)
    )
    with pytest.raises(scalertune.UsageError) as refused:
        scalertune.attach(trainer, scalertune.AmpConfig())
    message = str(refused.value)
    assert "\n" not in message
    assert f"this is {distribution} 99.1.0: pip install '{distribution}>=" in message


def test_a_deepspeed_release_outside_the_bound_is_refused_in_one_line(monkeypatch):
    from scalertune._workload._factory import build_workload

    monkeypatch.setattr(
        _releases, "_installed", lambda d: "0.99.0" if d == "deepspeed" else _installed(d)
    )
    with pytest.raises(scalertune.UsageError) as refused:
        build_workload(dsw.regression, seed=0, device=torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message
    assert message.endswith("this is deepspeed 0.99.0: pip install 'deepspeed>=0.19,<0.19.9'")


def test_a_deepspeed_release_without_a_listed_name_is_refused_in_one_line(monkeypatch):
    import deepspeed.runtime.zero.stage_1_and_2 as zero

    trainer = dsw.trainer(max_steps=2)
    monkeypatch.delattr(zero, "DeepSpeedZeroOptimizer")  # a release that moved it
    with pytest.raises(scalertune.UsageError) as refused:
        scalertune.attach(trainer, DeepSpeedFp16Config())
    assert str(refused.value) == (
        f"deepspeed {_deepspeed_private.RELEASES.installed()} has no "
        "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer, which scalertune relies "
        "on: pip install 'deepspeed==0.19.8.*', the release it was checked on"
    )


def test_a_release_without_a_listed_name_is_refused_in_one_line_naming_the_release(monkeypatch):
    accelerator = _accelerator()
    # a release whose gradient state has no sync flag to set
    monkeypatch.delattr(type(accelerator.gradient_state), "_set_sync_gradients")
    with pytest.raises(scalertune.UsageError) as refused:
        scalertune.attach(accelerator, scalertune.AmpConfig())
    assert str(refused.value).endswith(
        f"pip install 'accelerate=={_accelerate_private.RELEASES.checked}.*', "
        "the release it was checked on"
    )


# --- the house rule -------------------------------------------------------------------------


def test_the_frameworks_private_names_stand_in_their_modules_only():
    """Accelerate's, transformers' and Lightning's private names stand in their three modules
    (those a Trainer made with ``deepspeed=`` relies on included), DeepSpeed's in its own,
    and nowhere else but this file."""
    here = pathlib.Path(__file__).resolve()
    modules = (_accelerate_private, _transformers_private, _lightning_private, _deepspeed_private)
    allowed = {pathlib.Path(m.__file__).resolve() for m in modules}
    naming = sorted(
        str(path.relative_to(ROOT))
        for folder in ("scalertune", "tests", "benchmarks", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if path.resolve() not in {here, *allowed} and PRIVATE.search(path.read_text())
    )
    assert naming == []
    hf_code = re.compile(HF_PRIVATE)
    deepspeed_code = re.compile(DEEPSPEED_PRIVATE)
    for module in modules:
        code = _code(module)
        if module is _deepspeed_private:
            assert not hf_code.search(code), hf_code.search(code)
        else:
            assert not deepspeed_code.search(code), (module.__name__, deepspeed_code.search(code))


def _code(module):
    """``module``'s source without its docstrings and comments."""
    import ast

    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            body[0] = ast.Pass()  # a docstring
    return ast.unparse(tree)


def test_the_runtimes_checkpoint_saver_runs_before_a_users_own_callbacks(tmp_path):
    """A user's ``on_save`` that copies the checkpoint away runs after the runtime's state is
    written into it: the saver goes first in the list the Trainer runs its callbacks in."""
    from transformers import TrainerCallback

    class Users(TrainerCallback):
        pass

    class Saver(TrainerCallback):
        pass

    trainer = trainers.hf_trainer(output_dir=str(tmp_path))
    trainer.add_callback(Users())
    saver = Saver()
    _transformers_private.add_first(trainer, saver)
    callbacks = trainer.callback_handler.callbacks
    assert callbacks[0] is saver and any(isinstance(c, Users) for c in callbacks[1:])


def test_every_entry_of_a_private_module_is_checked_by_a_test_here():
    """Each function and listed name of the four modules is used by a test of this file."""
    import ast

    tests = ast.parse(pathlib.Path(__file__).read_text())
    used = {
        (node.value.id, node.attr)
        for function in tests.body
        if isinstance(function, ast.FunctionDef) and function.name.startswith("test_")
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    for module in (_accelerate_private, _transformers_private, _lightning_private,
                   _deepspeed_private):  # fmt: skip
        name = module.__name__.rpartition(".")[2]
        entries = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and getattr(v, "__module__", module.__name__) == module.__name__
            and (callable(v) or n.isupper())
            and not isinstance(v, type)
        ]
        assert entries, name
        untested = [n for n in entries if (name, n) not in used]
        assert untested == [], (name, untested)
