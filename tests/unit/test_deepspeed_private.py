"""Each undocumented part of DeepSpeed (and of Hugging Face's DeepSpeed integration) that
scalertune relies on, checked against the installed releases on a real engine: the adapter
that holds them all, ``scalertune._frameworks._deepspeed``, does what its callers expect. A
release that moves one fails here, by name, before a search meets it; ``pyproject.toml``
bounds deepspeed to the releases this file passed on."""

import ast
import os

import deepspeed_workloads as dsw
import pytest
import torch
from conftest import ROOT

from scalertune._amp._config import DeepSpeedFp16Config
from scalertune._frameworks import _deepspeed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

TRAINER = "test_a_trainers_deepspeed_config_is_the_one_its_engine_is_made_from"
#: The names of DeepSpeed's, Accelerate's and Transformers' objects that the adapter reads
#: or writes, with the test of each (the adapter's docstring lists them in words).
PRIVATE = {
    "is_fp16_supported": "test_float16_trains_on_this_cpu_once_allowed",
    "__compatible_ops__": "test_a_search_compiles_no_shared_memory_all_reduce",
    "loss_scaler": "test_zeros_loss_scaler_holds_the_state_the_replay_keeps",
    "cur_hysteresis": "test_zeros_loss_scaler_holds_the_state_the_replay_keeps",
    "last_overflow_iter": "test_zeros_loss_scaler_holds_the_state_the_replay_keeps",
    "cur_iter": "test_zeros_loss_scaler_holds_the_state_the_replay_keeps",
    "optimizer.optimizer": "test_the_base_optimizer_holds_the_step_count",
    "AT_MINIMUM": "test_the_error_at_the_minimum_scale_starts_with_its_words",
    "deepspeed_plugin": TRAINER,
    "_dtype": TRAINER,
    "deepspeed_init": TRAINER,
    "deepspeed_engine_wrapped": TRAINER,
}


def _engine(fp16=None, config=None):
    parts = dsw.regression()
    block = fp16 or {"enabled": False}
    return _deepspeed.initialize(
        parts["model"], parts["optimizer"], {**(config or dsw.CONFIG), "fp16": block}
    ), parts


def test_each_private_name_the_adapter_uses_is_listed_with_its_test():
    with open(os.path.join(ROOT, "scalertune", "_frameworks", "_deepspeed.py")) as f:
        text = f.read()
    docstring = ast.get_docstring(ast.parse(text)) or ""
    with open(__file__) as f:
        tests = {n.name for n in ast.parse(f.read()).body if hasattr(n, "name")}
    for name, test in PRIVATE.items():
        assert name.split(".")[-1] in docstring or name == "optimizer.optimizer", name
        assert name.split(".")[-1] in text, name
        assert test in tests, test


def test_float16_trains_on_this_cpu_once_allowed():
    from deepspeed.accelerator import get_accelerator

    _deepspeed.allow_float16()
    assert get_accelerator().is_fp16_supported()
    engine, parts = _engine({"enabled": True})
    assert engine.fp16_enabled() and next(engine.module.parameters()).dtype == torch.float16
    engine.destroy()


def test_a_search_compiles_no_shared_memory_all_reduce():
    import deepspeed.comm.comm as comm
    import deepspeed.ops

    _deepspeed.process_group()
    assert _deepspeed.SHARED_MEMORY_OP in deepspeed.ops.__compatible_ops__
    assert torch.distributed.get_world_size() == 1
    assert comm.cdb is not None and comm.cdb.shm_comm_op is None


def test_zeros_loss_scaler_holds_the_state_the_replay_keeps():
    from scalertune._replay._deepspeed import DeepSpeedScaler, update_deepspeed_scales

    block = {"enabled": True, "initial_scale_power": 20, "hysteresis": 2, "loss_scale_window": 3}
    engine, parts = _engine(block)
    scaler = _deepspeed.loss_scaler(engine)
    overflows = []
    for i in range(8):
        x, y = parts["batches"][i]
        engine.backward(parts["loss_fn"](engine(x.half()), y))
        engine.step()
        overflows.append(not engine.was_step_applied())
    scales, _ = update_deepspeed_scales(overflows, DeepSpeedScaler.from_fp16_block(block))
    assert scaler.cur_scale == scales[-1] and scaler.cur_iter == 8
    assert scaler.last_overflow_iter == max(i for i, o in enumerate(overflows) if o)
    state = _deepspeed.DeepSpeedRun(engine).scaler_state()
    assert set(_deepspeed.SCALER_FIELDS) <= set(state) and state["scale"] == scaler.cur_scale
    _deepspeed.DeepSpeedRun(engine).load_scaler_state({"cur_scale": 8.0, "cur_hysteresis": 1})
    assert (scaler.cur_scale, scaler.cur_hysteresis) == (8.0, 1)
    engine.destroy()


def test_the_base_optimizer_holds_the_step_count():
    engine, parts = _engine()
    x, y = parts["batches"][0]
    for _ in range(3):
        engine.backward(parts["loss_fn"](engine(x), y))
        engine.step()
    base = _deepspeed.base_optimizer(engine)
    assert isinstance(base, torch.optim.Adam)
    assert [float(s["step"]) for s in base.state.values()] == [3.0]
    saved = _deepspeed.full_state(engine)
    assert float(saved["scalars"]["step"]) == 3.0 and set(saved["state"]) == {
        "exp_avg",
        "exp_avg_sq",
    }
    engine.destroy()


def test_the_error_at_the_minimum_scale_starts_with_its_words():
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(
        init_scale=1.0,
        scale_window=10,
        min_scale=1.0,
        delayed_shift=1,
        consecutive_hysteresis=False,
    )
    with pytest.raises(Exception) as caught:
        scaler.update_scale(True)
    assert str(caught.value).startswith(_deepspeed.AT_MINIMUM)


def test_a_trainers_deepspeed_config_is_the_one_its_engine_is_made_from():
    trainer = dsw.trainer(max_steps=2)
    config = _deepspeed.trainer_config(trainer)
    plugin = trainer.accelerator.state.deepspeed_plugin
    assert config is plugin.hf_ds_config.config  # one dict: what is set there is used
    wanted = _deepspeed.engine_config(config, DeepSpeedFp16Config(init_scale=2.0**12))
    _deepspeed.set_trainer_precision(trainer, wanted)
    assert plugin.hf_ds_config.dtype() == torch.float16
    assert _deepspeed.trainer_engine(trainer) is None
    engine = _deepspeed.init_trainer_engine(trainer, 2)
    assert _deepspeed.trainer_engine(trainer) is engine is trainer.model_wrapped
    assert engine.fp16_enabled() and _deepspeed.loss_scaler(engine).cur_scale == 2.0**12
    batch = trainer._prepare_inputs({"x": torch.ones(2)})  # noqa: SLF001 - what it casts
    assert batch["x"].dtype == torch.float16
    engine.destroy()
