"""Each framework internal that scalertune relies on, checked against the installed framework:
the modules that list them (``scalertune._frameworks._accelerate_private``,
``_transformers_private``, ``_lightning_private``) do what their callers expect, each name
and each replaced or overridden method is one the framework has and calls. A new release that
moves one fails here, by name, before a search or a training meets it; ``pyproject.toml``
bounds each framework to the releases this file passed on, and a release outside the bound
(or one without a listed name) is refused in one line naming the releases to install."""

import inspect
import pathlib
import re
import types

import pytest
import tomllib
import torch
import trainers
from torch import nn

import scalertune
from scalertune._frameworks import (
    _accelerate_private,
    _lightning_private,
    _releases,
    _transformers_private,
)

#: How the package spells a framework's private name.
PRIVATE = re.compile(
    r"\._models\b|\._optimizers\b|_is_overflow|_set_sync_gradients|_configure_optimizers"
    r"|_configure_schedulers_automatic_opt|_lightning_optimizers"
)
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
    ):
        assert releases.requirement in declared, releases.requirement
        assert releases.takes(releases.installed()), releases.installed()
        assert releases.installed().startswith(releases.checked + "."), releases.installed()


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
    """Accelerate's and Lightning's modules name them (transformers' has none of its own:
    the sync flag its train() sets is Accelerate's), and so does this file."""
    here = pathlib.Path(__file__).resolve()
    allowed = {
        pathlib.Path(m.__file__).resolve()
        for m in (_accelerate_private, _transformers_private, _lightning_private)
    }
    naming = sorted(
        str(path.relative_to(ROOT))
        for folder in ("scalertune", "tests", "benchmarks", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if path.resolve() not in {here, *allowed} and PRIVATE.search(path.read_text())
    )
    assert naming == []
