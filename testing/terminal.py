"""Run a ``threadloom`` command in a real pseudo-terminal of a given size, and read what it printed.

For tests of what a person sees: tables that must fit a terminal, live lines that must not overflow it. POSIX only
(``pty``); the command runs as ``python -m threadloom`` in a child process whose stdin, stdout and stderr are the
terminal, so it takes the terminal's width and colours as it would for a person. What it printed is replayed on a
small screen model that knows what a live display uses (carriage return, cursor up, erase line): the final screen
is the text, and any line the command wrote past the last column is reported, even one a redraw erased later.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

_TOKENS = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[()][A-Za-z0-9]|\r|\n|[^\x1b\r\n]+")


@attrs.frozen
class TerminalRun:
    """What a command printed to its terminal.

    Attributes:
        exit_code: the command's exit status.
        text: the final screen (every line written, none scrolled away), without colours.
        overflowing: the lines the command wrote past the terminal's last column (as they stood then).
    """

    exit_code: int
    text: str
    overflowing: tuple[str, ...] = ()

    @property
    def lines(self) -> list[str]:
        """The printed lines (a live display's redrawn lines each appear)."""
        return self.text.split("\n")

    def wider_than(self, columns: int) -> list[str]:
        """The lines longer than ``columns`` characters, on the final screen or while they were drawn."""
        return [*self.overflowing, *(line for line in self.lines if len(line) > columns)]


def replay(output: str, columns: int) -> tuple[str, tuple[str, ...]]:
    """The final screen of ``output`` and the lines written past ``columns`` (see the module's docstring).

    Understood: text, ``\\r``, ``\\n``, cursor up (``ESC [ n A``) and erase line (``ESC [ 2 K``); every other
    escape sequence (colours, cursor visibility) changes nothing here. Nothing wraps: a line written past the
    last column is kept whole and reported.
    """
    screen: list[list[str]] = [[]]
    row = col = 0
    overflowing: list[str] = []
    for match in _TOKENS.finditer(output):
        token = match.group(0)
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            col = 0  # a pty turns "\n" into "\r\n"
            while len(screen) <= row:
                screen.append([])
        elif match.group(2) is not None:
            count = int(match.group(1) or "1") if match.group(1).isdigit() else 1
            if match.group(2) == "A":
                row = max(0, row - count)
            elif match.group(2) == "K":
                screen[row] = []
        elif not token.startswith("\x1b"):
            line = screen[row]
            line.extend(" " * (col - len(line)))
            line[col : col + len(token)] = list(token)
            col += len(token)
            if col > columns:
                overflowing.append("".join(line))
    return "\n".join("".join(line).rstrip() for line in screen), tuple(overflowing)


def run_in_terminal(
    args: Sequence[str],
    *,
    columns: int = 80,
    rows: int = 24,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
) -> TerminalRun:
    """Runs ``python -m threadloom *args`` in a pseudo-terminal ``columns`` wide and ``rows`` high.

    ``COLUMNS`` and ``LINES`` are removed from the environment, so the command reads the terminal's size.

    Raises:
        subprocess.TimeoutExpired: the command ran longer than ``timeout_s`` (it is killed).
    """
    import fcntl
    import pty
    import struct
    import termios

    environment = {k: v for k, v in (env if env is not None else os.environ).items() if k not in ("COLUMNS", "LINES")}
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "threadloom", *args], stdin=follower, stdout=follower, stderr=follower,
        env=environment, cwd=cwd, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    text, overflowing = replay(b"".join(chunks).decode(errors="replace"), columns)
    return TerminalRun(exit_code=code, text=text, overflowing=overflowing)


__all__ = ["TerminalRun", "replay", "run_in_terminal"]
