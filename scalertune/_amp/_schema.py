"""The result file: the YAML a search writes and training code reads back.

Two blocks matter to the runtime: ``config`` (the :class:`AmpConfig` to train with) and
``guard`` (the production guard's limits). ``evidence`` is for people: why this config, from
which trials, how fast against float32. This module reads and writes the file and knows
nothing else of the search, so the runtime can load a config without importing the analysis.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from scalertune._amp._config import AmpConfig
from scalertune._amp._guard import Guard
from scalertune._errors import UsageError

#: The file format's version, written as the top-level ``scalertune`` key.
FORMAT_VERSION = 1


def read_result(path: str) -> dict[str, Any]:
    """The parsed result file; :class:`UsageError` when it is missing or not a result."""
    from scalertune._amp._yaml import read_yaml

    data = read_yaml(path, what="a scalertune result file",
                     missing=" (run scalertune search first)")
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UsageError(f"{path} has no 'config' mapping: is it a scalertune result file?")
    return data


def load_config(path: str) -> AmpConfig:
    """Read the ``config`` block of a YAML file written by ``scalertune search``."""
    return AmpConfig.from_dict(read_result(path)["config"])


def load_guard(path: str) -> Guard | None:
    """The ``guard`` block of a result YAML, if it has one."""
    block = read_result(path).get("guard")
    if block is None:
        return None
    try:
        return Guard(min_scale=float(block["min_scale"]),
                     max_consecutive_skips=int(block["max_consecutive_skips"]))
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: 'guard' needs min_scale and max_consecutive_skips") from None


def result_document(data: dict[str, Any]) -> dict[str, Any]:
    """What the result file holds for ``data`` (config, guard, evidence): the format version
    first. ``scalertune report --json`` prints it and the study note shows it, so both are the
    file's content exactly."""
    return {"scalertune": FORMAT_VERSION, **data}


def write_result(data: dict[str, Any], path: str) -> None:
    """Write ``data`` (config, guard, evidence) atomically, with a header saying how to load it."""
    header = (
        "# Written by scalertune. Load it in training code with\n"
        "#   amp = scalertune.load(\"" + os.path.basename(path) + "\", device=\"cuda\")\n"
        "# 'config' is what the runtime uses; 'evidence' says why it was chosen.\n"
    )
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(header)
        yaml.safe_dump(result_document(data), f, sort_keys=False, width=100)
    os.replace(tmp, path)
