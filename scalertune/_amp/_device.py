"""Which device a run trains on."""

from __future__ import annotations

import torch

from scalertune._errors import UsageError


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/``None`` picks CUDA when present; anything else must exist on this machine."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {device!r} asked for, but this machine has no CUDA device "
                "(or this torch build has no CUDA): use --device cpu"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise UsageError(
                f"device {device!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    elif resolved.type not in ("cpu", "mps", "xpu"):
        raise UsageError(f"unsupported device {device!r}: use auto, cpu, cuda or cuda:N")
    return resolved
