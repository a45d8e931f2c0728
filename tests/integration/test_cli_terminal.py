"""The command on a real terminal: a progress bar with each run's line above it."""

import os
import re
import subprocess
import sys

from conftest import spec


def test_a_terminal_gets_a_progress_bar_with_the_run_lines_above_it(tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # a terminal of 40 rows and 120 columns (a new pty has 0x0, where tqdm hides its bar)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec("healthy"),
            "--n-trials",
            "2",
            "--steps",
            "40",
            "--device",
            "cpu",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=300)
    os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0
    assert "scalertune:" in terminal and "run/s" in terminal  # tqdm's bar
    # each run's line is written above the bar, never glued to it
    assert re.search(r"\n#\d+ \[", terminal.replace("\r", "\n"))
    assert "Recommended:" in out
