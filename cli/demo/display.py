"""What ``threadloom demo`` shows: live progress while it runs, and the verification table at the end."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import attrs
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from threadloom.cli.demo.plan import DemoPlan, worker_of
from threadloom.cli.demo.processes import Worker
from threadloom.cli.demo.verify import Check, Crash, demo_entries
from threadloom.domain.queue import EntryStatus, QueueEntry
from threadloom.persistence.queue import RunQueue

PLAIN_EVERY_S = 1.0
"""Without a terminal, at most one progress line per this many seconds (plus one line per notable event)."""


@attrs.define
class Snapshot:
    """What one poll saw: queue counts, per-worker runs, and the registry's RUNNING roots by worker."""

    completed: int = 0
    failed: int = 0
    running: int = 0
    queued: int = 0
    by_worker_running: Counter[str] = attrs.Factory(Counter)
    by_worker_done: Counter[str] = attrs.Factory(Counter)
    entries: list[QueueEntry] = attrs.Factory(list)

    @property
    def finished(self) -> int:
        return self.completed + self.failed


def take_snapshot(queue: RunQueue, entry_ids: set[int]) -> Snapshot:
    """Reads the demo's queue entries and counts them."""
    now = datetime.now(UTC)
    snapshot = Snapshot()
    snapshot.entries = demo_entries(queue, entry_ids)
    for entry in snapshot.entries:
        if entry.status is EntryStatus.COMPLETED:
            snapshot.completed += 1
            snapshot.by_worker_done[worker_of(entry.run_ids[-1] if entry.run_ids else None) or "?"] += 1
        elif entry.status is EntryStatus.FAILED:
            snapshot.failed += 1
        elif entry.leased_by is not None and entry.lease_expires_at is not None and entry.lease_expires_at > now:
            snapshot.running += 1
            snapshot.by_worker_running[entry.leased_by.split("#", 1)[0]] += 1
        else:
            snapshot.queued += 1
    return snapshot


class Display:
    """The live progress: a rich display on a terminal, plain lines otherwise (or on stderr with ``--json``)."""

    def __init__(self, console: Console, plan: DemoPlan, store_label: str, *, live: bool) -> None:
        self.console = console
        self.plan = plan
        self.store_label = store_label
        self.started = time.monotonic()
        self.notes: list[str] = []
        self.snapshot = Snapshot()
        self.workers: list[Worker] = []
        self._live: Live | None = (
            Live(console=console, refresh_per_second=8, transient=False, get_renderable=self.render) if live else None
        )
        self._last_line = 0.0
        self._last_counts: tuple[int, ...] = ()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __enter__(self) -> Self:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()

    def note(self, text: str) -> None:
        """A notable moment (the crash, a takeover, a worker that died): kept on screen, or printed at once."""
        line = f"{self.elapsed():6.1f}s  {text}"
        self.notes.append(line)
        if self._live is None:
            self.console.print(Text(line), soft_wrap=True)

    def update(self, snapshot: Snapshot, workers: list[Worker]) -> None:
        self.snapshot, self.workers = snapshot, workers
        if self._live is not None:
            return
        counts = (snapshot.completed, snapshot.failed, snapshot.running, snapshot.queued)
        now = time.monotonic()
        if counts != self._last_counts and now - self._last_line >= PLAIN_EVERY_S:
            self._last_counts, self._last_line = counts, now
            self.console.print(Text(f"{self.elapsed():6.1f}s  {self._summary()}"), soft_wrap=True)

    def _summary(self) -> str:
        s = self.snapshot
        text = f"{s.completed}/{self.plan.runs} completed · {s.running} running · {s.queued} queued"
        return text + (f" · {s.failed} failed" if s.failed else "")

    def render(self) -> Group:
        s = self.snapshot
        header = Text()
        header.append("threadloom demo", style="bold")
        header.append(f"  {self.store_label}  ·  {self.plan.runs} runs · {len(self.workers)} workers  ·  ")
        header.append(f"{self.elapsed():.1f}s", style="dim")
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=self.plan.runs, completed=s.finished, width=40), Text(self._summary()))
        table = Table(title_justify="left", header_style="bold", box=None, padding=(0, 2))
        for column in ("worker", "pid", "state", "running", "completed"):
            table.add_column(column)
        for worker in self.workers:
            status = worker.status()
            style = "red bold" if worker.killed else ("green" if status == "up" else "dim")
            table.add_row(
                Text(worker.name),
                Text(str(worker.pid)),
                Text(status, style=style),
                Text(str(s.by_worker_running.get(worker.name, 0)) if not worker.killed else "-"),
                Text(str(s.by_worker_done.get(worker.name, 0))),
            )
        notes = Text("\n".join(self.notes[-8:]), style="yellow") if self.notes else Text("")
        return Group(header, bar, Text(""), table, Text(""), notes)


@attrs.define
class DemoResult:
    """What a demo did and found."""

    plan: DemoPlan
    store_label: str
    folder: Path | None
    kept: bool
    crash: Crash | None
    checks: list[Check]
    workers: list[dict[str, Any]]
    duration_s: float
    timed_out: bool
    inspect: str

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "store": self.store_label,
            "runs": self.plan.runs,
            "workers": self.workers,
            "tenant": self.plan.tenant,
            "threads": {"first": self.plan.thread_id(1), "last": self.plan.thread_id(self.plan.runs)},
            "crash": None if self.crash is None else self.crash.json(self.plan.ttl),
            "checks": [check.json() for check in self.checks],
            "duration_s": round(self.duration_s, 3),
            "timed_out": self.timed_out,
            "folder": str(self.folder) if self.kept and self.folder is not None else None,
            "inspect": self.inspect,
        }


def print_result(console: Console, result: DemoResult) -> None:
    """The verification table, the crash and where to look next."""
    table = Table(title="verification", title_justify="left", header_style="bold")
    table.add_column("check")
    table.add_column("result")
    table.add_column("figure", overflow="fold")
    for check in result.checks:
        verdict = Text("PASS", style="bold green") if check.passed else Text("FAIL", style="bold red")
        table.add_row(Text(check.name), verdict, Text(check.figure))
        for problem in check.problems:
            table.add_row(Text(""), Text(""), Text(problem, style="red"))
    console.print(table)
    crash = result.crash
    if crash is not None:
        latencies = [t.after_s for t in crash.takeovers if t.after_s is not None]
        by = Counter(worker_of(t.by_run) for t in crash.takeovers)
        children = sum(1 for t in crash.takeovers if t.thread_id not in crash.held)
        line = (
            f"crash: {crash.worker} (pid {crash.pid}) SIGKILLed at {crash.elapsed_s:.1f}s holding "
            f"{len(crash.held)} runs mid-way; {len(crash.takeovers)} threads taken over ("
            + (f"{len(crash.takeovers) - children} runs and {children} of their child threads; " if children else "")
            + f"{', '.join(f'{name}: {n}' for name, n in sorted(by.items()))})"
        )
        if latencies:
            line += (
                f", recovered {min(latencies):.1f}–{max(latencies):.1f}s after the kill "
                f"(claim ttl {result.plan.ttl.total_seconds():g}s)"
            )
        # Wrapped at word boundaries on a terminal (never past its last column); one line when piped.
        console.print(Text(line), soft_wrap=not console.is_terminal)
    elif result.plan.crash:
        console.print(
            Text("crash: none (no worker held a run mid-way at the time)"), soft_wrap=not console.is_terminal
        )
    summary = "all checks passed" if result.passed else "SOME CHECKS FAILED"
    console.print(
        Text(f"{summary} in {result.duration_s:.1f}s", style="bold green" if result.passed else "bold red")
    )
    if result.kept and result.folder is not None:
        console.print(Text(f"kept {result.folder} (store, effect ledger ledger.db, worker logs in logs/)"))
    if result.inspect:
        console.print(Text(f"inspect: {result.inspect}"), soft_wrap=True)


__all__ = ["PLAIN_EVERY_S", "DemoResult", "Display", "Snapshot", "print_result", "take_snapshot"]
