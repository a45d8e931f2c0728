"""float8 from the command line to training code: `scalertune search --space float8` on the
massive-activation regression (one row in 16 carries 1e6, tests/float8_workloads.py), then the
best AMP config it wrote, loaded as training code loads it, trained past the search's steps
against float32 and against torchao's default recipe."""

import pytest
import torch
import yaml
from conftest import run_cli, spec
from float8_workloads import MASSIVE, workload

import scalertune
from scalertune import AmpConfig, AmpRuntime

pytest.importorskip("torchao")

#: The search's trials, and the batches the factory makes for them.
SEARCHED = 60
#: How far the loaded answer trains: past the search's evidence.
TRAINED = 300


def _tail_loss(amp, seed=0):
    """The mean loss of the last 100 of ``TRAINED`` steps of the workload under ``amp``."""
    torch.manual_seed(seed)
    parts = workload(TRAINED, lambda step: MASSIVE)
    model, optimizer, loss_fn = amp.prepare(parts["model"]), parts["optimizer"], parts["loss_fn"]
    losses = []
    for x, y in parts["batches"]:
        optimizer.zero_grad(set_to_none=True)
        loss = amp.loss(lambda x=x, y=y: loss_fn(model(x), y))
        amp.backward(loss)
        amp.step(optimizer)
        losses.append(float(loss.detach()))
    return sum(losses[-100:]) / 100


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:float8. 6 left out of float8")  # asserted from the CLI
def test_a_float8_search_finds_rowwise_where_torchaos_default_fails_and_the_answer_trains(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SCALERTUNE_FLOAT8_STEPS", str(SEARCHED))  # the factory's batches
    ran = run_cli(
        "search", spec("make_model", "float8_workloads.py"), "--space", "float8",
        "--steps", SEARCHED, "--storage", "f8.db", "-o", "f8.yaml", cwd=tmp_path, process=True,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    out, said = ran.stdout, ran.stdout + ran.stderr
    # torchao's default recipe (tensorwise): the massive row's scale flushes the rest to zero
    assert "torchao-default: pruned: float8 tensorwise, layer '0': input amax 1e+06" in out, out
    # the last layer (64 -> 1) cannot take a float8 matmul: said, with why
    assert "6 left out of float8 (sizes not multiples of 16" in said, said
    # float8 is emulated on a CPU: no speed claimed, and the answer is float32
    assert "emulated" in out and "no speed claimed" in out, out
    assert "Recommended: float32" in out, out

    path = str(tmp_path / "f8.yaml")
    with open(path) as f:
        best = yaml.safe_load(f)["evidence"]["best_amp"]
    config = best["config"]
    assert config["dtype"] == "float8", config
    assert set(config["float8"]) == {"recipe", "around", "round_scales_to_power_of_2"}, config

    float32 = _tail_loss(AmpRuntime(AmpConfig(dtype="float32"), device="cpu"))
    answer = _tail_loss(scalertune.load(path, best_amp=True, device="cpu", storage=False))
    default = _tail_loss(AmpRuntime(AmpConfig(dtype="float8"), device="cpu"))
    assert answer < 1.10 * float32, (answer / float32, default / float32)
    assert default > 1.5 * float32, (answer / float32, default / float32)
