"""Every private name of torch that scalertune uses (``scalertune/_amp/_torch_private.py``),
one test each, against what torch itself does with it."""

import warnings

import pytest
import torch

from scalertune._amp import _torch_private as fence


def _stepped(scaler):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    return model, optimizer


def test_the_live_scale_is_none_before_a_step_and_the_scale_after():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert fence.live_scale(scaler) is None
    _stepped(scaler)
    assert float(fence.live_scale(scaler)) == scaler.get_scale() == 8.0


def test_a_scaler_with_no_step_yet_starts_where_it_is_told():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    fence.start_at(scaler, 2.0)
    _stepped(scaler)
    assert scaler.get_scale() == 2.0


def test_a_scaler_switched_off_returns_the_loss_as_it_is():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    fence.switch_off(scaler)
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss and not scaler.is_enabled()


def test_a_scaler_switched_off_and_on_again_scales_from_where_it_was():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    _stepped(scaler)
    fence.switch_off(scaler)
    fence.switch_on(scaler)
    loss = torch.tensor(3.0)
    assert scaler.is_enabled() and float(scaler.scale(loss)) == 24.0


def test_the_optimizer_states_record_that_unscale_ran():
    from torch.amp.grad_scaler import OptState

    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    scaler.unscale_(optimizer)
    assert fence.optimizer_states(scaler)[id(optimizer)]["stage"] is OptState.UNSCALED


def test_forward_pre_hooks_hold_a_registered_hook():
    module = torch.nn.Linear(3, 1)

    def hook(mod, args):
        return None

    handle = module.register_forward_pre_hook(hook)
    assert hook in fence.forward_pre_hooks(module).values()
    handle.remove()
    assert hook not in fence.forward_pre_hooks(module).values()


def test_foreach_max_norm_is_each_tensors_largest_magnitude():
    tensors = [torch.tensor([1.0, -5.0]), torch.tensor([[2.0, 0.5]])]
    assert [float(n) for n in fence.foreach_max_norm(tensors)] == [5.0, 2.0]


def test_the_installed_torch_is_one_checked_and_another_is_warned_about_once(monkeypatch):
    assert fence.RELEASES.takes(torch.__version__.split("+")[0])
    monkeypatch.setattr(torch, "__version__", "9.1.0+cu999")
    fence.check_release.cache_clear()
    try:
        with pytest.warns(
            UserWarning, match=r"checked on torch>=2\.6,<2\.15; this is torch 9\.1\.0"
        ):
            fence.check_release()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fence.check_release()  # once a process
    finally:
        fence.check_release.cache_clear()


@pytest.mark.parametrize("name", fence.SCALER_NAMES)
def test_each_gradscaler_name_the_fence_lists_exists(name):
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    scaler.scale(torch.ones((), requires_grad=True))  # the scale tensor is made at first use
    assert hasattr(scaler, name)


@pytest.mark.parametrize("name", fence.MODULE_NAMES)
def test_each_module_name_the_fence_lists_exists(name):
    assert hasattr(torch.nn.Linear(2, 2), name)


@pytest.mark.parametrize("name", fence.TORCH_NAMES)
def test_each_torch_function_the_fence_lists_exists(name):
    assert callable(getattr(torch, name))


def test_a_restarted_growth_counts_a_whole_interval_again():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    model, optimizer = _stepped(scaler)  # one clean step of two toward a growth
    fence.restart_growth(scaler)
    for expected in (8.0, 16.0):
        scaler.scale(model(torch.ones(2, 3)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        assert scaler.get_scale() == expected


@pytest.mark.parametrize("name", fence.TORCH_C_NAMES)
def test_each_torch_c_function_the_fence_lists_exists(name):
    assert callable(getattr(torch._C, name))


def test_in_backward_is_true_only_while_the_engine_runs_a_backward():
    seen = []

    class Look(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(fence.in_backward())
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(fence.in_backward())
            return grad

    Look.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == [False, True] and not fence.in_backward()


@pytest.mark.parametrize("name", fence.PRELOADED_MODULES)
def test_each_private_module_the_fence_preloads_imports(name):
    import importlib

    assert importlib.import_module(name) is not None


def test_no_module_of_the_package_but_the_fence_names_a_private_part_of_torch():
    """``torch._x`` in code, as an attribute or a module's name (not in a comment or a
    docstring): only ``_torch_private.py`` may."""
    import pathlib
    import tokenize

    package = pathlib.Path(fence.__file__).parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "_torch_private.py":
            continue
        with open(path, "rb") as f:
            tokens = [t for t in tokenize.tokenize(f.readline) if t.type != tokenize.NL]
        for before, a, dot, b in zip(tokens, tokens[1:], tokens[2:], tokens[3:]):
            where = f"{path.relative_to(package)}:{a.start[0]}"
            if a.string == "torch" and dot.string == "." and b.string.startswith("_"):
                found.append(f"{where} torch.{b.string}")
            docstring = before.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.ENCODING)
            if a.type == tokenize.STRING and not docstring and "torch._" in a.string:
                found.append(f"{where} {a.string[:40]}")
    assert found == []
