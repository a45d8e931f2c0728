"""diagnose on third-party architectures and the shipped examples, each checked against a
plain run of real GradScaler steps at the same scale (random weights, nothing downloaded)."""

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest
import third_party
from conftest import ROOT, amp_answer, example
from gradscaler import gradscaler, one_thread  # noqa: F401 - an autouse fixture

import scalertune
from scalertune import AmpConfig, _policy
from scalertune._storage._open import load_existing_study

hugging_face = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="needs transformers (pip install -e '.[test]')",
)

T5_FFN_OUT = [
    "encoder.block.0.layer.1.DenseReluDense.wo",
    "encoder.block.1.layer.1.DenseReluDense.wo",
    "decoder.block.0.layer.2.DenseReluDense.wo",
    "decoder.block.1.layer.2.DenseReluDense.wo",
]


@hugging_face
def test_gpt2_returning_its_own_loss_is_clean_at_the_default_scale():
    d = scalertune.diagnose(third_party.gpt2, device="cpu")
    assert d.kind == "clean" and d.culprits == [] and d.skipped == 0
    assert gradscaler(third_party.gpt2, AmpConfig()) == (0, True)
    # the ModelOutput's loss is not a gradient: d loss / d loss = 1 would dwarf the logits'
    assert d.grad_absmax < 0.5
    assert "gradient overflow" not in d.verdict


@hugging_face
def test_t5_names_every_overflowing_feed_forward_output_as_one_pattern():
    d = scalertune.diagnose(third_party.t5, device="cpu")
    assert d.kind == "forward"
    assert sorted(d.culprits) == sorted(T5_FFN_OUT)
    assert d.islands == ["*.DenseReluDense.wo"]
    assert "--fp32-modules '*.DenseReluDense.wo'" in d.verdict
    assert d.bfloat16_finite and "bfloat16 stays finite" in d.verdict
    rows = {m.name: m for m in d.modules}
    assert all(rows[n].forward["bfloat16"].over > 0 for n in T5_FFN_OUT)
    # GradScaler agrees: every float16 step overflows without the islands, none with them
    skipped, finite = gradscaler(third_party.t5, AmpConfig())
    assert not finite and skipped == d.skipped == d.steps
    check = next(c for c in d.checks if c.islands == ("*.DenseReluDense.wo",))
    assert check.forward_finite
    assert gradscaler(third_party.t5, AmpConfig(fp32_modules=("*.DenseReluDense.wo",))) == (
        check.skipped,
        True,
    )


def test_transformer_encoder_feed_forward_overflow_is_islanded_layer_by_layer():
    d = scalertune.diagnose(third_party.transformer_encoder, device="cpu")
    assert d.kind == "forward"
    assert d.culprits == ["encoder.layers.0.linear2", "encoder.layers.1.linear2"]
    assert d.islands == ["encoder.layers.*.linear2"]
    assert d.first_forward_nonfinite == "encoder.layers.0.linear2"
    assert gradscaler(third_party.transformer_encoder, AmpConfig())[1] is False
    check = next(c for c in d.checks if c.islands == ("encoder.layers.*.linear2",))
    assert gradscaler(
        third_party.transformer_encoder, AmpConfig(fp32_modules=("encoder.layers.*.linear2",))
    ) == (check.skipped, True)


def test_the_articles_mlp_overflows_its_weight_gradients_at_65536():
    d = scalertune.diagnose(third_party.article_mlp, device="cpu")
    assert d.kind == "gradient-overflow" and d.culprits == []
    assert d.skipped == d.steps == gradscaler(third_party.article_mlp, AmpConfig())[0]
    assert set(d.overflowing_gradients) <= {"0", "2"} and d.overflowing_gradients
    rows = {m.name: m for m in d.modules}
    assert rows["2"].params["float16"].nonfinite > 0
    assert _policy.SCALE_FLOOR <= d.suggested_init_scale < 2.0**16
    assert gradscaler(third_party.article_mlp, AmpConfig(init_scale=d.suggested_init_scale)) == (
        0,
        True,
    )


def test_a_resnets_parameter_gradients_overflow_where_no_activation_does():
    d = scalertune.diagnose(third_party.resnet, device="cpu")
    assert d.kind == "gradient-overflow" and d.culprits == []
    assert d.skipped == gradscaler(third_party.resnet, AmpConfig())[0] > 0
    rows = {m.name: m for m in d.modules}
    # the activations' gradients all fit; parameter gradients (sums over every pixel) do not
    assert all(
        not m.backward.get("float16") or m.backward["float16"].nonfinite == 0 for m in d.modules
    )
    assert d.overflowing_gradients and all(
        rows[n].params["float16"].nonfinite for n in d.overflowing_gradients
    )
    assert gradscaler(third_party.resnet, AmpConfig(init_scale=d.suggested_init_scale)) == (0, True)


def test_codepoints_gradients_overflow_even_unscaled_and_bfloat16_is_named():
    codepoints = example("codepoints")
    d = scalertune.diagnose(codepoints.make_model, device="cpu")
    assert d.kind == "gradient-overflow"
    assert d.skipped == gradscaler(codepoints.make_model, AmpConfig())[0] == d.steps
    assert d.suggested_init_scale < 1 and "bfloat16 stays finite" in d.verdict
    assert d.suggested_init_scale >= _policy.SCALE_FLOOR
    assert gradscaler(codepoints.make_model, AmpConfig(init_scale=d.suggested_init_scale)) == (
        0,
        True,
    )


def test_the_classifier_example_is_clean_at_the_default_scale():
    classifier = example("classifier")
    d = scalertune.diagnose(classifier.make_model, device="cpu")
    assert d.kind == "clean" and d.skipped == 0
    assert gradscaler(classifier.make_model, AmpConfig())[0] == 0


@hugging_face
def test_following_diagnoses_advice_on_t5_trains_float16_to_the_target(tmp_path):
    spec = os.path.join(ROOT, "tests", "third_party.py") + ":t5"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "scalertune", "diagnose", spec, "--device", "cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    command = re.search(r"^Next: scalertune (search .*)$", proc.stdout, re.M).group(1)
    assert command == (
        f"search {spec} --fp32-modules '*.DenseReluDense.wo' --study-name third_party:t5+fp32"
    )
    # Kept small, and float16 only: the islands are what is on trial, not bfloat16.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            *shlex.split(command),
            "--space",
            "float16",
            "--n-trials",
            "2",
            "--steps",
            "20",
            "--device",
            "cpu",
            "--output",
            "amp.yaml",
            "--storage",
            f"sqlite:///{tmp_path / 'study.db'}",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result = scalertune.analyze(
        load_existing_study(f"sqlite:///{tmp_path / 'study.db'}", "third_party:t5+fp32")
    )
    islanded = [o for o in result.ranking if o.config.fp32_modules]
    assert islanded and not any(o.prune_kind == "forward" for o in islanded)
    # float32 is the answer on this CPU; the best AMP config that held is the islanded one
    config = scalertune.load_config(str(tmp_path / "amp.yaml"), best_amp=True)
    assert config.dtype == "float16" and config.fp32_modules == ("*.DenseReluDense.wo",)
    assert amp_answer(result) is not None
    assert amp_answer(result).steps_to_target is not None
