"""float8 through torchao: the config and its YAML block, the runtime's conversion against
torchao's own, the precision around it, and the in-run check that moves a failing recipe.

Every run here is a tiny model under torchao's emulation on the CPU (float8's numerics)."""

import dataclasses
import warnings

import float8_workloads as fw
import pytest
import torch
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpRuntime, CheckPolicy
from scalertune._amp import _float8

pytest.importorskip("torchao")


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 3)
    )


def _train(config, workload, steps, *, check=None):
    amp = AmpRuntime(config, device="cpu", check=check)
    model = amp.prepare(workload["model"])
    losses = []
    for inputs, targets in workload["batches"][:steps]:
        losses.append(
            float(
                amp.train_step(model, workload["optimizer"], workload["loss_fn"], (inputs, targets))
            )
        )
    return losses, amp


def _tail(losses, n=50):
    return sum(losses[-n:]) / n


def test_a_float8_config_round_trips_through_its_yaml_block_and_refuses_what_torchao_cannot_run():
    config = AmpConfig(dtype="float8", float8_recipe="rowwise", float8_around="bfloat16")
    data = config.to_dict()
    assert data["float8"] == {
        "recipe": "rowwise",
        "around": "bfloat16",
        "round_scales_to_power_of_2": None,
    }
    assert AmpConfig.from_dict(data) == config
    assert AmpConfig(dtype="bfloat16", float8_recipe="rowwise") == AmpConfig(dtype="bfloat16")
    refused = {
        "recipe 'x'": {"dtype": "float8", "float8": {"recipe": "x"}},
        "belongs to dtype float8": {"dtype": "float16", "float8": {"recipe": "rowwise"}},
        "unknown key": {"dtype": "float8", "float8": {"scale": 1}},
        "cannot mix": {
            "dtype": "float8",
            "float8": {"recipe": "rowwise_with_gw_hp", "around": "bfloat16"},
        },
    }
    for words, data in refused.items():
        with pytest.raises(scalertune.UsageError) as raised:
            AmpConfig.from_dict(data)
        assert words.split("'")[0] in str(raised.value) and "\n" not in str(raised.value)


def test_the_runtime_converts_the_linear_layers_as_torchao_does_and_trains_bit_for_bit_like_it():
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    ours, theirs = _mlp(), _mlp()
    params = list(ours.parameters())
    amp = AmpRuntime(AmpConfig(dtype="float8", float8_recipe="rowwise"), device="cpu")
    amp.prepare(ours)
    assert list(ours.parameters()) == params  # the optimizer built before still holds them
    assert type(ours[4]) is nn.Linear  # 16 -> 3: sizes float8 matmuls cannot take
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name("rowwise"), emulate=True)
    convert_to_float8_training(theirs, config=config, module_filter_fn=lambda m, fqn: fqn != "4")
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ours, theirs)]
    x, y = torch.randn(32, 32), torch.randn(32, 3)
    for _ in range(5):
        amp.train_step(ours, optimizers[0], nn.functional.mse_loss, (x, y))
        optimizers[1].zero_grad()
        nn.functional.mse_loss(theirs(x), y).backward()
        optimizers[1].step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)


def test_a_linear_layer_float8_cannot_take_is_left_out_in_one_line():
    _float8._SAID.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        AmpRuntime(AmpConfig(dtype="float8"), device="cpu").prepare(_mlp())
        AmpRuntime(AmpConfig(dtype="float8"), device="cpu").prepare(_mlp())  # said once
    lines = [str(w.message) for w in said if "float8" in str(w.message)]
    assert lines == [
        "float8: layer '4' left out of float8 (sizes not multiples of 16, which float8 "
        "matmuls need); it runs in the precision around float8"
    ]


def test_a_model_with_no_layer_float8_takes_is_said_to_train_without_float8():
    """A new user attached a float8 answer to a Llama of width 24: every layer was left out,
    and nothing said that the run trains in float32 as a whole."""
    _float8._SAID.clear()
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 1))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        AmpRuntime(AmpConfig(dtype="float8", float8_recipe="rowwise"), device="cpu").prepare(model)
    lines = [str(w.message) for w in said]
    assert lines[-1] == (
        "float8: no layer of this model takes float8, so it trains in float32 throughout, as "
        "a float32 config would: float8 needs torch.nn.Linear layers whose sizes are "
        "multiples of 16"
    ), lines
    assert not any(type(m).__name__ == "Float8Linear" for m in model.modules())


def test_float8_runs_only_in_its_runtimes_forward_the_check_and_islands_see_plain_linear_layers():
    model = _mlp()
    reference = _mlp()
    amp = AmpRuntime(AmpConfig(dtype="float8"), device="cpu")
    amp.prepare(model)
    x = torch.randn(8, 32) * 3
    with amp.autocast():
        low = model(x)
    with amp.float32(), amp.autocast():
        high = model(x)
    assert torch.equal(high, reference(x))  # the check's float32 forward: bit for bit
    assert not torch.equal(low, high)
    assert torch.equal(model(x), reference(x))  # outside the runtime's forward: no float8
    with pytest.raises(
        scalertune.UsageError, match="trains its Linear layers in float8: call model = amp.prepare"
    ):
        AmpRuntime(AmpConfig(dtype="float8"), device="cpu").loss(lambda: model(x).sum())


def test_bfloat16_around_float8_autocasts_what_float8_leaves():
    amp = AmpRuntime(AmpConfig(dtype="float8", float8_around="bfloat16"), device="cpu")
    model = amp.prepare(_mlp())
    with amp.autocast():
        out = model(torch.randn(4, 32))
    assert out.dtype == torch.bfloat16  # the left-out 16 -> 3 layer runs under autocast


def test_tensorwise_flushes_a_row_in_16_of_massive_values_where_rowwise_trains_like_float32():
    steps = 300
    float32, _ = _train(AmpConfig(dtype="float32"), _seeded(fw.make_model), steps)
    tensorwise, _ = _train(AmpConfig(dtype="float8"), _seeded(fw.make_model), steps)
    rowwise, _ = _train(
        AmpConfig(dtype="float8", float8_recipe="rowwise"), _seeded(fw.make_model), steps
    )
    assert _tail(tensorwise) > 3 * _tail(float32)
    assert _tail(rowwise) < 1.10 * _tail(float32)


def _seeded(factory):
    torch.manual_seed(0)
    return factory()


def test_the_in_run_check_moves_a_failing_tensorwise_run_to_rowwise_and_says_so(monkeypatch):
    def late():  # the massive value comes at step 300
        return _seeded(lambda: fw.workload(600, lambda s: 1.0 if s < 300 else fw.MASSIVE))

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        losses, amp = _train(AmpConfig(dtype="float8"), late(), 600, check=_check())
    lines = [str(w.message) for w in said if w.category is scalertune.AmpCheckWarning]
    assert amp.config.float8_recipe == "rowwise", lines
    assert len(lines) == 1 and "training with float8's rowwise recipe from now on" in lines[0]
    assert amp.state_dict()["check"]["actions"][0]["kind"] == "recipe"
    # at the first check after the outlier came, on what float8 does to the layer: a run
    # learns around a layer float8 silences, and the loss at the same weights then hides it
    assert amp.state_dict()["check"]["actions"][0]["step"] == 300
    assert "float8 tensorwise, layer '0': input amax 1e+06" in lines[0]
    resumed = AmpRuntime(AmpConfig(dtype="float8"), device="cpu", check=_check())
    resumed.prepare(_seeded(late)["model"])
    resumed.load_state_dict(amp.state_dict())
    assert resumed.config == amp.config  # a run resumed from its checkpoint keeps rowwise
    float32, _ = _train(
        AmpConfig(dtype="float32"),
        late(),
        600,
    )
    assert _tail(losses) < 1.10 * _tail(float32)


@pytest.mark.parametrize("islands", [("0",), ("0.*",), ("0.0",)])
def test_a_layer_inside_an_island_is_no_float8_layer_to_the_check(islands):
    """A layer kept in float32 by its parent's island (or a glob's) never runs in float8: a
    massive row in its input is no reason to move the run to a slower recipe."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(32, 32)), nn.LayerNorm(32), nn.Linear(32, 16))
    check = _check_every(1)
    amp = AmpRuntime(AmpConfig(dtype="float8", fp32_modules=islands), device="cpu", check=check)
    model = amp.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(64, 32), torch.randn(64, 16)
    x[0] *= 1e5  # one massive row, into the island's layer only
    for _ in range(3):
        amp.train_step(model, optimizer, nn.functional.mse_loss, (x, y))
    assert amp.config == AmpConfig(dtype="float8", fp32_modules=islands)
    assert amp.check.actions.done == [] and len(amp.check.checks) == 3


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpointed_float8_block_recomputes_in_float8_as_it_ran(reentrant):
    """Activation checkpointing (a Trainer's gradient_checkpointing) runs the block's forward
    again in the backward, after the runtime's forward has ended: it must recompute in the
    recipe it ran with, so the gradients are the ones without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self, checkpointed):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
            self.head = nn.Linear(32, 16)
            self.checkpointed = checkpointed

        def forward(self, x):
            if self.checkpointed:
                x = checkpoint(self.block, x, use_reentrant=reentrant)
            else:
                x = self.block(x)
            return self.head(x)

    def gradients(checkpointed, islands=()):
        torch.manual_seed(0)
        model = Net(checkpointed)
        config = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=islands)
        amp = AmpRuntime(config, device="cpu")
        model = amp.prepare(model)
        x = torch.randn(16, 32, requires_grad=True)
        x.data[0] *= 1e4
        loss = amp.loss(lambda: model(x).square().mean())
        amp.backward(loss)
        return [p.grad.clone() for p in model.parameters()]

    for islands in [(), ("block.2",)]:
        plain, checkpointed = gradients(False, islands), gradients(True, islands)
        assert all(torch.equal(a, b) for a, b in zip(plain, checkpointed)), islands


def _check_every(every, window=4):
    from scalertune._inrun._build import in_run_check

    return in_run_check(None, CheckPolicy(every=every, window=window))


def _check():
    from scalertune._inrun._build import in_run_check

    return in_run_check(None, CheckPolicy(every=25, window=4))


def test_a_missing_torchao_is_one_line_naming_the_extra(monkeypatch):
    from scalertune import _releases
    from scalertune._amp import _torchao_private

    monkeypatch.setattr(_releases, "_installed", lambda d: None)
    _torchao_private.torchao_float8.cache_clear()
    try:
        with pytest.raises(scalertune.UsageError, match=r"pip install 'scalertune\[float8\]'"):
            AmpRuntime(AmpConfig(dtype="float8"), device="cpu")
    finally:
        _torchao_private.torchao_float8.cache_clear()


def test_what_float8_costs_each_layer_names_the_flushed_layers_and_spares_the_ordinary_ones():
    from scalertune._inrun._float8_layers import LAYER_ERROR, layer_casts, record_inputs

    def casts(massive, recipe):
        workload = _seeded(lambda: fw.workload(1, massive))
        model, (x, _) = workload["model"], workload["batches"][0]
        with record_inputs(model) as inputs:
            model(x)
        config = AmpConfig(dtype="float8", float8_recipe=recipe)
        return {c.name: c for c in layer_casts(inputs, config, device=torch.device("cpu"))}

    tensorwise = casts(lambda step: fw.MASSIVE, "tensorwise")
    assert tensorwise["0"].flushed > 0.9 and tensorwise["0"].error > 0.5
    assert "96.4% of its nonzero inputs flush to zero" in tensorwise["0"].line()
    assert not any(c.spoiled for c in casts(lambda step: fw.MASSIVE, "rowwise").values())
    ordinary = casts(lambda step: 1.0, "tensorwise")
    assert all(c.error < LAYER_ERROR and c.flushed == 0 for c in ordinary.values())


def test_a_search_prunes_a_float8_config_that_loses_a_layer_from_its_first_batch():
    """The search's rule is the in-run check's: a recipe that spoils a layer outside the
    config's islands on the first batch is pruned at its first window, with the layer's line;
    the same recipe with that layer (or a module it is inside) kept in float32 is not."""
    from scalertune._inrun._float8_layers import layer_casts, record_inputs, spoiling
    from scalertune._judge._stopping import StopRule
    from scalertune._judge._target import Target
    from scalertune._run._record import RunRecord

    workload = _seeded(lambda: fw.workload(1, lambda step: fw.MASSIVE))
    model, (x, _) = workload["model"], workload["batches"][0]
    with record_inputs(model) as inputs:
        model(x)
    casts = [
        c
        for recipe in ("tensorwise", "rowwise")
        for c in layer_casts(
            inputs, AmpConfig(dtype="float8", float8_recipe=recipe), device=torch.device("cpu")
        )
    ]
    tensorwise = AmpConfig(dtype="float8")
    lost = [c.name for c in casts if c.recipe == "tensorwise" and c.spoiled]
    assert lost[0] == "0" and len(lost) > 1  # the massive row reaches the next layers too
    assert spoiling(casts, tensorwise).name == "0"
    assert spoiling(casts, dataclasses.replace(tensorwise, fp32_modules=("0",))).name == lost[1]
    assert spoiling(casts, dataclasses.replace(tensorwise, fp32_modules=tuple(lost))) is None
    assert spoiling(casts, dataclasses.replace(tensorwise, fp32_modules=("*",))) is None
    assert spoiling(casts, AmpConfig(dtype="float8", float8_recipe="rowwise")) is None
    assert spoiling(casts, AmpConfig(dtype="bfloat16")) is None

    rule = StopRule(Target.from_reference([1.0] * 50), spoiled="layer '0' lost")
    record = RunRecord(config=tensorwise, seed=0, steps=50, losses=[2.0] * 10)
    assert rule(record) and record.prune_kind == "float8"
    assert record.prune_reason == "layer '0' lost"


def test_a_float8_trial_may_keep_the_evidences_layers_out_and_the_space_names_it_back():
    import optuna

    from scalertune import SearchSpace
    from scalertune._search._setup import with_float8_islands

    space = with_float8_islands(SearchSpace.load("float8"), ["0"])
    config = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("0",))
    params = space.params_for(config)
    assert params["float8_islands"] == "0"
    study = optuna.create_study(sampler=space.sampler(seed=0))
    study.enqueue_trial(params)
    assert space.suggest(study.ask()) == config
    assert space.distinct_configs() is None  # clip_norm is a range
    assert space.params_for(AmpConfig(dtype="float8", fp32_modules=("2",))) is None


def test_a_float8_trial_may_keep_every_layer_the_evidence_names_out_at_once():
    """One recipe may spoil one layer and another a second (a new user's Llama: tensorwise
    spoiled down_proj, rowwise up_proj): the layers together are a choice of their own; a
    layer given with --fp32-modules is no choice, and is kept once."""
    import optuna

    from scalertune import SearchSpace
    from scalertune._search._setup import with_float8_islands

    space = with_float8_islands(SearchSpace.load("float8"), ["down", "up"])
    assert space.params["float8_islands"]["choices"] == ["", "down", "up", "down,up"]
    both = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("down", "up"))
    study = optuna.create_study(sampler=space.sampler(seed=0))
    study.enqueue_trial(space.params_for(both))
    assert space.suggest(study.ask()) == both
    given = with_float8_islands(SearchSpace.load("float8").with_islands("head"), ["head", "up"])
    study = optuna.create_study(sampler=given.sampler(seed=0))
    study.enqueue_trial({**space.params_for(both), "float8_islands": "head"})
    assert given.suggest(study.ask()).fp32_modules == ("head",)


def test_no_island_choice_keeps_every_layer_float8_takes_out_of_it():
    """A new user's 3-layer MLP (its output layer left out for its size): the evidence named
    both other layers, and the choice keeping them both out trained no layer in float8, was
    labelled float8 and timed as float8. A layer spoiled under two recipes is one choice."""
    from scalertune import SearchSpace
    from scalertune._inrun._float8_layers import LayerCast, island_candidates
    from scalertune._search._setup import with_float8_islands

    casts = [
        LayerCast("fc1", "tensorwise", 1e6, 0.98, 0.9),
        LayerCast("fc1", "rowwise", 1e6, 0.0, 0.5),
        LayerCast("fc2", "tensorwise", 1e3, 0.5, 0.3),
        LayerCast("fc2", "rowwise", 1e3, 0.0, 0.01),
    ]
    assert island_candidates(casts, at_most=2) == ["fc1", "fc2"]
    space = SearchSpace.load("float8")
    both = with_float8_islands(space, ["fc1", "fc2"], takes=["fc1", "fc2"])
    assert both.params["float8_islands"]["choices"] == ["", "fc1", "fc2"]
    three = with_float8_islands(space, ["fc1", "fc2"], takes=["fc1", "fc2", "fc3"])
    assert three.params["float8_islands"]["choices"] == ["", "fc1", "fc2", "fc1,fc2"]
    assert "float8_islands" not in with_float8_islands(space, ["fc1"], takes=["fc1"]).params


def test_a_float8_config_whose_islands_hold_every_layer_is_pruned_and_said_at_load():
    """Given by hand (--fp32-modules, a space file, a trial's YAML), a float8 config whose
    islands hold every layer float8 takes trains none in float8: the search prunes it at its
    first window, and the runtime says so in one line."""
    import optuna

    from scalertune._search._options import SearchOptions
    from scalertune._search._setup import prepare

    options = dict(storage=None, study_name=None, space="float8", n_trials=1, steps=20)
    options.update(horizon=None, seed=0, device="cpu", timeout=None, isolation=None)
    options.update(artifact_dir=None, nproc_per_node=None, wait_for_storage=0.0, log=None)
    setup = prepare(
        lambda: fw.workload(20, lambda step: fw.MASSIVE),
        SearchOptions(**options, fp32_modules="0,2,4", progress=False),
    )
    assert "float8_islands" not in setup.space.params  # no choice leaves a layer in float8
    study = optuna.create_study(sampler=setup.space.sampler(seed=0))
    idle = next(c for c in (setup.space.suggest(study.ask()) for _ in range(20)) if c.float8)
    assert setup.float8_spoils(idle) == (
        f"float8 {idle.float8_recipe}: its float32 islands (0, 2, 4) hold every layer float8 "
        f"takes (0, 2, 4), so it trains no layer in float8, as a {idle.float8_around} config "
        "would"
    )
    assert setup.float8_idle(dataclasses.replace(idle, fp32_modules=("0", "2"))) is None
    idle = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("0", "2"))

    _float8._SAID.clear()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        AmpRuntime(idle, device="cpu").prepare(model)
    assert [str(w.message) for w in said] == [
        "float8: the float32 islands (0, 2) hold every layer float8 takes (0, 2), so it "
        "trains no layer in float8, as a float32 config would"
    ]


def test_the_step_timing_times_float8_under_a_step_of_the_workloads_own():
    """A step of the user's own enters amp.autocast() itself and never prepares the model:
    the timing prepares every dtype's runtime, or float8's steps are refused."""
    from scalertune._run._timing import time_dtypes
    from scalertune._workload._factory import build_workload

    def make():
        parts = fw.workload(40, lambda step: 1.0)

        def step(model, batch, amp):
            inputs, targets = batch
            with amp.autocast():
                loss = parts["loss_fn"](model(inputs), targets)
            amp.backward(loss)
            amp.step(parts["optimizer"])
            parts["optimizer"].zero_grad(set_to_none=True)
            return loss

        return {**parts, "step": step}

    workload = build_workload(make, seed=0, device=torch.device("cpu"))
    times = time_dtypes(workload, ["float32", "float8"], device=torch.device("cpu"), clip_norm=None)
    assert set(times.rounds) == {"float32", "float8"}


def _no_float8_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 30), nn.ReLU(), nn.Linear(30, 1))
    x = torch.randn(16, 10)
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.functional.mse_loss,
        "batches": [(x, x[:, :1])] * 4,
    }


def test_a_float8_search_of_a_model_float8_takes_no_layer_of_is_refused_in_one_line(tmp_path):
    """Sizes that are not multiples of 16 leave every Linear layer out: a float8 search would
    train nothing in float8 and claim it did."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.raises(scalertune.UsageError, match="no Linear layer of the model takes float8"):
        scalertune.search(_no_float8_layer, space="float8", storage=storage, device="cpu")
    assert not (tmp_path / "study.db").exists()


class _TinyGPT2(nn.Module):
    """Hugging Face's GPT-2 (from its config class, nothing downloaded): its attention and MLP
    are transformers' ``Conv1D``, only its ``lm_head`` a Linear layer."""

    def __init__(self):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        self.gpt = GPT2LMHeadModel(config)

    def forward(self, ids):
        return self.gpt(ids).logits.flatten(0, 1)


def _gpt2_workload():
    model = _TinyGPT2()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (4, 2, 17), generator=generator)
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-3),
        "loss_fn": nn.functional.cross_entropy,
        "batches": [(batch[:, :-1], batch[:, 1:].flatten()) for batch in ids],
    }


def test_matmul_layers_torchao_does_not_convert_for_their_class_are_said_in_one_line():
    """A new user's GPT-2 under ``attach`` trained its lm_head alone in float8, and nothing
    said so: the Conv1D layers are named, once, by the runtime and before a search's runs."""
    pytest.importorskip("transformers")
    from scalertune._run._preflight import preflight
    from scalertune._search._setup import _float8_notes

    _float8._SAID.clear()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = AmpRuntime(AmpConfig(dtype="float8"), device="cpu").prepare(_TinyGPT2())
        AmpRuntime(AmpConfig(dtype="float8"), device="cpu").prepare(_TinyGPT2())  # said once
    lines = [str(w.message) for w in said if str(w.message).startswith("float8:")]
    line = (
        "float8: 8 matmul layers of class Conv1D (gpt.transformer.h.0.attn.c_attn, "
        "gpt.transformer.h.0.attn.c_proj, gpt.transformer.h.0.mlp.c_fc and 5 more) left out of "
        "float8: torchao converts torch.nn.Linear alone; they run in the precision around float8"
    )
    assert lines == [line]
    assert [n for n, m in model.named_modules() if isinstance(m, _float8.float8_class())] == [
        "gpt.lm_head"
    ]
    checked = preflight(
        _gpt2_workload, device=torch.device("cpu"), seed=0, float8_recipes=("rowwise",)
    )
    assert len(checked.float8_not_linear) == 8
    assert line in _float8_notes(checked)


def test_a_float8_layer_prints_as_float8linear_and_a_saved_model_loads_back(tmp_path):
    """``print(model)`` names the layers Float8Linear (a new user read ``_Float8`` where the
    docs say Float8Linear); a whole model saved and loaded, or deep-copied, keeps them, and
    the name models pickled before still finds the class."""
    import copy

    model = AmpRuntime(AmpConfig(dtype="float8"), device="cpu").prepare(_mlp())
    assert str(model).count("Float8Linear(in_features=") == 2
    torch.save(model, tmp_path / "model.pt")
    for again in (torch.load(tmp_path / "model.pt", weights_only=False), copy.deepcopy(model)):
        assert [type(m) for m in again] == [type(m) for m in model]
        x = torch.randn(4, 32)
        assert torch.equal(again(x), model(x))
    assert _float8._Float8 is _float8.Float8Linear is _float8.float8_class()


def test_every_layer_float8_spoils_at_a_check_is_kept_out_at_once():
    """Two layers whose input carries a massive channel in every row (no recipe helps: each
    row's own scale is set by it) are both kept out at the check that finds them: a new
    user's LM had its second spoiled layer silenced for another 100 steps, one per check."""

    class TwoBranches(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.head = nn.Linear(32, 16), nn.Linear(32, 16), nn.Linear(16, 16)

        def forward(self, x):
            return self.head(self.a(x) + self.b(x))

    torch.manual_seed(0)
    amp = AmpRuntime(AmpConfig(dtype="float8"), device="cpu", check=_check_every(1))
    model = TwoBranches()
    with torch.no_grad():  # the channel's own weights are 0: its value is not the output's
        model.a.weight[:, 0] = model.b.weight[:, 0] = 0.0
    model = amp.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(64, 32), torch.randn(64, 16)
    x[:, 0] = 1e6  # a massive channel, in every row
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        amp.train_step(model, optimizer, nn.functional.mse_loss, (x, y))
    lines = [str(w.message) for w in said if w.category is scalertune.AmpCheckWarning]
    assert len(lines) == 1 and len(amp.check.actions.done) == 1, lines
    assert sorted(amp.config.fp32_modules) == ["a", "b"]
    assert "keeping 'a', 'b' out of float8" in lines[0] or "keeping 'b', 'a'" in lines[0]
    assert "; so is " in lines[0]
    # the report says the action is on a layer's own evidence, whatever the loss showed
    report = amp.check.report(amp)
    assert "  actions: 1 (1 on what float8 did to a layer, whatever the loss showed)" in report
