"""A nanoGPT user's search (``tests/nanogpt.py``: its model, optimizer groups and train.py
step with gradient accumulation, a learning rate kept by an ``iter_num`` of the step's own,
clipping at 1.0), as the command line runs it over a horizon, each run in a process of its
own: what every factory instance trained, what stdout holds, a rerun with another horizon,
and the result file in another model's training code."""

import warnings

import nanogpt
import pytest
import yaml
from conftest import run_cli, spec

import scalertune
from scalertune._amp._fingerprint import fingerprint

HORIZON = 400
# one xdist worker for the whole file: its module fixture is one search
pytestmark = pytest.mark.xdist_group("nanogpt")
FACTORY = spec("make_recording", "nanogpt.py")


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One --isolate search at --horizon 400 (about 30 s on one core); the log of every step
    call of every factory instance, in this process and the runs' own."""
    folder = tmp_path_factory.mktemp("nanogpt")
    log = folder / "steps.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(nanogpt.LOG_ENV, str(log))
        ran = run_cli(
            "search",
            FACTORY,
            "--steps",
            "20",
            "--horizon",
            str(HORIZON),
            "--space",
            "bfloat16",
            "--n-trials",
            "1",
            "--device",
            "cpu",
            "--isolate",
            "-q",
            "-o",
            "amp.yaml",
            cwd=folder,
            process=True,
            timeout=600,
        )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return folder, ran, nanogpt.read_log(log)


def test_every_factory_instance_trains_each_batch_once_in_order(searched):
    """Every instance's step sees the batches' numbers go up by one: the reference's start-up
    probe runs on an instance of its own, so the reference trains batches 0-399 once (its
    step's iter_num, and so its learning rate, in step with them); a run that starts later
    (a branch, a continuation) starts from a fresh instance rewound through its state dicts,
    iter_num included, which the factory gives under ``schedulers``."""
    _, _, seen = searched
    assert len(seen) > 8  # the probe, the reference, the timing, trials, branches...
    for instance, calls in seen.items():
        batches = [b for b, _ in calls]
        assert batches == list(range(batches[0], batches[0] + len(batches))), instance
    runs = [calls for calls in seen.values() if len(calls) == HORIZON]
    assert [[i for _, i in calls] for calls in runs] == [list(range(HORIZON))]
    later = [calls for calls in seen.values() if calls[0][0] > 0]
    assert later and all(i == b for calls in later for b, i in calls)


def test_the_factorys_own_prints_stay_out_of_the_summary(searched):
    """nanoGPT's model prints its size as it is built: in the search's process and in every
    run's, that goes to stderr; stdout is the summary and what was written."""
    _, ran, _ = searched
    assert "number of parameters" not in ran.stdout
    assert ran.stderr.count("number of parameters") > 8
    assert ran.stdout.startswith("scalertune study ")


def test_a_rerun_with_another_horizon_is_refused_and_the_yaml_kept(searched):
    folder, _, _ = searched
    before = (folder / "amp.yaml").read_bytes()
    again = run_cli(
        "search",
        FACTORY,
        "--steps",
        "20",
        "--horizon",
        "1000",
        "--space",
        "bfloat16",
        "--n-trials",
        "1",
        "--device",
        "cpu",
        "-o",
        "amp.yaml",
        cwd=folder,
    )
    assert again.returncode == 2
    (line,) = again.stderr.strip().splitlines()[-1:]
    assert "was created with horizon=400, not 1000: rerun with the same horizon" in line
    assert "Traceback" not in again.stderr and again.stdout == ""
    assert (folder / "amp.yaml").read_bytes() == before


def test_the_yaml_names_its_model_and_another_models_training_is_warned(searched):
    """``evidence.model`` is the searched model's fingerprint; the runtime built from the
    file says so in one warning when it prepares another model, and nothing for its own."""
    folder, _, _ = searched
    path = str(folder / "amp.yaml")
    with open(path, encoding="utf-8") as f:
        evidence = yaml.safe_load(f)["evidence"]
    own = nanogpt.GPT(nanogpt.GPTConfig())
    assert evidence["model"] == fingerprint(own) and evidence["horizon"] == HORIZON
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scalertune.load(path, device="cpu").prepare(own)
    # a float32 answer says, at load, that its check has nothing to compare: not about models
    assert not [w for w in caught if not issubclass(w.category, scalertune.AmpCheckWarning)]
    wider = nanogpt.GPT(nanogpt.GPTConfig(n_embd=48))
    amp = scalertune.load(path, device="cpu")
    with pytest.warns(UserWarning, match=r"amp.yaml was searched on another model") as caught:
        amp.prepare(wider)
        amp.prepare(wider)
    assert len(caught) == 1 and len(str(caught[0].message).splitlines()) == 1


def test_a_yaml_is_not_overwritten_with_narrower_evidence(searched):
    """Another study's answer over steps 0-20 written to the file that holds steps 0-400 is
    refused in one line, the file as it was."""
    folder, _, _ = searched
    before = (folder / "amp.yaml").read_bytes()
    short = run_cli(
        "search",
        spec("healthy"),
        "--steps",
        "20",
        "--space",
        "bfloat16",
        "--n-trials",
        "1",
        "--device",
        "cpu",
        "-o",
        "amp.yaml",
        cwd=folder,
    )
    assert short.returncode == 2, short.stderr
    assert "holds evidence over steps 0-400" in short.stderr.strip().splitlines()[-1]
    assert (folder / "amp.yaml").read_bytes() == before
