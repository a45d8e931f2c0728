"""Bad input, across every command and scalertune.load(): one line naming the problem, exit
status 2 (or UsageError from Python), no traceback, and nothing written: no database, no YAML,
no artifact folder, no file changed.

Every command-line row runs the command in a fresh folder, in this process
(:func:`scalertune.cli.main`); one row per command also runs the real executable in its own
process, to prove what a shell sees: the exit status and one line on stderr.
"""

import dataclasses
import os
import pathlib
import re

import optuna
import pytest
from conftest import HERE, run_cli, spec

import scalertune

HEALTHY = spec("healthy")
SECRET = "s3cr3t-PW"

#: ~600 bytes that stand for 9**6 strings once the aliases are expanded.
ALIAS_BOMB = "".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 6)]
)
RESULT = """scalertune: 1
config:
  dtype: float16
  init_scale: 4096.0
  growth_factor: 2.0
  backoff_factor: 0.5
  growth_interval: 2000
  clip_norm: null
"""


def _result(**changes):
    text = RESULT
    for key, value in changes.items():
        text = re.sub(rf"(?m)^  {key}: .*$", f"  {key}: {value}", text)
    return text


def _study_db(folder, name="scalertune.db"):
    """A real SQLite storage holding one (empty) study named ``s``."""
    optuna.create_study(study_name="s", storage=f"sqlite:///{folder / name}")


def _journal(folder, name="study.log"):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.create_study(
        study_name="s", storage=JournalStorage(JournalFileBackend(str(folder / name)))
    )


@dataclasses.dataclass
class Case:
    label: str
    args: list
    message: str  # a regex the one line of stderr must match
    files: dict = dataclasses.field(default_factory=dict)  # name -> text, bytes or a setup

    def prepare(self, folder):
        for name, content in self.files.items():
            path = folder / name
            if callable(content):
                content(folder)
            elif content is None:
                path.mkdir(parents=True, exist_ok=True)
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)


def _model(text):
    return {"model.py": text}


_POSITIVE = "--{} must be a positive finite number"
#: A result file's init_scale that is no number, or none GradScaler's float32 scale holds.
_NOT_A_SCALE = r"init_scale must be a number, finite and at least 2\*\*-126"
#: A loss scale GradScaler's float32 scale tensor holds as a normal number.
_SCALE = r"--init-scale must be a finite number >= 1\.17549e-38"
_EXITS_ON_IMPORT = "import sys\nsys.exit(3)\n"
_EXITS_IN_FACTORY = "import sys\n\ndef make_model():\n    sys.exit(5)\n"
_SPACE_OK = "dtype: {choices: [float16]}\n"
_DECLARES_HORIZON = """import torch

def make_model():
    model = torch.nn.Linear(4, 1)
    batches = [(torch.randn(16, 4), torch.randn(16, 1))]
    return {{"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
             "loss_fn": torch.nn.functional.mse_loss, "batches": batches,
             "horizon": {horizon}}}
"""
_NAN_IN_THE_DATA = """import torch

def make_model():
    model = torch.nn.Linear(4, 1)
    x = torch.randn(16, 4)
    x[3, 1] = float("nan")
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
            "loss_fn": torch.nn.functional.mse_loss, "batches": [(x, torch.randn(16, 1))]}
"""

SEARCH = [
    Case("seed negative", ["--seed", "-1"], r"--seed must be an integer from 0 to 4294967295"),
    Case("seed past numpy", ["--seed", "4294967296"], r"--seed must be an integer from 0"),
    Case("seed 2**70", ["--seed", str(2**70)], r"--seed must be an integer from 0"),
    Case("seed not a number", ["--seed", "abc"], r"argument --seed: invalid int value"),
    Case("n-trials negative", ["--n-trials", "-1"], r"--n-trials must be an integer >= 0"),
    Case("too few steps", ["--steps", "5"], r"--steps must be an integer from 20 to 1000000"),
    Case("too many steps", ["--steps", "100000000"], r"--steps must be an integer from 20"),
    Case("top negative", ["--top", "-1"], r"--top must be an integer >= 0"),
    Case(
        "trial-timeout negative",
        ["--isolate", "--trial-timeout", "-5"],
        r"--trial-timeout must be a positive finite number",
    ),
    Case(
        "trial-timeout zero",
        ["--isolate", "--trial-timeout", "0"],
        r"--trial-timeout must be a positive finite number",
    ),
    Case(
        "trial-timeout nan",
        ["--isolate", "--trial-timeout", "nan"],
        r"--trial-timeout must be a positive finite number",
    ),
    Case(
        "trial-memory zero",
        ["--isolate", "--trial-memory", "0"],
        r"--trial-memory must be a positive finite number",
    ),
    Case(
        "trial-memory inf",
        ["--isolate", "--trial-memory", "inf"],
        r"--trial-memory must be a positive finite number",
    ),
    Case("trial-timeout without isolate", ["--trial-timeout", "5"], r"need --isolate"),
    Case(
        "nproc-per-node zero",
        ["--nproc-per-node", "0"],
        r"--nproc-per-node must be an integer from 1 to 64",
    ),
    Case(
        "nproc-per-node past a node",
        ["--nproc-per-node", "1000"],
        r"--nproc-per-node must be an integer from 1 to 64",
    ),
    Case("timeout zero", ["--timeout", "0"], _POSITIVE.format("timeout")),
    Case("timeout inf", ["--timeout", "inf"], _POSITIVE.format("timeout")),
    Case(
        "-o is the database",
        ["-o", "scalertune.db"],
        r"is the study's storage",
        {"scalertune.db": _study_db},
    ),
    Case(
        "-o is the database, another spelling",
        ["--storage", "sqlite:///./data/s.db", "-o", "data/../data/s.db"],
        r"is the study's storage",
        {"data": None},
    ),
    Case(
        "-o is the journal file",
        ["--storage", "study.log", "-o", "study.log"],
        r"is the study's storage",
        {"study.log": _journal},
    ),
    Case(
        "-o is the journal's lock",
        ["--storage", "study.log", "-o", "study.log.lock"],
        r"is the study's storage",
    ),
    Case("-o is SQLite's write-ahead log", ["-o", "scalertune.db-wal"], r"is the study's storage"),
    Case(
        "-o into a missing folder",
        ["-o", "no/such/folder/amp.yaml"],
        r"the folder .*no/such/folder does not exist",
    ),
    Case("-o onto a folder", ["-o", "results"], r"--output results is a folder", {"results": None}),
    Case(
        "-o is the factory file",
        ["-o", "model.py"],
        r"is the study's factory file",
        {"model.py": pathlib.Path(HERE, "workloads.py").read_text()},
    ),
    Case(
        "-o is the space file",
        ["--space", "space.yaml", "-o", "space.yaml"],
        r"is the study's search space file",
        {"space.yaml": _SPACE_OK},
    ),
    Case(
        "-o inside the artifact folder",
        ["-o", "scalertune-artifacts/amp.yaml"],
        r"inside the artifact folder",
        {"scalertune-artifacts": None},
    ),
    Case("-o not a regular file", ["-o", "/dev/null"], r"not a regular file"),
    Case(
        "artifact-dir is a file",
        ["--artifact-dir", "notes.txt"],
        r"--artifact-dir notes.txt is a file",
        {"notes.txt": "x"},
    ),
    Case(
        "study name too long for Optuna",
        ["--study-name", "s" * 600],
        r"600 characters long; Optuna's storages hold at most 512",
    ),
    Case(
        "study name too long for a file name",
        ["--study-name", "s" * 300],
        r"exceed this file system's 255",
    ),
    Case(
        "space high .inf",
        ["--space", "space.yaml"],
        r"line 1: \.inf is not a finite number",
        {"space.yaml": "init_scale: {low: 1.0, high: .inf, log: true}\n"},
    ),
    Case(
        "space low .nan",
        ["--space", "space.yaml"],
        r"\.nan is not a finite number",
        {"space.yaml": "growth_factor: {low: .nan, high: 4.0}\n"},
    ),
    Case(
        "space step .inf",
        ["--space", "space.yaml"],
        r"\.inf is not a finite number",
        {"space.yaml": "backoff_factor: {low: 0.25, high: 0.75, step: .inf}\n"},
    ),
    Case(
        "space fixed value 1e39",
        ["--space", "space.yaml"],
        _NOT_A_SCALE,
        {"space.yaml": "init_scale: 1.0e+39\n"},
    ),
    Case(
        "space value a string",
        ["--space", "space.yaml"],
        r"init_scale must be a number",
        {"space.yaml": "init_scale: big\n"},
    ),
    Case(
        "space alias bomb",
        ["--space", "space.yaml"],
        r"aliases expand to more than",
        {"space.yaml": ALIAS_BOMB + "description: *l5\n"},
    ),
    Case(
        "space alias in itself",
        ["--space", "space.yaml"],
        r"refers to a value that contains",
        {"space.yaml": "description: &d [*d]\n"},
    ),
    Case(
        "space nested too deep",
        ["--space", "space.yaml"],
        r"nests its values too deeply",
        {"space.yaml": "description: " + "[" * 5000 + "]" * 5000 + "\n"},
    ),
    Case(
        "space over 1 MiB",
        ["--space", "space.yaml"],
        r"is larger than 1024 KiB",
        {"space.yaml": "# " + "x" * 2**20 + "\n"},
    ),
    Case(
        "space not UTF-8",
        ["--space", "space.yaml"],
        r"is not UTF-8 text",
        {"space.yaml": b"dtype: \xff\xfe\n"},
    ),
    Case(
        "space not YAML",
        ["--space", "space.yaml"],
        r"is not valid YAML at line",
        {"space.yaml": "dtype: [float16\n"},
    ),
    Case(
        "journal path is another file",
        ["--storage", "notes.txt"],
        r"not an Optuna journal file",
        {"notes.txt": "meeting notes\n"},
    ),
    Case("journal path is a folder", ["--storage", "runs"], r"runs is a folder", {"runs": None}),
    Case(
        "journal of records Optuna did not write",
        ["--storage", "runs.log"],
        r"cannot open journal file runs\.log: .*\(a record in it is not one Optuna wrote",
        {"runs.log": '{"op_code": 99}\n'},
    ),
    Case(
        "in-memory SQLite",
        ["--storage", "sqlite:///:memory:"],
        r"is an in-memory SQLite database, gone when this process ends",
    ),
    Case(
        "URL that lost its scheme",
        ["--storage", f"bob:{SECRET}@127.0.0.1/db"],
        r"storage \*\*\*@127\.0\.0\.1/db looks like a database URL without its scheme",
    ),
    Case(
        "password with an empty user",
        ["--storage", f"postgresql://:{SECRET}@127.0.0.1:1/optuna"],
        r"cannot open storage",
    ),
    Case(
        "password in the query",
        ["--storage", f"postgresql://bob@127.0.0.1:1/optuna?password={SECRET}"],
        r"cannot open storage",
    ),
    Case(
        "password in a malformed URL",
        ["--storage", f"postgresql://bob:{SECRET}@127.0.0.1:notaport/optuna"],
        r"cannot open storage postgresql://\*\*\*",
    ),
    # A one-letter password is hidden where it stands alone, not in every word of the line.
    Case(
        "one-letter password",
        ["--storage", "postgresql://bob:e@127.0.0.1:1/optuna"],
        r"cannot open storage postgresql://bob:\*\*\*@127\.0\.0\.1:1/optuna: "
        r"\(psycopg\.OperationalError\) connection",
    ),
    Case(
        "'@' in the password",
        ["--storage", f"postgresql://bob:p@{SECRET}@127.0.0.1:1/db"],
        r"holds an '@': write it as %40",
    ),
    Case(
        "URL missing a slash",
        ["--storage", f"postgresql:/bob:{SECRET}@127.0.0.1:1/db"],
        r"looks like a database URL without '://'",
    ),
    Case(
        "module calls sys.exit on import",
        [],
        r"sys\.exit\(3\) was called",
        _model(_EXITS_ON_IMPORT),
    ),
    Case("factory calls sys.exit", [], r"sys\.exit\(5\) was called", _model(_EXITS_IN_FACTORY)),
    Case(
        "factory raises a BaseException subclass",
        [],
        r"raised Odd: odd",
        _model(
            "class Odd(BaseException):\n    pass\n\n\ndef make_model():\n    raise Odd('odd')\n"
        ),
    ),
    Case(
        "factory's horizon past the flag's range",
        [],
        r"the factory model\.py:make_model "
        r"declares horizon 1000000000000, which must be an integer from 20 to 10000000",
        _model(_DECLARES_HORIZON.format(horizon=10**12)),
    ),
    Case(
        "factory's horizon shorter than the trial asked for",
        ["--steps", "100"],
        r"declares horizon 50, shorter than a trial's 100 steps \(--steps\): pass --steps 50 "
        r"or fewer",
        _model(_DECLARES_HORIZON.format(horizon=50)),
    ),
    Case(
        "factory's horizon shorter than any trial",
        [],
        r"declares horizon 10, which must be an integer from 20",
        _model(_DECLARES_HORIZON.format(horizon=10)),
    ),
    Case(
        "NaN loss on the first batch",
        [],
        r"the loss is nan on the first batch, in float32 "
        r"with the initial weights, before any optimizer step",
        _model(_NAN_IN_THE_DATA),
    ),
    Case("artifact store without a bucket", ["--artifact-dir", "s3://"], r"name a bucket"),
    Case(
        "artifact store in a bucket's folder",
        ["--artifact-dir", "s3://runs/amp"],
        r"--artifact-dir s3://runs/amp: name a bucket, as s3://BUCKET",
    ),
    Case("unknown device", ["--device", "tpu"], r"unknown device 'tpu'"),
    Case("missing float32 island", ["--fp32-modules", "nosuch"], r"fp32_modules names 'nosuch'"),
    Case("float32 islands of no name", ["--fp32-modules", ","], r"--fp32-modules ',' names no"),
    Case("study name of dots", ["--study-name", ".."], r"--study-name '\.\.' names nothing"),
    Case("study name empty", ["--study-name", ""], r"--study-name '' names nothing"),
]

DIAGNOSE = [
    Case("init-scale inf", ["--init-scale", "inf"], _SCALE),
    Case("init-scale nan", ["--init-scale", "nan"], _SCALE),
    Case("init-scale zero", ["--init-scale", "0"], _SCALE),
    Case("init-scale negative", ["--init-scale", "-1"], _SCALE),
    Case("init-scale below float32's normal numbers", ["--init-scale", "1e-40"], _SCALE),
    Case("init-scale past float32", ["--init-scale", "1e39"], r"--init-scale must be at most"),
    Case("steps zero", ["--steps", "0"], r"--steps must be an integer from 1"),
    Case("seed negative", ["--seed", "-1"], r"--seed must be an integer from 0"),
    Case("seed past numpy", ["--seed", "4294967296"], r"--seed must be an integer from 0"),
    Case(
        "module calls sys.exit on import",
        [],
        r"sys\.exit\(3\) was called",
        _model(_EXITS_ON_IMPORT),
    ),
]

EXPORT = [
    Case(
        "growth_interval .nan",
        ["--to", "torch"],
        r"\.nan is not a finite number",
        {"r.yaml": _result(growth_interval=".nan")},
    ),
    Case(
        "init_scale .inf",
        ["--to", "torch"],
        r"\.inf is not a finite number",
        {"r.yaml": _result(init_scale=".inf")},
    ),
    Case(
        "growth_interval not an integer",
        ["--to", "deepspeed"],
        r"growth_interval must be an integer",
        {"r.yaml": _result(growth_interval="2.5")},
    ),
    Case(
        "clip_norm negative",
        ["--to", "lightning"],
        r"clip_norm must be > 0",
        {"r.yaml": _result(clip_norm="-1.0")},
    ),
    Case(
        "init_scale a string",
        ["--to", "torch"],
        _NOT_A_SCALE,
        {"r.yaml": _result(init_scale="'4096'")},
    ),
    Case(
        "unknown dtype",
        ["--to", "accelerate"],
        r"unknown dtype 'half'",
        {"r.yaml": _result(dtype="half")},
    ),
    Case(
        "unknown config key",
        ["--to", "torch"],
        r"unknown config key\(s\) scale",
        {"r.yaml": RESULT + "  scale: 2\n"},
    ),
    Case("no config", ["--to", "torch"], r"has no 'config' mapping", {"r.yaml": "a: 1\n"}),
    Case("missing file", ["--to", "torch"], r"no such file: r\.yaml"),
    Case("a folder", ["--to", "torch"], r"r\.yaml is a folder", {"r.yaml": None}),
    Case(
        "alias bomb",
        ["--to", "torch"],
        r"aliases expand to more than",
        {"r.yaml": RESULT + ALIAS_BOMB + "evidence: *l5\n"},
    ),
    Case("not UTF-8", ["--to", "torch"], r"is not UTF-8 text", {"r.yaml": b"\xff\xfe\x00"}),
    Case("over 1 MiB", ["--to", "torch"], r"is larger than", {"r.yaml": b"#" * (2**20 + 5)}),
    Case(
        "unknown framework", ["--to", "jax"], r"argument --to: invalid choice", {"r.yaml": RESULT}
    ),
    Case(
        "micro-batch size zero",
        ["--to", "deepspeed", "--micro-batch-size", "0"],
        r"--micro-batch-size must be an integer >= 1",
        {"r.yaml": RESULT},
    ),
]

REPORT = [
    Case(
        "-o is the database",
        ["--study-name", "s", "-o", "scalertune.db"],
        r"is the study's storage",
        {"scalertune.db": _study_db},
    ),
    Case(
        "-o is the journal file",
        ["--storage", "study.log", "--study-name", "s", "-o", "study.log"],
        r"is the study's storage",
        {"study.log": _journal},
    ),
    Case(
        "-o into a missing folder",
        ["--study-name", "s", "-o", "nope/r.yaml"],
        r"does not exist",
        {"scalertune.db": _study_db},
    ),
    Case(
        "-o onto a folder",
        ["--study-name", "s", "-o", "out"],
        r"is a folder",
        {"scalertune.db": _study_db, "out": None},
    ),
    Case("top negative", ["--study-name", "s", "--top", "-1"], r"--top must be an integer >= 0"),
    Case("no such database", ["--study-name", "s"], r"no such database: sqlite:///scalertune.db"),
    Case(
        "no such journal",
        ["--storage", "nope.log", "--study-name", "s"],
        r"no such journal file: nope\.log",
    ),
    Case(
        "no such study",
        ["--study-name", "other"],
        r"no study 'other'",
        {"scalertune.db": _study_db},
    ),
    Case("study name too long", ["--study-name", "x" * 600], r"at most 512"),
    Case(
        "password in the query",
        ["--study-name", "s", "--storage", f"postgresql://bob@127.0.0.1:1/o?password={SECRET}"],
        r"cannot open storage",
    ),
]

DASHBOARD = [
    Case("port past 65535", ["--port", "99999"], r"--port must be an integer from 1 to 65535"),
    Case("port zero", ["--port", "0"], r"--port must be an integer from 1 to 65535"),
    Case("port negative", ["--port", "-1"], r"--port must be an integer from 1 to 65535"),
    Case("no such database", [], r"no such database"),
    Case(
        "artifact folder missing",
        ["--artifact-dir", "pics"],
        r"--artifact-dir pics is not a "
        "folder",
        {"scalertune.db": _study_db},
    ),
    Case("storage is a folder", ["--storage", "sqlite:///db"], r"is a folder", {"db": None}),
    Case(
        "host that is no address",
        ["--host", "999.1.1.1", "--port", "18093"],
        r"cannot serve at 999\.1\.1\.1:18093: 999\.1\.1\.1 is no address of this machine",
        {"scalertune.db": _study_db},
    ),
    Case(
        "host of no interface here",
        ["--host", "192.0.2.1", "--port", "18094"],  # TEST-NET-1: never this machine's
        r"cannot serve at 192\.0\.2\.1:18094: Cannot assign requested address",
        {"scalertune.db": _study_db},
    ),
]

COMMANDS = {
    "search": (["search", HEALTHY, "--device", "cpu"], SEARCH),
    "diagnose": (["diagnose", HEALTHY, "--device", "cpu"], DIAGNOSE),
    "export": (["export", "r.yaml"], EXPORT),
    "report": (["report"], REPORT),
    "dashboard": (["dashboard"], DASHBOARD),
}


def _snapshot(folder):
    """Every file and folder under ``folder`` with its size and modification time."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns)
    return found


def _check_case(prefix, case, folder, *, process=False):
    """Run one row; return what is wrong with its outcome, or None."""
    folder.mkdir()
    case.prepare(folder)
    before = _snapshot(folder)
    args = list(prefix)
    if "model.py" in case.files and prefix[0] in ("search", "diagnose"):
        args[1] = "model.py:make_model"
    ran = run_cli(*args, *case.args, cwd=folder, process=process)
    lines = ran.stderr.strip().splitlines()
    problems = []
    if ran.returncode != 2:
        problems.append(f"exit {ran.returncode}")
    if "Traceback" in ran.stderr or len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr")
    elif not re.search(case.message, lines[0]):
        problems.append(f"message does not match {case.message!r}")
    if ran.stdout:
        problems.append("printed to stdout")
    if SECRET in ran.stdout + ran.stderr:
        problems.append("printed the password")
    after = _snapshot(folder)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        problems.append(f"wrote {changed[:4]}")
    if problems:
        return f"{prefix[0]} / {case.label}: {'; '.join(problems)}\n    {ran.stderr.strip()[:600]}"
    return None


@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, command):
    prefix, cases = COMMANDS[command]
    outcomes = [_check_case(prefix, case, tmp_path / f"case{i}") for i, case in enumerate(cases)]
    failures = [o for o in outcomes if o]
    assert not failures, "\n".join(failures)


#: One row per command, run as the real executable: the exit status and the one line a shell
#: sees, not only what main() returns.
_IN_ITS_OWN_PROCESS = {
    "search": "seed negative",
    "diagnose": "init-scale nan",
    "export": "missing file",
    "report": "no such study",
    "dashboard": "port zero",
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_executable_exits_2_with_one_line_on_stderr(tmp_path, command):
    prefix, cases = COMMANDS[command]
    case = next(c for c in cases if c.label == _IN_ITS_OWN_PROCESS[command])
    assert _check_case(prefix, case, tmp_path / "case", process=True) is None


def test_the_table_covers_sixty_bad_inputs():
    assert sum(len(cases) for _, cases in COMMANDS.values()) + len(LOAD) >= 60


LOAD = [
    ("init_scale .inf", _result(init_scale=".inf"), r"\.inf is not a finite number"),
    (
        "init_scale 1e39",
        _result(init_scale="1.0e+39"),
        _NOT_A_SCALE,
    ),
    (
        "init_scale a string",
        _result(init_scale="'4096'"),
        _NOT_A_SCALE,
    ),
    (
        "init_scale true",
        _result(init_scale="true"),
        _NOT_A_SCALE,
    ),
    ("growth_interval .nan", _result(growth_interval=".nan"), r"\.nan is not a finite number"),
    ("growth_interval 2.5", _result(growth_interval="2.5"), r"growth_interval must be an integer"),
    (
        "growth_interval past int32",
        _result(growth_interval="4294967296"),
        r"growth_interval must be an integer >= 1 \(at most 2147483647\)",
    ),
    ("backoff_factor 1.5", _result(backoff_factor="1.5"), r"backoff_factor must be in \(0, 1\)"),
    ("fp32_modules a number", RESULT + "  fp32_modules: 5\n", r"fp32_modules must be module names"),
    (
        "guard floor negative",
        RESULT + "guard: {min_scale: -1.0, max_consecutive_skips: 50}\n",
        r"min_scale must be a finite number > 0",
    ),
    (
        "guard floor zero",
        RESULT + "guard: {min_scale: 0.0, max_consecutive_skips: 50}\n",
        r"min_scale must be a finite number > 0",
    ),
    (
        "guard skip limit zero",
        RESULT + "guard: {min_scale: 1.0, max_consecutive_skips: 0}\n",
        r"max_consecutive_skips must be an integer >= 1",
    ),
    ("guard not a mapping", RESULT + "guard: strict\n", r"'guard' needs min_scale"),
    ("alias bomb", RESULT + ALIAS_BOMB + "evidence: *l5\n", r"aliases expand to more than"),
    ("alias in itself", RESULT + "evidence: &e {x: *e}\n", r"refers to a value that contains"),
    ("config a list", "config: [1, 2]\n", r"has no 'config' mapping"),
    ("not YAML", "config: {dtype: float16\n", r"is not valid YAML"),
    ("a NUL byte", RESULT + "evidence: {x: 1}\x00\n", r"is not valid YAML"),
    ("a control byte", RESULT + "evidence: {x: \x07}\n", r"is not valid YAML"),
    ("5000 digits", _result(init_scale="9" * 5000), r"holds a number too long"),
    # Python reads these with no digit limit; an error writing them out in decimal has one
    ("5000 hex digits", _result(clip_norm="0x" + "f" * 5000), r"holds a number too long"),
    (
        "a binary format number",
        RESULT.replace("scalertune: 1", "scalertune: 0b" + "1" * 20000),
        r"holds a number too long",
    ),
    ("a float of 5000 digits", _result(init_scale="1" * 5000 + ".5"), r"holds a number too long"),
    (
        "a whole number YAML reads as text, for an integer knob",
        _result(growth_interval="2e3"),
        r"got '2e3' \(text: YAML reads this form of a number as text; write 2000\)",
    ),
    (
        "a number YAML reads as text",
        _result(init_scale="1e4"),
        r"got '1e4' \(text: YAML reads this form of a number as text; write 10000\)",
    ),
    (
        "a python tag",
        'config: !!python/object/apply:os.system ["echo planted"]\n',
        r"holds a tag \('tag:yaml.org,2002:python/object/apply:os.system'\) at line 1 that is "
        r"never read",
    ),
    ("a key that is a number", "config: {1: 2, dtype: float16}\n", r"unknown config key\(s\) 1"),
    (
        "a key written twice",
        RESULT + "config: {dtype: bfloat16}\n",
        r"the key 'config' is written twice",
    ),
    ("a future format", RESULT.replace("scalertune: 1", "scalertune: 2"), r"result format 2"),
    ("a format that is text", RESULT.replace("scalertune: 1", "scalertune: one"), r"as 'one'"),
    # no scalertune writes these: fixing the line helps, upgrading does not
    ("format 0", RESULT.replace("scalertune: 1", "scalertune: 0"), r"as 0, which no scalertune"),
    ("format null", RESULT.replace("scalertune: 1", "scalertune: null"), r"as None, which no"),
    (
        "a float8 block of a float16 config",
        "config: {dtype: float16, float8: {recipe: rowwise}}\n",
        r"a float8 block belongs to dtype float8",
    ),
]


@pytest.mark.parametrize("label, text, message", LOAD, ids=[row[0] for row in LOAD])
def test_load_refuses_a_bad_result_file_in_one_line(tmp_path, label, text, message):
    (tmp_path / "amp.yaml").write_text(text)
    before = _snapshot(tmp_path)
    with pytest.raises(scalertune.UsageError, match=message) as info:
        scalertune.load(str(tmp_path / "amp.yaml"), device="cpu")
    assert len(str(info.value).splitlines()) == 1
    assert str(tmp_path / "amp.yaml") in str(info.value)  # which file, in a program of several
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("path, message", [("missing.yaml", "no such file"), (".", "is a folder")])
def test_load_refuses_a_missing_result_file(tmp_path, path, message):
    with pytest.raises(scalertune.UsageError, match=message):
        scalertune.load(str(tmp_path / path), device="cpu")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "config, kwargs, message",
    [
        ("amp.yaml", {}, r"^AmpRuntime takes an AmpConfig, not str: .*scalertune.load\(path\)"),
        (None, {"check": False}, r"^check must be an in-run check .* takes False, 'act'"),
        (None, {"check": "act"}, r"^check must be an in-run check scalertune.load builds"),
        (None, {"guard": True}, r"^guard must be a scalertune.Guard or None, not bool"),
        (None, {"watch": 1}, r"^watch must be a watch scalertune.load builds, or None"),
    ],
)
def test_the_runtime_refuses_what_is_not_its_parts_before_a_step(config, kwargs, message):
    """``AmpRuntime(config, check=False)`` (``load``'s argument) built a runtime whose first
    step died in an AttributeError; each is one line, at once."""
    config = scalertune.AmpConfig(dtype="bfloat16") if config is None else config
    with pytest.raises(scalertune.UsageError, match=message) as info:
        scalertune.AmpRuntime(config, device="cpu", **kwargs)
    assert len(str(info.value).splitlines()) == 1


def test_the_search_api_refuses_bad_numbers_before_anything_runs(tmp_path):
    for kwargs, message in [
        ({"seed": -1}, "^seed must be"),
        ({"seed": 2**32}, "^seed must be"),
        ({"steps": 10**7}, "^steps must be"),
        ({"n_trials": -1}, "^n_trials must be"),
        ({"steps": 25.5}, "^steps must be an integer"),
        ({"timeout": 0}, "^timeout must be a positive"),
    ]:
        with pytest.raises(ValueError, match=message) as raised:
            scalertune.search(
                HEALTHY, storage=f"sqlite:///{tmp_path / 's.db'}", device="cpu", **kwargs
            )
        assert isinstance(raised.value, scalertune.UsageError)
        assert "--" not in str(raised.value)  # the Python parameter, not a flag
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("declared", ["0", "65", "'two'", "2.5"])
def test_a_factory_declaring_processes_out_of_range_is_refused_in_one_line(tmp_path, declared):
    """``make_model.nproc_per_node`` is read before any call (a DDP factory cannot be called
    outside its group) and held to --nproc-per-node's range."""
    (tmp_path / "model.py").write_text(
        "from workloads import healthy\n\n\n"
        "def make_model():\n    return healthy()\n\n\n"
        f"make_model.nproc_per_node = {declared}\n"
    )
    proc = run_cli("search", "model.py:make_model", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line
    assert re.fullmatch(
        r"scalertune search: error: the factory model\.py:make_model declares nproc_per_node "
        r".+, which must be an integer from 1 to 64: declare another, or pass --nproc-per-node",
        line,
    ), line
    assert not (tmp_path / "scalertune.db").exists()


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_that_starts_processes_outside_a_main_guard_is_refused_before_they_start(
    tmp_path, guarded
):
    """Each process a search starts imports the user's script again: a call to scalertune
    outside ``if __name__ == "__main__":`` would run again in each. It is refused in one
    line before any process starts; under the guard it goes on."""
    call = "refuse_unguarded()\nprint('went on')\n"
    body = (
        "if __name__ == '__main__':\n" + "".join(f"    {line}\n" for line in call.splitlines())
        if guarded
        else call
    )
    (tmp_path / "script.py").write_text(
        "from scalertune._processes._main_guard import refuse_unguarded\n\n" + body
    )
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    if guarded:
        assert proc.returncode == 0 and proc.stdout == "went on\n", proc.stderr
    else:
        assert proc.returncode == 1 and "went on" not in proc.stdout
        assert proc.stderr.strip().splitlines()[-1] == (
            "scalertune._errors.UsageError: script.py calls scalertune outside an if __name__ == "
            '"__main__": block, and each process the search starts (--isolate, '
            "--nproc-per-node) imports the script again and would run it again: put the call "
            "under that block"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "body, said",
    [
        ("import time\n    time.sleep(600)", "timed out: the trial ran past its 3 s limit"),
        ("import os\n    os._exit(0)", "exited with status 0 without a result"),
    ],
    ids=["hangs", "exits 0"],
)
def test_an_isolated_factorys_first_call_is_held_to_the_trials_limits(tmp_path, body, said):
    """With --isolate, the factory's first call runs in a process of its own under the
    trial's time limit: one that hangs, or ends its process with status 0, is one line and
    exit 2, nothing written (it hung the search forever, or ended it with exit 0)."""
    (tmp_path / "factory.py").write_text(f"def make_model():\n    {body}\n")
    ran = run_cli(
        "search", "factory.py:make_model", "--isolate", "--trial-timeout", "3", cwd=tmp_path
    )
    assert ran.returncode == 2, ran.stderr
    (line,) = ran.stderr.strip().splitlines()
    assert "did not finish its first call and float32 step" in line and said in line
    assert not (tmp_path / "scalertune.db").exists()


def test_a_fifo_given_as_the_result_file_is_one_line_not_a_wait_forever(tmp_path):
    os.mkfifo(tmp_path / "amp.yaml")
    with pytest.raises(scalertune.UsageError, match="is not a regular file") as info:
        scalertune.load(str(tmp_path / "amp.yaml"), device="cpu")
    assert len(str(info.value).splitlines()) == 1
    # as a search space: what it is, not "no such search space file" (it exists)
    os.mkfifo(tmp_path / "space.yaml")
    os.mkdir(tmp_path / "dir.yaml")
    with pytest.raises(scalertune.UsageError, match="space.yaml is not a regular file"):
        scalertune.SearchSpace.load(str(tmp_path / "space.yaml"))
    with pytest.raises(scalertune.UsageError, match="dir.yaml is a folder, not a search space"):
        scalertune.SearchSpace.load(str(tmp_path / "dir.yaml"))


_EXITS_FROM_CALL = """import os
import sys

sys.path.insert(0, {tests!r})
import workloads

CALLS = []


def make_model():
    CALLS.append(1)
    if len(CALLS) > {after}:
        os._exit(0)
    return workloads.healthy()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "after, code, said",
    [
        (0, 2, "the factory factory.py:make_model called os._exit(0), which ends the whole search"),
        (1, 1, "the float32 reference failed: the factory called os._exit(0)"),
    ],
    ids=["first call", "a run's call"],
)
def test_a_factory_that_calls_os_exit_0_in_the_search_process_is_a_failure_not_exit_0(
    tmp_path, after, code, said
):
    """Without --isolate the factory runs in the search's own process, where os._exit(0)
    ended the search with exit 0, nothing written and nothing said: its first call is one
    line and exit 2; a run's call fails the run (here the float32 reference's: exit 1)."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "factory.py").write_text(_EXITS_FROM_CALL.format(tests=tests, after=after))
    ran = run_cli(
        "search", "factory.py:make_model", "--steps", "20", "--device", "cpu",
        cwd=tmp_path, process=True,
    )  # fmt: skip
    assert ran.returncode == code, ran.stderr
    assert said in ran.stderr.strip().splitlines()[-1] and "Traceback" not in ran.stderr
    assert not list(tmp_path.glob("*.yaml"))


def test_os_exit_is_raised_in_this_process_only_and_only_while_user_code_runs():
    """In a process forked from the search's (a DataLoader's worker) os._exit is Python's
    own, and after the user's code it is too."""
    from scalertune._errors import ExitCalled
    from scalertune._workload._factory import exits_raised

    real = os._exit
    with exits_raised():
        with pytest.raises(ExitCalled) as caught, exits_raised():
            os._exit(0)
        assert caught.value.code == 0
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    assert os._exit is real


def test_a_folder_given_as_the_factorys_file_is_one_line(tmp_path):
    (tmp_path / "pkg").mkdir()
    ran = run_cli("search", "./pkg:make_model", "--device", "cpu", cwd=tmp_path)
    assert ran.returncode == 2 and ran.stdout == "", ran.stderr
    assert ran.stderr.strip().endswith(
        "./pkg is a folder: give the path to the Python file holding the factory "
        "(model.py:make_model)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]
