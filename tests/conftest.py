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
