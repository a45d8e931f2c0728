"""A float8 config exported: each framework's printed code is run (or, for torchtitan, read)
by that framework's own code, and what it builds is compared with what torchao itself makes
of the recipe; the layers kept out of float8 are read back from a converted model."""

import ast
import dataclasses
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from conftest import run_cli
from torch import nn

import scalertune
from scalertune import AmpConfig, UsageError
from scalertune._export import _torchao, _torchtitan

torchao_float8 = pytest.importorskip("torchao.float8")
Float8Linear = pytest.importorskip("torchao.float8.float8_linear").Float8Linear

#: The minimal form of a result YAML for float8 that a search writes.
SAMPLE = (
    "config: {dtype: float8, float8: {recipe: rowwise, around: float32, "
    "round_scales_to_power_of_2: null}, clip_norm: null, fp32_modules: [head]}\n"
)
ROWWISE = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("head",))
#: Every knob away from torchao's defaults: bfloat16 around, scales rounded, a pattern island.
AROUND_BF16 = AmpConfig(
    dtype="float8",
    float8_recipe="tensorwise",
    float8_around="bfloat16",
    float8_round_scales=True,
    clip_norm=1.0,
    fp32_modules=("2",),
)


def _tiny():
    """Linear 32->64, ReLU, Linear 64->16, Linear 16->3: the last is not float8's size."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.Linear(16, 3))


def _float8_layers(model):
    return sorted(name for name, m in model.named_modules() if isinstance(m, Float8Linear))


def _output_dtypes(model, names, **autocast):
    """The dtype of each named module's output in one forward (under ``autocast``, if any)."""
    seen = {}
    hooks = [
        model.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, o.dtype)
        )
        for name in names
    ]
    with torch.autocast(**autocast) if autocast else torch.enable_grad():
        model(torch.randn(4, 32))
    for hook in hooks:
        hook.remove()
    return seen


def _exec(code, **names):
    namespace = dict(names)
    exec(compile(code, "<export>", "exec"), namespace)
    return namespace


def _torchaos_own(recipe, **changes):
    return dataclasses.replace(
        torchao_float8.Float8LinearConfig.from_recipe_name(recipe), **changes
    )


@pytest.mark.parametrize(
    ("config", "device", "changes"),
    [
        (ROWWISE, "cuda", {}),
        (ROWWISE, "cpu", {"emulate": True}),
        (
            dataclasses.replace(AROUND_BF16, fp32_modules=()),  # an island's hooks need CUDA
            "cuda",
            {"round_scales_to_power_of_2": True},
        ),
        (
            dataclasses.replace(AROUND_BF16, float8_round_scales=False, float8_recipe="rowwise"),
            "cpu",
            {"round_scales_to_power_of_2": False, "emulate": True},
        ),
    ],
    ids=["rowwise-cuda", "rowwise-cpu", "tensorwise-rounded", "rowwise-exact-cpu"],
)
def test_torchao_config_is_from_recipe_name_with_the_yamls_changes_in_code_and_object(
    config, device, changes
):
    export = scalertune.export(config, "torchao", device=device)
    ran = _exec(export.code, model=_tiny())
    assert (
        export.build()["config"] == ran["config"] == _torchaos_own(config.float8_recipe, **changes)
    )
    assert ("dataclasses.replace" in export.code) == bool(changes)


def test_torchao_code_converts_all_but_the_island_and_the_16_to_3_layer():
    config = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("2",))
    export = scalertune.export(config, "torchao", device="cpu")
    by_code = _exec(export.code, model=_tiny())["model"]
    by_prepare = export.prepare(_tiny())
    assert _float8_layers(by_code) == _float8_layers(by_prepare) == ["0"]
    out = by_code(torch.randn(4, 32))
    out.sum().backward()  # trains: the float8 layer has its weight's gradient
    assert by_code[0].weight.grad is not None and out.dtype == torch.float32


def test_the_written_filter_and_the_built_one_agree_on_names_patterns_and_sizes():
    islands = ("head", "blocks.*.out")
    written = _exec("import fnmatch\n" + "\n".join(_torchao.filter_source(islands)))
    built = _torchao.Float8Filter(islands)
    layers = {
        "blocks.0.up": nn.Linear(32, 64),
        "blocks.0.out": nn.Linear(64, 32),
        "blocks.1.out.proj": nn.Linear(64, 32),  # inside an island
        "head": nn.Linear(32, 32),
        "lm_head": nn.Linear(32, 32),
        "small": nn.Linear(32, 3),
    }
    verdicts = {fqn: built(mod, fqn) for fqn, mod in layers.items()}
    assert verdicts == {fqn: written["module_filter_fn"](m, fqn) for fqn, m in layers.items()}
    assert [fqn for fqn, keep in verdicts.items() if keep] == ["blocks.0.up", "lm_head"]


def test_the_filters_size_rule_is_the_runtimes():
    from scalertune._amp._float8 import FLOAT8_MULTIPLE

    assert _torchao.FLOAT8_MULTIPLE == FLOAT8_MULTIPLE


def test_torch_export_autocasts_bfloat16_around_float8_and_keeps_the_island_float32():
    export = scalertune.export(AROUND_BF16, "torch", device="cpu")
    ran = _exec(export.code, model=_tiny())
    model, autocast = ran["model"], ran["autocast"]
    assert autocast == export.build()["autocast"] == {"device_type": "cpu", "dtype": torch.bfloat16}
    assert ran["max_norm"] == 1.0 and _float8_layers(model) == ["0"]
    assert _output_dtypes(model, ("2", "3"), **autocast) == {
        "2": torch.float32,
        "3": torch.bfloat16,
    }


@pytest.mark.parametrize("around", ["float32", "bfloat16"])
def test_accelerate_takes_the_ao_recipe_and_autocasts_as_the_config_says(around):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import AORecipeKwargs

    config = dataclasses.replace(ROWWISE, float8_around=around, fp32_modules=("2",))
    export = scalertune.export(config, "accelerate", device="cpu")
    assert export.not_expressible == ()
    ran = _exec(export.code, model=_tiny())
    for kwargs, model in (
        (export.build(), export.prepare(_tiny())),
        (ran["accelerator_kwargs"], ran["model"]),
    ):
        AcceleratorState._reset_state(reset_partial_state=True)  # one Accelerator per process
        accelerator = Accelerator(**kwargs)
        assert accelerator.mixed_precision == "fp8"
        recipe = accelerator.ao_recipe_handler
        assert isinstance(recipe, AORecipeKwargs)
        assert recipe.config == _torchaos_own("rowwise", emulate=True)
        model = accelerator.prepare(model)
        assert _float8_layers(model) == ["0"]
        assert _output_dtypes(model, ("2", "3")) == {
            "2": torch.float32,
            "3": getattr(torch, around),
        }
    AcceleratorState._reset_state(reset_partial_state=True)


def test_accelerate_on_any_device_says_what_a_gpu_below_89_needs_once():
    """For a device chosen at run time, a GPU without float8 matmuls is one line: Accelerate
    turns fp8 into fp16 there, so the torchao export with emulate=True is the way; the code
    does not also advise emulate=True in Accelerate's own config, which would not help."""
    export = scalertune.export(ROWWISE, "accelerate", device="auto")
    said = [line for line in export.code.splitlines() if "emulate=True" in line]
    assert len(said) == 1 and "turns mixed_precision 'fp8'" in said[0], said


@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_lightning_and_transformers_set_the_precision_around_and_torchao_converts(framework):
    export = scalertune.export(AROUND_BF16, framework, device="cpu")
    built = export.build()
    if framework == "lightning":
        (plugin,) = built["plugins"]
        assert plugin.precision == "bf16-mixed" and built["gradient_clip_val"] == 1.0
    else:
        assert built == {"fp16": False, "bf16": True, "max_grad_norm": 1.0, "use_cpu": True}
    assert _float8_layers(_exec(export.code, model=_tiny())["model"]) == ["0"]
    assert _float8_layers(export.prepare(_tiny())) == ["0"]
    assert "scalertune.attach(" in export.code and "float8 (torchao) in bfloat16" in export.code


#: How to get torchtitan's config code without the training stack its package pins (datasets,
#: wandb, tensorboard, ...): none of it is imported by the config classes; these are. triton
#: goes to a folder of its own, named by ``SCALERTUNE_TEST_TRITON`` (as ``.ci/run`` does):
#: where it is importable, torch's dynamo imports it in every process (0.1 s of CPU each).
TORCHTITAN = (
    "pip install tyro && pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 && "
    "pip install --no-deps --target DIR triton==3.9.0; SCALERTUNE_TEST_TRITON=DIR"
)


def _skip_without_torchtitan(reason):
    """Skip where torchtitan is missing, as the README's test command may; fail in CI, where
    ``.ci/run`` installs it."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} in CI, which installs it ({TORCHTITAN})")
    pytest.skip(f"{reason} ({TORCHTITAN})")


def _torchtitan_fields(relative, *classes):
    """The field names of a dataclass of the installed torchtitan, read from its source (its
    import needs triton): ``classes`` is the path to a nested class."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        _skip_without_torchtitan("torchtitan is not installed")
    with open(os.path.join(os.path.dirname(spec.origin), relative), encoding="utf-8") as f:
        body = ast.parse(f.read()).body
    for name in classes:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == name).body
    return {
        n.target.id: n
        for n in body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_torchtitan_settings_are_fields_of_its_own_config_classes():
    export = scalertune.export(ROWWISE, "torchtitan", device="cuda")
    tree = ast.parse(export.code)
    (converter,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and n.targets[0].id == "float8_converter"
    ]
    assert ast.unparse(converter.func) == "Float8LinearConverter.Config"
    kwargs = {k.arg: ast.literal_eval(k.value) for k in converter.keywords}
    assert kwargs == {"recipe_name": "rowwise", "filter_fqns": ["head"]}
    fields = _torchtitan_fields(
        "components/quantization/float8.py", "Float8LinearConverter", "Config"
    )
    assert set(kwargs) <= set(fields) and "emulate" in fields
    declared = ast.literal_eval(fields["recipe_name"].annotation.slice)
    assert declared == _torchtitan.DECLARED_RECIPES
    (written,) = [
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "training"
    ]
    training = _torchtitan_fields("config/configs.py", "TrainingConfig")
    assert {ast.literal_eval(k) for k in written.keys} <= set(training)
    assert ast.literal_eval(training["max_norm"].value) == 1.0  # why the export always sets it
    assert ast.literal_eval(training["mixed_precision_param"].value) == "bfloat16"


#: Run in a process of its own, with triton on its path only (``SCALERTUNE_TEST_TRITON``).
_BUILT_BY_TORCHTITAN = """
import dataclasses, sys
try:
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.config import TrainingConfig
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.llama3 import model_registry
except ImportError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
import scalertune
from scalertune import AmpConfig

rowwise = AmpConfig(dtype="float8", float8_recipe="rowwise", fp32_modules=("head",))
built = scalertune.export(rowwise, "torchtitan", device="cuda").build()
assert built["float8_converter"] == Float8LinearConverter.Config(
    recipe_name="rowwise", filter_fqns=["head"]
), built
assert TrainingConfig(**built["training"]).mixed_precision_param == "float32"
# emulate: float8 without a float8 GPU (torchtitan refuses otherwise); 'head' is a substring
# of llama3's 'lm_head', which the export's DIFFERS line warns of
converter = dataclasses.replace(built["float8_converter"], emulate=True)
layers = model_registry("debugmodel", converters=[converter]).model.traverse(Linear.Config)
kinds = {fqn: type(config).__qualname__ for fqn, config, _, _ in layers}
assert kinds["lm_head"] == "Linear.Config", kinds
assert {kinds[f] for f in kinds if f != "lm_head"} == {"Float8Linear.Config"}, kinds
"""


def test_torchtitan_settings_build_its_config_where_it_imports():
    env = dict(os.environ)
    triton = os.environ.get("SCALERTUNE_TEST_TRITON")
    if triton:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [triton, env.get("PYTHONPATH")]))
    ran = subprocess.run(
        [sys.executable, "-c", _BUILT_BY_TORCHTITAN],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if ran.returncode == 3:
        said = ran.stderr.strip().splitlines()[-1]
        _skip_without_torchtitan(f"torchtitan's float8 converter does not import here: {said}")
    assert ran.returncode == 0, ran.stderr[-3000:]


def test_torchtitan_says_what_it_cannot_express():
    export = scalertune.export(
        dataclasses.replace(AROUND_BF16, fp32_modules=("blocks.*.out",)), "torchtitan"
    )
    said = " ".join(export.not_expressible)
    assert "round_scales_to_power_of_2=True" in said and "nearest: '.out'" in said
    assert "MixedPrecisionPolicy" in " ".join(export.differences)
    with pytest.raises(UsageError, match="cannot express"):
        scalertune.export(AROUND_BF16, "torchtitan", strict=True)


def test_torchtitan_keeps_the_recipes_own_scale_rounding_as_torchao_has_it():
    for recipe, rounds in _torchtitan.RECIPE_ROUNDS_SCALES.items():
        assert _torchaos_own(recipe).round_scales_to_power_of_2 is rounds


@pytest.mark.parametrize(
    ("config", "framework", "says"),
    [
        (AmpConfig(dtype="float16"), "torchao", "torchao is exported for a float8 config"),
        (AmpConfig(dtype="bfloat16"), "torchtitan", "torchtitan is exported for a float8"),
        (ROWWISE, "deepspeed", "DeepSpeed's fp16 and bf16 engines have no float8"),
    ],
)
def test_a_framework_without_the_configs_precision_refuses_in_one_line(config, framework, says):
    with pytest.raises(UsageError, match=says) as raised:
        scalertune.export(config, framework)
    assert "\n" not in str(raised.value)


def test_cli_exports_the_sample_yaml_to_torchao(tmp_path):
    (tmp_path / "amp.yaml").write_text(SAMPLE)
    ran = run_cli(
        "export", "amp.yaml", "--to", "torchao", "--device", "cuda", cwd=tmp_path, process=True
    )
    assert ran.returncode == 0, ran.stderr
    assert "config = Float8LinearConfig.from_recipe_name('rowwise')" in ran.stdout
    assert "FLOAT32_ISLANDS = ['head']" in ran.stdout
    assert scalertune.export(str(tmp_path / "amp.yaml"), "torchao").config == ROWWISE


def test_cli_refuses_a_float16_yaml_to_torchao_in_one_line_with_status_2(tmp_path):
    (tmp_path / "f16.yaml").write_text("config: {dtype: float16}\n")
    refused = run_cli("export", "f16.yaml", "--to", "torchao", cwd=tmp_path, process=True)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_float32_answer_with_a_float8_best_amp_config_is_pointed_at_best_amp(tmp_path):
    """On a CPU the answer is float32 and the float8 config is evidence.best_amp: exporting
    the answer to torchao names the flag that exports the float8 one, which then works."""
    (tmp_path / "amp.yaml").write_text(
        "config: {dtype: float32, clip_norm: null}\n"
        "evidence:\n  best_amp:\n    " + SAMPLE.replace("\n", "\n    ")
    )
    refused = run_cli("export", "amp.yaml", "--to", "torchao", cwd=tmp_path, process=True)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().endswith(
        "its best AMP config (evidence.best_amp) is float8, export that one with --best-amp "
        "(best_amp=True)"
    ), refused.stderr
    assert scalertune.export(str(tmp_path / "amp.yaml"), "torchao", best_amp=True).config == (
        ROWWISE
    )
