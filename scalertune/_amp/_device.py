"""Which device a run trains on: a device's name read once, and checked against this machine.

:func:`device_type` reads a name (``"cuda:1"`` is a ``"cuda"``) without importing torch, so
that ``scalertune export --device cuda`` answers before torch has loaded (a second or more);
:func:`resolve_device` also checks that the device exists here, as a run needs.
:func:`check_same_device` is the one refusal of a trainer whose device is not the search's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from scalertune._errors import UsageError

if TYPE_CHECKING:
    import torch

#: The device types a run trains on, and how a name of one is written (``cuda``, ``cuda:1``).
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(?::(\d+))?")
_USE = "use auto, cpu, cuda or cuda:N"


def device_type(device: str) -> str:
    """The type of the device ``device`` names (``"cuda"`` for ``"cuda:1"``), read without
    torch and without asking whether this machine has it; ``"auto"`` is not a device here.

    Example:
        >>> device_type("cuda:1"), device_type("cpu")
        ('cuda', 'cpu')
    """
    match = _DEVICE.fullmatch(device) if isinstance(device, str) else None
    if match is None:
        raise UsageError(f"unknown device {device!r}: {_USE}")
    return match.group(1)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/``None`` picks CUDA when present; anything else must exist on this machine."""
    import torch

    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        device = str(device)
    device_type(device)
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {device!r} asked for, but this machine has no CUDA device "
                "(or this torch build has no CUDA): use the CPU (--device cpu, or device='cpu')"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise UsageError(
                f"device {device!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    return resolved


def check_same_device(what: str, trains_on: torch.device, device: torch.device, how: str) -> None:
    """Refuse a trainer (``what``: "the Trainer", "the Accelerator") that trains on another
    kind of device than the search runs on; ``how`` says how to make the trainer match."""
    if trains_on.type != device.type:
        raise UsageError(
            f"{what} trains on {trains_on.type} and the search runs on {device.type}: "
            f"give --device {trains_on.type} ({how})"
        )
