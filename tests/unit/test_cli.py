"""The command line: help that reads like a man page, and one-line errors for bad input."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import HERE, run_cli, spec


def test_help_explains_the_commands_and_exit_statuses(tmp_path):
    top = run_cli("--help", cwd=tmp_path)
    assert top.returncode == 0
    for needle in ("search", "report", "exit status", "130"):
        assert needle in top.stdout
    sub = run_cli("search", "--help", cwd=tmp_path)
    assert sub.returncode == 0
    for needle in (
        "FACTORY",
        "--storage",
        "--space",
        "--n-trials",
        "--device",
        "--output",
        "float32 reference",
        "examples:",
    ):
        assert needle in sub.stdout


#: Runs one command line through the executable's own entry point and prints which of the
#: heavy modules it imported.
_IMPORTS = (
    "import sys\n"
    "from scalertune.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(sorted(m for m in ('torch', 'numpy', 'optuna') if m in sys.modules), file=sys.stderr)"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["search", "--help"],
        ["diagnose", "--help"],
        ["export", "--help"],
        ["report", "--help"],
        ["dashboard", "--help"],
        ["search", "--steps", "0", "model.py:make_model"],
    ],
    ids=" ".join,
)
def test_help_and_usage_errors_answer_without_importing_torch(argv, tmp_path):
    """torch takes a second or more to import: help and bad input answer before it loads."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, *argv], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.stderr.splitlines()[-1] == "[]", done.stderr


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("no_such_model.py:make_model", "no such file: no_such_model.py"),
        ("make_model", "cannot read factory 'make_model'"),
    ],
)
def test_a_factory_that_cannot_be_found_is_refused_before_torch_loads(factory, said, tmp_path):
    """A mistyped factory is the commonest bad input: one line, exit 2, in a fraction of a
    second (it took 3-6 s with torch imported first)."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS, "search", factory],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    said_line, imported = done.stderr.splitlines()[-2:]
    assert said in said_line and "torch" not in imported, done.stderr


def test_a_report_and_an_export_import_no_torch(tmp_path):
    """Neither trains nor replays: a study's report (with its YAML and pictures) and an
    export for a named device read plain data."""
    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), tmp_path / "v1.journal")
    script = _IMPORTS.replace(
        "    main(sys.argv[1:])\n",
        "    main(['report', '--storage', 'v1.journal', '--study-name', 'short', '-o', 'r.yaml'])\n"
        "    main(['export', 'r.yaml', '--to', 'lightning', '--device', 'cuda'])\n",
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path
    )
    assert "torch" not in done.stderr.splitlines()[-1], done.stderr
    assert "MixedPrecision('16-mixed', device" in done.stdout
    assert (tmp_path / "r.yaml").exists()


def _bad(name):
    return spec(name, "bad_workloads.py")


BAD_INPUTS = [
    ("missing file", [os.path.join(HERE, "nope.py") + ":make_model"], "no such file"),
    ("no colon", ["model.py"], "write it as path/to/model.py:make_model"),
    ("missing factory", [_bad("make_model")], "has no attribute 'make_model'"),
    ("not callable", [_bad("NOT_CALLABLE")], "not callable"),
    ("factory raises", [_bad("raises")], "raised ValueError: dataset path /data/train is missing"),
    ("wrong shape", [_bad("wrong_shape")], "returned a list"),
    ("unknown key", [_bad("unknown_key")], "unknown key.s. 'lr'"),
    ("empty batches", [_bad("empty_batches")], "'batches' is empty"),
    ("one-shot batches", [_bad("one_shot_batches")], "one-shot iterator"),
    ("non-scalar loss", [_bad("non_scalar_loss")], r"shape \(8, 1\), not a scalar"),
    ("non-tensor loss", [_bad("non_tensor_loss")], "the loss is a float, not a tensor"),
    (
        "a step returning (logits, loss)",
        [_bad("step_returns_tuple")],
        r"the step returned a tuple of 2, not the loss: return the scalar loss tensor alone",
    ),
    (
        "a step returning per-sample losses",
        [_bad("step_returns_non_scalar")],
        r"the loss has shape \(8,\), not a scalar",
    ),
    ("no trainable parameters", [_bad("no_trainable_parameters")], "no trainable parameters"),
    ("foreign optimizer", [_bad("foreign_optimizer")], "not the model's"),
    (
        "a Hugging Face output without labels",
        [_bad("model_output_without_labels")],
        r"the loss is a NoneType.*Hugging Face output, whose loss is None unless the model is "
        r"given labels",
    ),
    ("unknown space", [spec("healthy"), "--space", "fp8"], "unknown search space 'fp8'"),
    (
        "missing space file",
        [spec("healthy"), "--space", "spaces/mine.yaml"],
        "no such search space file",
    ),
    ("unknown device", [spec("healthy"), "--device", "tpu"], "unknown device 'tpu'"),
    (
        "bad option",
        [spec("healthy"), "--n-trails", "3"],
        "unrecognized arguments: --n-trails 3: did you mean --n-trials",
    ),
    (
        "an option abbreviated",
        [spec("healthy"), "--step", "50"],
        "unrecognized arguments: --step 50: did you mean --steps",
    ),
    ("a factory mistyped", [_bad("make_modle")], "has no attribute 'make_modle'"),
    (
        "a factory file mistyped",
        [os.path.join(HERE, "workload.py") + ":healthy"],
        r"no such file: .*workload\.py \(did you mean 'workloads\.py'",
    ),
    ("too few steps", [spec("healthy"), "--steps", "5"], "--steps must be an integer from 20"),
]
if not torch.cuda.is_available():
    BAD_INPUTS.append(("cuda without cuda", [spec("healthy"), "--device", "cuda"], "no CUDA"))


def test_a_model_wrapped_for_ranks_searched_as_one_process_is_told_how_to_give_ranks(tmp_path):
    """A new user who left --nnodes off one host read only torch's "Default process group has
    not been initialized". In a process of its own: a process group another test left open
    in this one would let the wrap succeed."""
    proc = run_cli("search", _bad("wrapped_for_ranks"), cwd=tmp_path, process=True)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert __import__("re").search(
        r"process group has not been initialized.*: it wraps its model for ranks, and this "
        r"search runs one process: give --nproc-per-node K",
        line,
    ), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("label, args, message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_no_study(tmp_path, label, args, message):
    proc = run_cli("search", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert proc.stdout == ""
    assert not (tmp_path / "scalertune.db").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "init_scale: {low: 0, high: 8}",
            "init_scale must be a number, finite and at least 2**-126",
        ),
        ("growth_factor: 1.0", "growth_factor must be > 1"),
        ("backoff_factor: {low: 0.5, high: 1.5}", "backoff_factor must be in"),
        ("growth_interval: {low: 10, high: 1}", "is greater than high"),
        ("dtype: {choices: [half]}", "unknown dtype 'half'"),
        ("init_scale_max: 3", "unknown key"),
    ],
)
def test_invalid_space_file_is_refused_before_anything_runs(tmp_path, text, message):
    (tmp_path / "space.yaml").write_text(text)
    proc = run_cli("search", spec("healthy"), "--space", "space.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "scalertune.db").exists()


def test_storage_password_is_never_printed(tmp_path):
    url = "postgresql://alice:s3cret-pw@127.0.0.1:1/optuna"
    proc = run_cli("search", spec("healthy"), "--storage", url, cwd=tmp_path)
    assert proc.returncode == 2
    assert "s3cret-pw" not in proc.stderr + proc.stdout
    assert "alice:***@" in proc.stderr


def test_report_on_a_missing_study_is_a_usage_error_and_creates_nothing(tmp_path):
    proc = run_cli("report", "--study-name", "nothing", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no such database: sqlite:///scalertune.db" in proc.stderr
    assert not (tmp_path / "scalertune.db").exists()


def test_a_storage_path_ending_in_db_is_sqlite_and_an_existing_database_opens(tmp_path):
    """``--storage study.db`` is ``sqlite:///study.db``: a report on a study in it works,
    where it was once taken for a journal file and refused."""
    import optuna

    optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}")
    ran = run_cli("report", "--storage", "study.db", "--study-name", "s", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "no float32 reference yet" in ran.stdout


def test_counts_are_singular_where_there_is_one():
    from scalertune._text import plural

    assert plural(1, "thread") == "1 thread" and plural(2, "run") == "2 runs"
    from scalertune._search._setup import describe_device

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert describe_device(torch.device("cpu")).endswith(", 1 thread)")
    finally:
        torch.set_num_threads(before)


def test_output_piped_into_a_reader_that_stops_ends_quietly(tmp_path):
    """``scalertune ... | head -1``: the reader gone, the command ends with no traceback."""
    script = (
        "import sys; from scalertune.cli import program; "
        "sys.argv = ['scalertune', '--help']; program()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    child.stdout.close()  # the reader stops before the first line
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) in (0, 1) and err == "", err


def test_each_option_of_a_search_is_a_keyword_of_search_and_a_flag_of_the_command():
    """search()'s keyword arguments are its options' record field by field, and the command
    builds that record from its flags: an option added to one is missed by neither."""
    import dataclasses
    import inspect

    import scalertune
    from scalertune._cli._flags import _dest
    from scalertune._cli._parser import parse
    from scalertune._search._options import SearchOptions

    fields = [f.name for f in dataclasses.fields(SearchOptions)]
    keywords = inspect.signature(scalertune.search).parameters.values()
    assert [p.name for p in keywords if p.kind is p.KEYWORD_ONLY] == fields
    flags = vars(parse(["search", "model.py:make_model"]))
    # what the command builds itself: the isolation from several flags, and where lines go
    built = {"isolation", "log", "progress"}
    assert [f for f in fields if f not in built and _dest(f) not in flags] == []


def test_a_factory_that_seeds_itself_is_said_once_as_it_shows_and_in_the_summary(tmp_path):
    """A factory calling ``torch.manual_seed`` trains float32 the same on every seed: the
    confirmation seeds then confirm nothing more than one seed. Said when the second seed's
    reference shows it and in the summary, not taken for a seed spread of zero in silence;
    the control, seeded by scalertune, says nothing of it."""
    said = "the factory does not follow the seed scalertune sets"
    for name, seeded_itself in (("seeds_itself", True), ("healthy", False)):
        ran = run_cli(
            "search",
            spec(name),
            "--space",
            "bfloat16",
            "--steps",
            "40",
            "--n-trials",
            "1",
            "--storage",
            tmp_path / f"{name}.db",
            "-o",
            tmp_path / f"{name}.yaml",
            "--device",
            "cpu",
            cwd=tmp_path,
        )
        assert ran.returncode == 0, ran.stderr
        if seeded_itself:
            (line,) = [x for x in ran.stderr.splitlines() if said in x]
            assert line.startswith("float32 trained the same on seeds 0, 1 (the same loss")
            assert "float32 trained the same on seeds 0, 1, 2 (the same loss" in ran.stdout
        else:
            assert said not in ran.stderr + ran.stdout


def test_report_on_a_study_whose_reference_is_damaged_says_so_not_that_there_is_none(tmp_path):
    """The stored old study with its seed-0 reference's loss curve damaged (as whoever can
    write the journal would): ``report`` names the damage and says there is no sound
    reference, not that there is none yet; exit 0, no traceback."""
    import json

    lines = (pathlib.Path(HERE) / "data" / "study_v1.journal").read_text().splitlines()
    first = next(
        i
        for i, line in enumerate(lines)
        if "scalertune.losses" in (json.loads(line).get("system_attrs") or {})
    )
    record = json.loads(lines[first])
    record["system_attrs"]["scalertune.losses"] = "junk"
    lines[first] = json.dumps(record, separators=(",", ":"))
    (tmp_path / "v1.journal").write_text("\n".join(lines) + "\n")
    ran = run_cli("report", "--storage", "v1.journal", "--study-name", "short", cwd=tmp_path)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert "no sound float32 reference: nothing to compare with" in ran.stdout
    assert "no float32 reference yet" not in ran.stdout
    assert "Damaged evidence, left out: trial #0's scalertune.losses is damaged" in ran.stdout


def test_a_factory_whose_training_is_shorter_than_a_trial_is_searched_over_all_of_it(tmp_path):
    """A Trainer's ``max_steps`` of 150 (here a declared horizon of 60) is fewer than a
    trial's default 200 steps: the trials train all of it, said in one line, where the
    search was refused and its advice (``--horizon``) refused too."""
    (tmp_path / "model.py").write_text(
        "import torch\n\n\ndef make_model():\n"
        "    w = torch.randn(4, 1)\n"
        "    xs = [torch.randn(16, 4) for _ in range(4)]\n"
        "    batches = [(x, x @ w) for x in xs]\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    return {'model': model, 'optimizer': torch.optim.Adam(model.parameters(), lr=0.05),\n"
        "            'loss_fn': torch.nn.functional.mse_loss, 'batches': batches,\n"
        "            'horizon': 60}\n"
    )

    def search(*more):
        return run_cli(
            "search",
            "model.py:make_model",
            "--space",
            "bfloat16",
            "--n-trials",
            "1",
            "--device",
            "cpu",
            *more,
            cwd=tmp_path,
        )

    ran = search()
    assert ran.returncode == 0, ran.stderr
    assert (
        "the factory's training is 60 steps, fewer than a trial's default 200: each trial "
        "trains all 60 (--steps chooses fewer)"
    ) in ran.stderr
    assert "60 steps per trial" in ran.stdout
    # a horizon asked past the factory's training is searched, and said to be
    ran = search("--steps", "40", "--horizon", "80", "--study-name", "longer")
    assert ran.returncode == 0, ran.stderr
    assert "--horizon 80 is longer than the factory's training (60 steps)" in ran.stderr
