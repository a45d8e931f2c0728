import contextlib
import dataclasses
import functools
import io
import os
import signal
import subprocess
import sys

import optuna
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _share_the_cores():
    """Under pytest-xdist, each worker (and every process it starts) gets its share of the
    cores: torch's intra-op threads of two workers spinning against each other on 2 cores
    made tiny-model steps 10-100x slower (a 75 s search took 534 s)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1:
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ["OMP_NUM_THREADS"] = threads
        import torch

        torch.set_num_threads(int(threads))


_share_the_cores()


def _ctrl_c_reaches_the_processes():
    """The tests press Ctrl-C (SIGINT) on the processes they start. A suite started in the
    background of a shell (``pytest &``, ``nohup``) inherits SIGINT ignored, and so would
    every process it starts: those tests would fail on the launch, not on the code. A
    handler here is reset to the default in each process started (an ignored signal is not)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_ctrl_c_reaches_the_processes()


#: What a DeepSpeed engine (and a Trainer made with ``deepspeed=``) sets in the environment:
#: the process group as a launcher describes it, and Accelerate's DeepSpeed switch.
_DEEPSPEED_ENVIRONMENT = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_DEEPSPEED",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _accelerate_as_before_a_deepspeed_test():
    """A test that makes a DeepSpeed engine leaves the environment of a process group of one
    (a launcher's), and with a Trainer made with ``deepspeed=`` Accelerate's shared state
    running DeepSpeed: every Accelerator made after it in the process, a plain Trainer's too,
    would wrap its model in DDP or run DeepSpeed. Both undone after such a test (the group
    itself stays: DeepSpeed keeps its own handles on it, and the next engine takes it)."""
    before = {k: os.environ.get(k) for k in _DEEPSPEED_ENVIRONMENT}
    yield
    if {k: os.environ.get(k) for k in _DEEPSPEED_ENVIRONMENT} == before:
        return
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # optional: xdist may be switched off
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): two workers per core, one per 3 GiB of memory at
    most (a worker holds torch, and some tests start torchrun nodes or a run's processes).
    Many tests spend most of their time waiting (torchrun nodes, workers killed and waited
    for, time limits, outages ridden out), so one worker per core leaves cores idle: on 2
    cores the whole suite took 724 s with 2 workers and 619 s with 3 (without the PostgreSQL
    tests), and with them, run one after the other, 811, 721, 709 and 661 s with 3, 4, 3 and 4
    workers. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still sets the count."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = os.cpu_count() or 1  # as _share_the_cores divides them
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(2, min(2 * cores, int(memory_gib // 3)))


def pytest_collection_modifyitems(items):
    """Everything under tests/integration/ is slow (whole searches, other processes, a
    browser, package builds): the mark follows the folder, so it cannot drift."""
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.slow)


@dataclasses.dataclass
class Ran:
    """What one ``scalertune`` command line did: its exit status and its two streams."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args, cwd, process=False, timeout=300):
    """Run ``scalertune ARGS`` in the folder ``cwd``: in this process through
    :func:`scalertune.cli.main` (fast), or with ``process=True`` as the real executable in its
    own process (what a shell sees: the exit status, the streams, the signals)."""
    args = [str(a) for a in args]
    if process:
        proc = subprocess.run(
            [sys.executable, "-m", "scalertune", *args],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Ran(proc.returncode, proc.stdout, proc.stderr)
    from scalertune.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse's --help, --version and usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(before)
    return Ran(code, out.getvalue(), err.getvalue())


def amp_answer(result):
    """The AMP config a search found: the recommendation, or, where float32 is the answer on
    this device (AMP steps are slower on these CPUs), the best AMP config that held."""
    return result.recommended or result.best_amp


def spec(name: str, module: str = "workloads.py") -> str:
    """A factory spec for one of the test workloads, by absolute path."""
    return f"{os.path.join(HERE, module)}:{name}"


@pytest.fixture
def storage(tmp_path):
    return f"sqlite:///{tmp_path / 'study.db'}"


@pytest.fixture
def space_file(tmp_path):
    """Write a search space YAML and return its path."""

    def write(text: str, name: str = "space.yaml") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


#: A search whose answer is the same however many workers share it: no sampled trial (which
#: configs several workers sample depends on who asks first), PyTorch's float16 defaults and
#: the replay's choice, ranked by their steps to the target (one dtype, one step time), over
#: a horizon, so that there is work to share (references, baselines, branches, confirmations,
#: checkpoints).
HORIZON_SEARCH = (
    "--steps",
    "40",
    "--horizon",
    "200",
    "--n-trials",
    "0",
    "--space",
    "float16",
    "--device",
    "cpu",
)


@pytest.fixture(scope="session")  # once per worker: its group may interleave with other modules
def undisturbed(tmp_path_factory):
    """``HORIZON_SEARCH`` of ``workloads.healthy``, one worker, nothing in its way (study
    ``shared`` in ``study.log``): the answer the faulted searches must give (its ``folder``
    holds the study, ``summary`` what it printed). Tests that take it share an xdist group,
    so that it runs once."""
    folder = tmp_path_factory.mktemp("undisturbed")
    ran = run_cli(
        "search",
        spec("healthy"),
        "--storage",
        "study.log",
        "--study-name",
        "shared",
        "-o",
        "amp.yaml",
        *HORIZON_SEARCH,
        cwd=folder,
        process=True,
    )
    assert ran.returncode == 0, ran.stderr
    return {"answer": horizon_answer(folder / "amp.yaml"), "folder": folder, "summary": ran.stdout}


def horizon_answer(path):
    """The AMP answer of a search, from its YAML: the best AMP config that held and was
    confirmed. (Whether it or float32 is recommended on this CPU is a timing verdict, within
    the noise here, which the load of several workers at once can tip either way.)"""
    import yaml

    with open(path, encoding="utf-8") as f:
        evidence = yaml.safe_load(f)["evidence"]
    assert "missing" not in evidence
    return evidence["best_amp"]["config"]


def example(name: str):
    """Import one of the shipped examples as a module."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


POSTGRES = os.environ.get("SCALERTUNE_TEST_POSTGRES")
#: PostgreSQL tests run where a server is given, and must run in CI (.ci/run starts one).
needs_postgres = pytest.mark.skipif(
    not POSTGRES and os.environ.get("CI") != "true",
    reason="set SCALERTUNE_TEST_POSTGRES to a PostgreSQL URL (.ci/run does)",
)


@contextlib.contextmanager
def postgres_database(prefix, server=None):
    """A function that (re)creates an empty database on the test server (or on ``server``'s
    URL) and returns its URL; the database is dropped afterwards."""
    server = server or POSTGRES
    assert server, ".ci/run must start PostgreSQL and set SCALERTUNE_TEST_POSTGRES"
    import sqlalchemy

    # a connection a call, none kept: a server the test restarts cuts any kept one
    engine = sqlalchemy.create_engine(
        server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool
    )
    name = f"{prefix}_{os.getpid()}"

    def drop():
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

    def fresh():
        drop()
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        return server.rsplit("/", 1)[0] + "/" + name

    try:
        yield fresh
    finally:
        drop()
        engine.dispose()


def _postgres_bin():
    """Where PostgreSQL's server programs are: ``SCALERTUNE_TEST_PG_BIN`` (``.ci/run`` sets it),
    else Debian's newest ``/usr/lib/postgresql/*/bin``, else ``pg_ctl`` on the PATH."""
    import glob
    import shutil

    given = os.environ.get("SCALERTUNE_TEST_PG_BIN")
    if given:
        return given
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2] or 0))
    if found:
        return found[-1]
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(pg_ctl) if pg_ctl else None


#: A private PostgreSQL server runs where its programs are, and must run in CI.
needs_postgres_server = pytest.mark.skipif(
    not _postgres_bin() and os.environ.get("CI") != "true",
    reason="PostgreSQL's server programs (initdb, pg_ctl) are not installed",
)


class PostgresServer:
    """A PostgreSQL server of a test's own, in a fresh data folder on a free loopback port,
    that the test may restart: :meth:`restart` stops it at once (``-m immediate``: what a
    crash or a failover does to every connection and every open transaction) and starts it
    again some seconds later, with crash recovery. Run as the ``postgres`` user where the
    tests run as root (initdb refuses root), as ``.ci/run`` runs its own server."""

    def __init__(self, bin_dir):
        import socket
        import tempfile

        self.bin = bin_dir
        self.data = tempfile.mkdtemp(prefix="scalertune-test-pg-")
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            import pwd

            entry = pwd.getpwnam("postgres")
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres")

    def _run(self, program, *args):
        command = [os.path.join(self.bin, program), *args]
        if self._as_postgres:
            import shlex

            command = ["su", "postgres", "-c", shlex.join(command)]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self):
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        log = os.path.join(self.data, "server.log")
        self._run("pg_ctl", "-D", self.data, "-l", log, "-w", "-o", options, "start")

    def stop(self):
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def restart(self, seconds):
        """Down for ``seconds``, then up again."""
        import time

        self.stop()
        time.sleep(seconds)
        self.start()


@contextlib.contextmanager
def postgres_server():
    """A :class:`PostgresServer`, started; stopped and its folder removed afterwards."""
    import shutil

    bin_dir = _postgres_bin()
    assert bin_dir, ".ci/run must install PostgreSQL (initdb and pg_ctl)"
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            server.stop()
        shutil.rmtree(server.data, ignore_errors=True)


@contextlib.contextmanager
def s3_bucket():
    """A local S3 endpoint (moto's server, in this process) holding an empty bucket of a name
    of its own (moto keeps its buckets for the whole process), for the artifact store
    ``s3://NAME``: boto3 in this process, and in the processes it starts, reaches it through
    the environment (endpoint and throwaway credentials), as a user's workers reach theirs.
    The server stops afterwards."""
    with s3_endpoint() as endpoint:
        yield endpoint.bucket


class S3Endpoint:
    """moto's server on a loopback port, holding ``bucket``; :meth:`stop` and :meth:`start`
    make an outage of the endpoint (the buckets live in this process, and outlast it)."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.bucket = ""

    def stop(self):
        self._server.stop()

    def start(self):
        """The server again, on the same port (the workers' endpoint)."""
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()


@contextlib.contextmanager
def s3_endpoint():
    """:func:`s3_bucket`, as the :class:`S3Endpoint` that serves it."""
    import uuid

    endpoint = S3Endpoint()
    endpoint.bucket = f"scalertune-{uuid.uuid4().hex[:12]}"
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://{endpoint.host}:{endpoint.port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=endpoint.bucket)
        endpoint.bucket = f"s3://{endpoint.bucket}"
        yield endpoint
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        endpoint.stop()


@functools.lru_cache  # the same run for every round of a fault loop
def _float32s_own(horizon):
    import torch
    import workloads

    from scalertune._amp._config import AmpConfig
    from scalertune._run._loop import run_config

    return run_config(
        workloads.healthy,
        AmpConfig(dtype="float32"),
        steps=horizon,
        seed=0,
        device=torch.device("cpu"),
        prune=False,
    ).losses


def reference_is_float32s_own(study, horizon, context=""):
    """The study's float32 reference (seed 0, ``workloads.healthy``) has, over every window of
    the horizon, the losses of one undisturbed float32 run: resumed from a checkpoint (a good
    one, or one before a damaged one) or rebuilt, it replayed the same steps bit for bit."""
    own = _float32s_own(horizon)
    ref = next(
        t
        for t in study.trials
        if t.user_attrs.get("role") == "reference" and t.user_attrs.get("seed") == 0
    )
    windows = ref.system_attrs["scalertune.horizon"]["windows"]
    assert windows and all(
        losses == own[int(start) : int(start) + len(losses)] for start, losses in windows.items()
    ), f"{context}: float32's losses over the horizon differ from an undisturbed run's"
