"""Reading a file handed over (a YAML, a runtime's state): once, bounded, a regular file only.

Opened without waiting (a FIFO in the file's place opens at once, and is refused, where a
plain ``open()`` waited for a writer forever), and, where asked, without following a link.
"""

from __future__ import annotations

import errno
import os
import stat


class Refused(Exception):
    """The file was not read, for what it is (:attr:`kind`: one of the constants below)."""

    LINK, FOLDER, SPECIAL, LARGE = "a symbolic link", "a folder", "not a regular file", "large"

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def read_regular(path: str, most: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, read once; :class:`Refused` for a link
    (``follow`` false), a folder, a FIFO or a device, or more than ``most`` bytes. Any other
    ``OSError`` (a missing file, permissions) is raised as it is."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno == errno.ELOOP:
            raise Refused(Refused.LINK) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # a folder opens too
            raise Refused(Refused.FOLDER)
        if not stat.S_ISREG(mode):
            raise Refused(Refused.SPECIAL)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(most + 1)
    finally:
        os.close(fd)
    if len(data) > most:
        raise Refused(Refused.LARGE)
    return data
