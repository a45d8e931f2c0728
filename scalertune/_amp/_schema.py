"""The result file: the YAML a search writes and training code reads back.

Five blocks matter to the runtime: ``config`` (the :class:`AmpConfig` to train with),
``guard`` (the production guard's limits), ``check`` (the in-run check's policy) and, in
``evidence``, ``prediction`` (what the search predicted the scaler does, which the watch
compares the run with) and ``model`` (the fingerprint of the model it was searched on, which
a prepared model is checked against). The rest of
``evidence`` is for people: why this config, from which trials, how fast against float32.
This module reads and writes the file and knows nothing else of the search, so the runtime
can load a config without importing the analysis or the replay.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shlex
from typing import Any

import yaml

from scalertune._amp._check import CheckPolicy
from scalertune._amp._config import AmpConfig
from scalertune._amp._fingerprint import ModelCheck, searched_model, searched_world
from scalertune._amp._guard import Guard
from scalertune._amp._watch import ScalerPrediction, Watch
from scalertune._errors import UsageError
from scalertune._text import shown

#: The file format's version, written as the top-level ``scalertune`` key.
FORMAT_VERSION = 1
#: The result file's last line, and the header line that promises it: a file cut short (a
#: full disk, a copy stopped midway) can still be valid YAML that has lost whole blocks
#: (``evidence.model``, which the other-model warning reads), and only its end says so. A
#: comment: the data, and what older releases read, are the same.
END_LINE = "# end of the scalertune result"
PROMISE_LINE = f"# A whole file ends with the line '{END_LINE}'."
#: The blocks a cut file is said to have lost, where it has lost them.
_WHOLE_BLOCKS = ("config", "check", "evidence", "evidence.model")


def read_result(path: str) -> dict[str, Any]:
    """The parsed result file; :class:`UsageError` when it is missing, not a result, or cut
    short (its header promises its last line, and it has none)."""
    from scalertune._amp._yaml import parse_yaml, read_text

    text = read_text(
        path, what="a scalertune result file", missing=" (run scalertune search first)"
    )
    lines = text.splitlines()
    cut = PROMISE_LINE in lines and END_LINE not in lines
    try:
        data = parse_yaml(text, where=path)
    except UsageError:
        if cut:  # cut mid-value: what it lost is past naming
            raise UsageError(_cut_short(path, [])) from None
        raise
    if cut:
        raise UsageError(_cut_short(path, _lost(data), data))
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UsageError(f"{path} has no 'config' mapping: is it a scalertune result file?")
    version = data.get("scalertune", FORMAT_VERSION)
    if type(version) is int and version > FORMAT_VERSION:  # written by a newer scalertune
        raise UsageError(
            f"{path} is in result format {version!r}, and this scalertune reads format "
            f"{FORMAT_VERSION}: upgrade scalertune (pip install -U scalertune), or search again"
        )
    if type(version) is not int or version < 1:  # no scalertune writes it
        raise UsageError(
            f"{path} gives its result format as {shown(version)}, which no scalertune "
            f"writes (this one writes {FORMAT_VERSION}): fix the 'scalertune:' line"
        )
    return data


def _lost(data: Any) -> list[str]:
    """Which of ``_WHOLE_BLOCKS`` ``data`` lacks."""
    lost = []
    for name in _WHOLE_BLOCKS:
        block = data
        for key in name.split("."):
            block = block.get(key) if isinstance(block, dict) else None
        if block is None:
            lost.append(name)
    return lost


def _cut_short(path: str, lost: list[str], data: Any = None) -> str:
    """The one line refusing a cut file: what it lost, and the command that writes it again,
    with the study and its storage where the file still names them (a storage whose password
    the file hides is left for the user to give)."""
    what = f": it has no {', '.join(lost)}" if lost else ""
    evidence = data.get("evidence") if isinstance(data, dict) else None
    named = evidence if isinstance(evidence, dict) else {}
    study, storage = named.get("study"), named.get("storage")
    # "***": the mark a redacted password leaves (_storage._redact.HIDDEN, a layer above)
    url = shlex.quote(storage) if isinstance(storage, str) and "***" not in storage else None
    name = shlex.quote(study) if isinstance(study, str) else None
    return (
        f"{path} was cut short (its last line, {END_LINE!r}, is missing){what}: write it "
        f"again (scalertune report --storage {url or 'STORAGE'} --study-name {name or 'NAME'} "
        f"-o {path}) or restore it"
    )


def load_config(path: str, *, best_amp: bool = False) -> AmpConfig:
    """Read the config a search chose from the YAML file it wrote, without building a runtime.

    Args:
        path: A result YAML that ``scalertune search`` wrote.
        best_amp: ``True`` reads the best AMP config that held (``evidence.best_amp``) instead
            of the answer: the one to use on a GPU when a search on a CPU answers float32
            because AMP steps are slower there.

    Returns:
        The :class:`AmpConfig` of the file's ``config`` block (or of ``evidence.best_amp``).

    Raises:
        UsageError: ``path`` is missing or is not a result file, its config is malformed, or
            ``best_amp=True`` and it has no ``evidence.best_amp``.

    Example:
        >>> import pathlib, tempfile, scalertune
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "amp.yaml"
        >>> _ = path.write_text("config: {dtype: float16, init_scale: 4096.0}")
        >>> scalertune.load_config(str(path)).describe()
        'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip'
    """
    return config_in(_chosen(read_result(path), path, best_amp), path)


def config_in(block: dict[str, Any], path: str) -> AmpConfig:
    """The :class:`AmpConfig` of a result's block (the file, or its ``evidence.best_amp``),
    a malformed one refused in one line that names the file."""
    try:
        return AmpConfig.from_dict(block["config"])
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _chosen(data: dict[str, Any], path: str, best_amp: bool) -> dict[str, Any]:
    """The block holding the config (and guard) to load: the file itself, or its
    ``evidence.best_amp``."""
    return best_amp_block(data, path) if best_amp else data


def _best_amp(data: dict[str, Any]) -> dict[str, Any] | None:
    """``evidence.best_amp`` of a result where it holds a config block, else ``None``."""
    evidence = data.get("evidence")
    block = evidence.get("best_amp") if isinstance(evidence, dict) else None
    return block if isinstance(block, dict) and isinstance(block.get("config"), dict) else None


def _deepspeeds(block: dict[str, Any]) -> bool:
    """Whether a block's config is DeepSpeed's fp16 block, which trains in its engine."""
    config = block.get("config")
    return isinstance(config, dict) and "fp16" in config


def best_amp_block(data: dict[str, Any], path: str) -> dict[str, Any]:
    """``evidence.best_amp`` of a result: the best AMP config that held, with its evidence."""
    block = _best_amp(data)
    if block is None:
        raise UsageError(
            f"{path} has no evidence.best_amp: no AMP config held in that "
            "search, so train with its config (best_amp=False)"
        )
    return block


def best_amp_kind(data: dict[str, Any]) -> str | None:
    """What a result's ``evidence.best_amp`` is: ``"deepspeed"`` (DeepSpeed's fp16 block,
    for its engine), ``"amp"`` (a config the runtime trains), ``None`` (none held)."""
    block = _best_amp(data)
    if block is None:
        return None
    return "deepspeed" if _deepspeeds(block) else "amp"


def runtime_parts(
    data: dict[str, Any],
    path: str,
    *,
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
) -> dict[str, Any]:
    """What :class:`AmpRuntime` is built with from a result file's contents ``data`` (read
    once by :func:`read_result`; ``path`` names it in errors): its ``config``
    (``evidence.best_amp``'s with ``best_amp=True``), the ``guard`` it recommends and a
    ``watch`` on its prediction (each ``None`` when the file has none or it is turned off),
    and what its best AMP config is (``best_amp``: :func:`best_amp_kind`, for the line a
    float32 answer says; not the runtime's).
    The prediction is the float16 answer's, or the best AMP config's where float32 is the
    answer; the runtime watches only a config with a scaler."""
    chosen = _chosen(data, path, best_amp)
    predicted = prediction_of(data, path) if watch else None
    searched = searched_model(data)
    return {
        "best_amp": best_amp_kind(data),
        "config": config_in(chosen, path),
        "guard": _guard(chosen, path) if guard else None,
        "watch": Watch(predicted) if predicted is not None else None,
        # the model the file was searched on, checked when a model is prepared
        "model_check": ModelCheck(searched, path, searched_world(data)),
    }


def check_policy(data: dict[str, Any], path: str) -> CheckPolicy:
    """The ``check`` block of a result read by :func:`read_result`, checked as a run loads it
    (the default policy where it has none): an export refuses what the run would."""
    block = data.get("check")
    try:
        return CheckPolicy() if block is None else CheckPolicy.from_dict(block)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _guard(data: dict[str, Any], path: str) -> Guard | None:
    block = data.get("guard")
    deepspeed = _deepspeeds(data)
    if block is None or (deepspeed and isinstance(block, str)):  # a line: DeepSpeed's own
        return None
    try:
        return Guard(
            min_scale=float(block["min_scale"]),
            max_consecutive_skips=int(block["max_consecutive_skips"]),
        )
    except UsageError as exc:  # a value out of its range, named by the guard
        raise UsageError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: 'guard' needs min_scale and max_consecutive_skips") from None


#: The keys of ``evidence.prediction``, with the type each is read as (``max_scale`` may be
#: left out).
_PREDICTION_KEYS = {
    "horizon": int,
    "skipped_steps": int,
    "skipped_first": int,
    "min_scale": float,
    "final_scale": float,
}


def prediction_of(data: dict[str, Any], path: str) -> ScalerPrediction | None:
    """The ``evidence.prediction`` block of a result read by :func:`read_result`: what the
    search predicted the loss scaler does over the horizon (``None`` when the file has none:
    a bfloat16 or float32 recommendation, or a file written before searches predicted)."""
    evidence = data.get("evidence")
    block = evidence.get("prediction") if isinstance(evidence, dict) else None
    if block is None:
        return None
    needs = f"{path}: 'evidence.prediction' needs {', '.join(_PREDICTION_KEYS)} (numbers)"
    if not isinstance(block, dict) or not set(_PREDICTION_KEYS) <= set(block):
        raise UsageError(needs)
    values = {k: block[k] for k in (*_PREDICTION_KEYS, "max_scale") if k in block}
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values.values()):
        raise UsageError(needs)
    # ScalerPrediction's fields by name (the keys chosen above); it checks their values.
    fields: dict[str, Any] = {k: _as(_PREDICTION_KEYS.get(k, float), v) for k, v in values.items()}
    try:
        return ScalerPrediction(**fields)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _as(kind: type, value: float) -> float:
    """``value`` as ``kind``: a count written as 19.0 is 19; 19.5 stays, for the check to
    refuse."""
    if kind is float:
        return float(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def result_document(data: dict[str, Any]) -> dict[str, Any]:
    """What the result file holds for ``data`` (config, guard, evidence): the format version
    first. ``scalertune report --json`` prints it and the study note shows it, so both are the
    file's content exactly. The in-run check's policy (``check``: the defaults, for the user
    to change) goes before the evidence where ``data`` has none."""
    if "check" not in data:
        before = {k: v for k, v in data.items() if k != "evidence"}
        after = {k: v for k, v in data.items() if k == "evidence"}
        data = {**before, "check": CheckPolicy().to_dict(), **after}
    return {"scalertune": FORMAT_VERSION, **data}


def write_result(data: dict[str, Any], path: str) -> None:
    """Write ``data`` (config, guard, evidence) atomically as ``result_document`` has it,
    with a header saying how to load it."""
    name = os.path.basename(path)
    if _deepspeeds(data):  # DeepSpeed's block, for its engine
        how = (
            "# Written by scalertune. Its config is DeepSpeed's fp16 block: put it in your\n"
            f"# ds_config.json with `scalertune export {name} --to deepspeed`, or attach it\n"
            "# to your DeepSpeed Trainer (scalertune.attach).\n"
        )
    else:
        best = (
            "# (evidence.best_amp, the best AMP config that held, is DeepSpeed's fp16 block:\n"
            f"# `scalertune export {name} --best-amp --to deepspeed` prints it).\n"
            if best_amp_kind(data) == "deepspeed"
            else "# (best_amp=True loads evidence.best_amp, the best AMP config that held, "
            "instead).\n"
        )
        how = (
            "# Written by scalertune. Load it in training code with\n"
            f'#   amp = scalertune.load("{name}", device="cuda")\n{best}'
        )
    header = (
        how + "# 'config' is what the runtime uses; 'evidence' says why it was chosen; 'check' is\n"
        "# what the run does when, every 'every' steps, its loss at its own weights falls\n"
        "# behind float32's: act (a float32 island, float32, the scaler's knobs, a more\n"
        "# accurate float8 recipe), warn or stop.\n"
        f"{PROMISE_LINE}\n"
    )
    # A temporary file of this writer's own: workers that finish together write the same
    # YAML, and one shared ".tmp" name was moved away under another's feet.
    fd, tmp = create_temporary(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(header)
            yaml.safe_dump(result_document(data), f, sort_keys=False, width=100)
            f.write(f"{END_LINE}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def create_temporary(path: str) -> tuple[int, str]:
    """A new file to write ``path`` in before renaming it into place, and its descriptor:
    beside it, under a random name (at most ``TEMPORARY_SUFFIX_CHARS`` more characters), and
    created, never opened: a link or a file someone left at a name they could guess (the
    writer's pid) is not written through, and two writers never share one. An ``OSError``
    (a full disk, a read-only folder) names ``path``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = f"{path}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
    raise FileExistsError(errno.EEXIST, "no free temporary name beside it", path)


#: The longest suffix :func:`create_temporary` adds: 12 hex digits, the dots and ``tmp``.
TEMPORARY_SUFFIX_CHARS = len(".0123456789ab.tmp")
