"""The runtime's state in a trainer's checkpoint folder, as one file of its own.

A Hugging Face Trainer's ``checkpoint-N/`` and an Accelerator's ``save_state`` folder keep
``amp.state_dict()`` (the scaler, the step counts, what the in-run check changed and its
record) in :data:`STATE_FILE`, beside the framework's own files. It holds tensors and plain
values only and is read with ``weights_only=True``: nothing in it runs. A checkpoint saved
without it (before ``attach``, or by an earlier release) resumes with one line.
"""

from __future__ import annotations

import io
import os
import warnings

import torch

from scalertune._amp._regular import Refused, read_regular
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._schema import create_temporary
from scalertune._errors import UsageError
from scalertune._text import cut

#: The file a checkpoint folder keeps the runtime's state in.
STATE_FILE = "scalertune_amp.pt"
#: The most bytes it is read to: a state is a few KiB (the check's record of a long run, a
#: few MiB).
MAX_STATE_BYTES = 64 * 2**20


def save_state(amp: AmpRuntime, folder: str) -> None:
    """``amp.state_dict()`` into ``folder``'s :data:`STATE_FILE`, whole or not at all."""
    path = os.path.join(folder, STATE_FILE)
    try:
        fd, tmp = create_temporary(path)  # created, never opened: no link written through
    except OSError as exc:
        raise UsageError(f"cannot write the runtime's state {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(amp.state_dict(), f)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(
            f"cannot write the runtime's state {path}: {exc.strerror}"
            + (": remove the folder of that name" if os.path.isdir(path) else "")
        ) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_state(amp: AmpRuntime, folder: str, *, stacklevel: int) -> None:
    """Restore ``amp`` from ``folder``'s :data:`STATE_FILE`, or say in one line that the
    checkpoint has none (``stacklevel``: the user's call that resumes, for the warning)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.lexists(path):
        warnings.warn(
            f"scalertune: checkpoint {folder} holds no {STATE_FILE} (saved without "
            "scalertune attached, or by an earlier release): the run resumes with the "
            "config it was attached with, and the in-run check starts its record again",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
        return
    data = _read(path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        amp.load_state_dict(state)
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"cannot restore the runtime's state from {path}: {type(exc).__name__}: "
            f"{cut(said, 200)}; delete the "
            "file to resume with the config the run was attached with"
        ) from None


def _read(path: str) -> bytes:
    """The file's bytes, read once from a regular file (not through a link: a FIFO, a device
    or a link in its place is refused at once instead of hanging or reading elsewhere), up
    to :data:`MAX_STATE_BYTES`; :class:`UsageError` in one line otherwise."""
    try:
        return read_regular(path, MAX_STATE_BYTES, follow=False)
    except Refused as exc:
        what = {
            Refused.LINK: "is a symbolic link",
            Refused.LARGE: f"is larger than {MAX_STATE_BYTES // 2**20} MiB",
        }.get(exc.kind, "is not a regular file")
    except OSError as exc:
        what = f"cannot be read ({exc.strerror})"
    raise UsageError(
        f"the runtime's state {path} {what}: delete it to resume with the config the run was "
        "attached with"
    )
