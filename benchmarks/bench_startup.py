"""Section ``startup``: how long ``threadloom --help`` and ``threadloom --version`` take to start and exit.

Each figure is the median wall-clock time of a fresh interpreter running the command to its end
(``python -m threadloom --help``, ``python -m threadloom --version``), from ``subprocess`` start to exit. The
baseline is the least any click command can cost: an interpreter that only imports click (``python -c "import
click"``, i.e. ``python -c pass`` plus the time to import click). The goal is at most twice that. A third row puts
the click import itself against ``python -c pass`` (no goal: the floor both sides share).

The commands run in turns (one of each per round, after a warm-up round that also writes the bytecode caches), so
load from elsewhere on a shared machine touches all of them alike. Timings are figures to read, never assertions;
the test suite asserts what ``--help`` imports instead.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import Row, Section, Settings

GOAL = 2.0
"""``--help`` and ``--version`` start in at most this multiple of the baseline."""
ROUNDS = 15
"""Runs of each command (medians); ``--quick``: :data:`QUICK_ROUNDS`."""
QUICK_ROUNDS = 7

COMMANDS: dict[str, list[str]] = {
    "pass": [sys.executable, "-c", "pass"],
    "click": [sys.executable, "-c", "import click"],
    "help": [sys.executable, "-m", "threadloom", "--help"],
    "version": [sys.executable, "-m", "threadloom", "--version"],
}
"""What is timed: a bare interpreter, one that imports click, and the command's two cheapest calls."""


def _time_ms(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall-clock milliseconds of one run of ``command``, start to exit (it must exit 0)."""
    began = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - began) * 1000.0


def startup_ms(workdir: Path, rounds: int) -> dict[str, float]:
    """The median milliseconds of each of :data:`COMMANDS`, sampled in turns over ``rounds`` rounds.

    Runs in ``workdir`` (``--help`` opens no store there) with ``$THREADLOOM_STORE`` and ``$PYTHONSTARTUP``
    removed from the environment.
    """
    env = {key: value for key, value in os.environ.items() if key not in ("THREADLOOM_STORE", "PYTHONSTARTUP")}
    for command in COMMANDS.values():  # warm-up: bytecode caches written, files in the page cache
        _time_ms(command, workdir, env)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            samples[name].append(_time_ms(command, workdir, env))
    return {name: statistics.median(times) for name, times in samples.items()}


def run(settings: Settings, *, rounds: int | None = None) -> list[Row]:
    """The rows of the section: ``--help`` and ``--version`` against the baseline, and click's import against a
    bare interpreter; ``rounds`` (default :data:`ROUNDS`, or :data:`QUICK_ROUNDS` with ``--quick``) per command."""
    if rounds is None:
        rounds = QUICK_ROUNDS if settings.quick else ROUNDS
    ms = startup_ms(settings.workdir, rounds)
    note = (
        f"startup: median wall-clock ms of {rounds} fresh interpreters per command, run in turns; baseline "
        f"python -c \"import click\" ({ms['click']:.1f} ms) = python -c pass ({ms['pass']:.1f} ms) + importing click"
    )
    rows = [
        Row(
            section="startup",
            measure=f"threadloom {option}",
            value=ms[option.removeprefix("--")],
            baseline=ms["click"],
            baseline_label="python -c pass + import click",
            unit="ms",
            goal=f"≤ {GOAL:g}×",
            met=ms[option.removeprefix("--")] <= GOAL * ms["click"],
            note=note,
        )
        for option in ("--help", "--version")
    ]
    rows.append(
        Row(
            section="startup",
            measure='python -c "import click"',
            value=ms["click"],
            baseline=ms["pass"],
            baseline_label="python -c pass",
            unit="ms",
            note=note,
        )
    )
    return rows


SECTION = Section(
    name="startup",
    title="threadloom --help and --version start-up, against an interpreter that only imports click",
    run=run,
    order=5,
)
