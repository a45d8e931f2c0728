"""The runtime's state in a trainer's checkpoint folder, as one file of its own.

A Hugging Face Trainer's ``checkpoint-N/`` and an Accelerator's ``save_state`` folder keep
``amp.state_dict()`` (the scaler, the step counts, what the in-run check changed and its
record) in :data:`STATE_FILE`, beside the framework's own files. It holds tensors and plain
values only and is read with ``weights_only=True``: nothing in it runs. A checkpoint saved
without it (before ``attach``, or by an earlier release) resumes with one line.
"""

from __future__ import annotations

import os
import warnings

import torch

from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._text import cut

#: The file a checkpoint folder keeps the runtime's state in.
STATE_FILE = "scalertune_amp.pt"


def save_state(amp: AmpRuntime, folder: str) -> None:
    """``amp.state_dict()`` into ``folder``'s :data:`STATE_FILE`, whole or not at all."""
    path = os.path.join(folder, STATE_FILE)
    partial = f"{path}.partial"
    torch.save(amp.state_dict(), partial)
    os.replace(partial, path)


def load_state(amp: AmpRuntime, folder: str, *, stacklevel: int) -> None:
    """Restore ``amp`` from ``folder``'s :data:`STATE_FILE`, or say in one line that the
    checkpoint has none (``stacklevel``: the user's call that resumes, for the warning)."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        warnings.warn(
            f"scalertune: checkpoint {folder} holds no {STATE_FILE} (saved without "
            "scalertune attached, or by an earlier release): the run resumes with the "
            "config it was attached with, and the in-run check starts its record again",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        amp.load_state_dict(state)
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"cannot restore the runtime's state from {path}: {type(exc).__name__}: "
            f"{cut(said, 200)}; delete the "
            "file to resume with the config the run was attached with"
        ) from None
