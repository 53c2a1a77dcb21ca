"""What every benchmark section shares: its settings, its result rows, and the timing helpers.

A section is a module ``benchmarks/bench_<name>.py`` that defines ``SECTION = Section(...)``; ``run.py`` finds
it by that name (``--only <name>``) and prints its rows in the one table of the run. Every row is a figure of
threadloom's next to a baseline measured in the same run, on the same machine, and their ratio.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog


class SectionUnavailable(Exception):
    """Raised by a section that cannot run here (no server, an extra not installed); the reason is printed."""


@dataclass(frozen=True)
class Settings:
    """One run's settings.

    Attributes:
        quick: a short run (``--quick``): smaller data and shorter measurements, same rows.
        workdir: a fresh directory for files (SQLite databases), on the file system the user chose.
        seconds: how long each throughput measurement runs.
    """

    quick: bool
    workdir: Path
    seconds: float


@dataclass(frozen=True)
class Row:
    """One line of the table: threadloom's figure, the baseline's, and ``value / baseline``.

    Attributes:
        section: the section's name (``sqlite``).
        measure: what was measured, e.g. ``"fenced commits/s, 8 writers"``.
        value: threadloom's figure, in ``unit``.
        baseline: the baseline's figure, in ``unit``.
        baseline_label: what the baseline is, e.g. ``"raw sqlite3 INSERT+COMMIT"``.
        unit: ``"/s"`` (higher is better) or ``"µs"`` (lower is better).
        goal: the goal for the ratio, as text (``"≥ 0.7×"``), or ``""``.
        met: whether the ratio meets the goal, or None when there is no goal.
        note: a footnote printed once under the table (settings both sides share, what a unit of work is).
    """

    section: str
    measure: str
    value: float
    baseline: float
    baseline_label: str
    unit: str
    goal: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float:
        """``value / baseline`` (``inf`` when the baseline is 0)."""
        return self.value / self.baseline if self.baseline else float("inf")


@dataclass(frozen=True)
class Section:
    """A benchmark section: ``run(settings)`` returns its rows (or raises :class:`SectionUnavailable`).

    Attributes:
        name: what ``--only`` selects.
        title: one line on what it compares.
        order: sections print in this order (then by name).
    """

    name: str
    title: str
    run: Callable[[Settings], list[Row]]
    order: int = 100
    notes: list[str] = field(default_factory=list)


def quiet_logs() -> Callable[[], None]:
    """Drops threadloom's log lines below WARNING, as a production host would; returns what restores the config.

    The library never configures logging, so an unconfigured structlog would print every ``commit.applied``
    line: a benchmark would measure the printing.
    """
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return lambda: structlog.configure(**saved)


def throughput(workers: int, seconds: float, make_worker: Callable[[int], Callable[[], None]]) -> float:
    """Operations per second of ``workers`` threads, each calling its own operation for ``seconds``.

    ``make_worker(i)`` builds worker ``i``'s operation (setup happens there, outside the timing). All workers
    start together; the rate is the operations all of them completed divided by the elapsed time.
    """
    operations = [make_worker(index) for index in range(workers)]
    counts = [0] * workers
    start = threading.Barrier(workers + 1)
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop(index: int) -> None:
        op = operations[index]
        start.wait()
        done = 0
        try:
            while not stop.is_set():
                op()
                done += 1
        except BaseException as error:  # reported below
            failures.append(error)
        counts[index] = done

    threads = [threading.Thread(target=loop, args=(i,), name=f"bench-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures:
        raise failures[0]
    return sum(counts) / elapsed


def median_us(call: Callable[[], object], samples: int, *, budget_s: float | None = None, warmup: int = 10) -> float:
    """The median latency of ``call`` in microseconds over ``samples`` calls (after ``warmup`` calls).

    With ``budget_s``, sampling also stops once that many seconds were spent (at least 5 samples are taken).
    """
    for _ in range(warmup):
        call()
    times: list[int] = []
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    while len(times) < samples and (deadline is None or len(times) < 5 or time.perf_counter() < deadline):
        began = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - began)
    return statistics.median(times) / 1000.0


def paired_median_us(
    first: Callable[[], object], second: Callable[[], object], samples: int, *, budget_s: float | None = None
) -> tuple[float, float]:
    """Median latencies (µs) of two calls sampled in turn, so that load from elsewhere touches both alike.

    Takes up to ``samples`` of each (at least 5), stopping early once ``budget_s`` seconds were spent.
    """
    for _ in range(5):
        first()
        second()
    times: tuple[list[int], list[int]] = ([], [])
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    while len(times[0]) < samples and (deadline is None or len(times[0]) < 5 or time.perf_counter() < deadline):
        for index, call in enumerate((first, second)):
            began = time.perf_counter_ns()
            call()
            times[index].append(time.perf_counter_ns() - began)
    return statistics.median(times[0]) / 1000.0, statistics.median(times[1]) / 1000.0
