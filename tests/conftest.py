import contextlib
import os
import sys

import optuna
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    reason="set SCALERTUNE_TEST_POSTGRES to a PostgreSQL URL (.ci/run does)")


@contextlib.contextmanager
def postgres_database(prefix):
    """A function that (re)creates an empty database on the test server and returns its URL;
    the database is dropped afterwards."""
    assert POSTGRES, ".ci/run must start PostgreSQL and set SCALERTUNE_TEST_POSTGRES"
    import sqlalchemy

    engine = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}"

    def drop():
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

    def fresh():
        drop()
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        return POSTGRES.rsplit("/", 1)[0] + "/" + name

    try:
        yield fresh
    finally:
        drop()
        engine.dispose()
