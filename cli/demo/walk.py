"""``threadloom demo --walk``: a rolling release that re-stamps every stored row, across real OS processes, with a
real SIGKILL of the walking process, and an audit of every row's stamp at the end.

The coordinator:

1. opens the store as release v1 (tenant-only access schema) and fills it: ``--threads`` threads of the graph kind
   spread over four tenants, each with checkpoints, pending writes, events and effect records stamped by v1;
2. starts worker ``v1-1`` (``python -m threadloom demo-walk-worker --release v1``): it heartbeats its membership,
   walks v1's schema (nothing to change: v1 wrote every row) and makes live commits; once v1's walk is recorded
   completed it starts ``v2-1`` and ``v2-2`` (release v2: the ``region`` attribute), which make live commits too;
   v1 and v2 run side by side for ``--overlap`` while v2's walk waits (a v1 member is alive);
3. stops ``v1-1`` (SIGTERM); once its membership expired (the lease ttl after its last heartbeat) one v2 process
   claims the walk of v2's schema and re-stamps the threads at its pace - the live pace is on screen: share, rate,
   pressed, cursor, count;
4. unless ``--no-crash``, once a third of the threads were recorded walked it SIGKILLs the v2 process holding the
   walk lease; the other claims the lease once it expired and resumes at the recorded cursor;
5. once the walk is completed it stops the v2 processes and audits (:mod:`threadloom.cli.demo.audit`): rows
   unstamped, rows mis-stamped, cross-tenant reads, rows a tenant read hid - all must be 0; and the scenario's
   own checks. It prints a table (or, with ``--json``, one JSON document) and exits 1 if anything failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from threadloom.actors.walker import DEFAULT_GROUP, NODE_KEY, RATE_KEY, SHARE_KEY
from threadloom.cli.demo.audit import AuditResult, audit
from threadloom.cli.demo.processes import Worker, stop_workers
from threadloom.cli.demo.verify import Check
from threadloom.cli.demo.walk_plan import TENANTS, WalkPlan, fill_v1, release_access
from threadloom.cli.output import STORE_ENV
from threadloom.domain.access import WalkRecord, walk_thread_id
from threadloom.persistence import open_store

POLL_S = 0.1
"""How often (seconds) the coordinator reads the walk record, the lease and the workers' status files."""
PLAIN_EVERY_S = 1.0
"""Without a terminal: a pace line this often while the walk runs."""
CRASH_AT = 1 / 3
"""The SIGKILL comes once this share of the threads was recorded walked."""
STAMP_CHECKS = ("rows unstamped", "rows mis-stamped", "cross-tenant reads", "rows hidden from their tenant")


@attrs.define
class WalkView:
    """What the coordinator last read of the walk."""

    record: WalkRecord | None = None
    node: str | None = None
    share: float | None = None
    rate: float | None = None
    holder: str | None = None
    pressed: bool | None = None


def start_walk_worker(name: str, release: str, url: str, folder: Path, plan: WalkPlan, log_level: str) -> Worker:
    """Starts ``python -m threadloom demo-walk-worker`` for ``release`` in a session of its own; the store URL
    travels in the environment, its log lines go to ``<folder>/logs/<name>.log``."""
    log_path = folder / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fast = release == "v1"  # v1 wrote every row itself: its walk only confirms them
    ms = lambda d: f"{int(d.total_seconds() * 1000)}ms"  # noqa: E731
    command = [
        sys.executable, "-m", "threadloom", "--log-level", log_level, "demo-walk-worker",
        "--name", name, "--release", release, "--graph", plan.graph_id,
        "--status", str(folder / "status" / f"{name}.json"),
        "--ttl", ms(plan.ttl), "--renew-every", ms(plan.renew_every), "--interval", ms(plan.interval),
        "--walk-share", str(1.0 if fast else plan.walk_share),
        "--walk-rate", str(1000.0 if fast else plan.walk_rate),
        "--commits-per-s", str(plan.commits_per_s),
    ]  # fmt: skip
    (folder / "status").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, STORE_ENV: url}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return Worker(name=name, process=process, log_path=log_path)


def read_status(folder: Path, name: str) -> dict[str, Any] | None:
    """The last status file of worker ``name``, or None."""
    try:
        found = json.loads((folder / "status" / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


class WalkDisplay:
    """Notes and the live pace: a rich live view on a terminal (80 columns), plain lines otherwise."""

    def __init__(self, console: Console, plan: WalkPlan, store_label: str, *, live: bool) -> None:
        self._console = console
        self._plan = plan
        self._label = store_label
        self._live: Live | None = Live(console=console, auto_refresh=False, transient=True) if live else None
        self._notes: list[str] = []
        self._started = time.monotonic()
        self._last_plain = 0.0
        self._workers: list[Worker] = []
        self._view = WalkView()
        self._status: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> WalkDisplay:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def note(self, text: str) -> None:
        line = f"[{self.elapsed():5.1f}s] {text}"
        self._notes.append(line)
        self._console.print(Text(line), soft_wrap=True, highlight=False)
        self._refresh()

    def update(self, workers: list[Worker], view: WalkView, status: dict[str, dict[str, Any]]) -> None:
        self._workers, self._view, self._status = workers, view, status
        if self._live is None:
            record = view.record
            if record is not None and not record.completed and time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
                self._last_plain = time.monotonic()
                self._console.print(Text(f"[{self.elapsed():5.1f}s] pace: {self.pace_line(view)}"), soft_wrap=True)
            return
        self._refresh()

    def pace_line(self, view: WalkView) -> str:
        record = view.record
        if record is None:
            return "no walk recorded"
        share = "-" if view.share is None else f"{view.share:.3f}"
        rate = "-" if view.rate is None else f"{view.rate:.1f}/s"
        pressed = "-" if view.pressed is None else ("yes" if view.pressed else "no")
        return (
            f"walk {record.schema} by {view.holder or '-'}: share {share} rate {rate} pressed {pressed} "
            f"cursor {record.cursor or '-'} count {record.count}/{self._plan.threads}"
            + (" completed" if record.completed else "")
        )

    def _refresh(self) -> None:
        if self._live is None:
            return
        procs = Table(title="worker processes", title_justify="left")
        for column in ("process", "release", "pid", "state", "commits", "share", "pressed"):
            procs.add_column(column, no_wrap=True)
        for worker in self._workers:
            status = self._status.get(worker.name) or {}
            share = status.get("share")
            procs.add_row(
                worker.name, worker.name.split("-")[0], str(worker.pid), worker.status(),
                str(status.get("commits", "-")), "-" if share is None else f"{share:.3f}",
                "-" if status.get("pressed") is None else ("yes" if status["pressed"] else "no"),
            )  # fmt: skip
        record = self._view.record
        pace = Table(title="walk (the lease holder's pace)", title_justify="left")
        for column in ("schema", "holder", "share", "rate", "pressed", "cursor", "count"):
            pace.add_column(column, no_wrap=True)
        if record is not None:
            view = self._view
            pace.add_row(
                record.schema, view.holder or "-", "-" if view.share is None else f"{view.share:.3f}",
                "-" if view.rate is None else f"{view.rate:.1f}/s",
                "-" if view.pressed is None else ("yes" if view.pressed else "no"),
                record.cursor or "-", f"{record.count}" + (" done" if record.completed else ""),
            )  # fmt: skip
        done = record.count if record is not None and record.schema == self._v2_hash else 0
        progress = Table.grid(padding=(0, 1))
        progress.add_row(
            ProgressBar(total=self._plan.threads, completed=min(done, self._plan.threads), width=50),
            Text(f"{done}/{self._plan.threads} threads re-stamped by v2"),
        )
        self._live.update(Group(procs, pace, progress), refresh=True)  # the notes print above it

    @property
    def _v2_hash(self) -> str:
        return release_access("v2", self._plan.graph_id).for_graph(self._plan.graph_id).hash


@attrs.define
class WalkRun:
    """What happened: the moments (seconds since start), the kill, the takeover, the checks."""

    v1_stopped_s: float | None = None
    v1_stop_took_s: float | None = None  # from its SIGTERM to its exit (or its SIGKILL, after the stop grace)
    v1_stopped_at: datetime | None = None
    walk_claimed_at: datetime | None = None
    walk_started_s: float | None = None
    walk_started_by: str | None = None
    v2_waited: bool = False
    killed: dict[str, Any] | None = None
    resumed: dict[str, Any] | None = None
    completed_s: float | None = None
    record: WalkRecord | None = None
    timed_out: bool = False
    notes: list[str] = attrs.Factory(list)


def read_view(store: Any, plan: WalkPlan, folder: Path) -> WalkView:
    """The walk record, the lease holder and the holder's live share and pressure."""
    thread = walk_thread_id(DEFAULT_GROUP, plan.graph_id)
    latest = store.latest(thread)
    view = WalkView()
    if latest is None:
        return view
    view.record = WalkRecord.from_state(thread, latest.checkpoint.state)
    meta = latest.checkpoint.metadata
    view.node = meta.get(NODE_KEY)
    with contextlib.suppress(TypeError, ValueError):
        view.share = float(meta.get(SHARE_KEY, ""))
    with contextlib.suppress(TypeError, ValueError):
        view.rate = float(meta.get(RATE_KEY, ""))
    claim = store.current_claim(thread)
    if claim is not None and claim.expires_at > datetime.now(UTC):
        view.holder = claim.holder.split("/", 1)[0]
        status = read_status(folder, view.holder)
        if status is not None:
            if status.get("share") is not None:
                view.share = float(status["share"])
            view.pressed = bool(status.get("pressed"))
    return view


def first_record_at(store: Any, plan: WalkPlan, schema: str) -> datetime | None:
    """When the walk of ``schema`` was claimed: the time its first record (committed at the claim) carries."""
    thread = walk_thread_id(DEFAULT_GROUP, plan.graph_id)
    first: datetime | None = None
    before: str | None = None
    while True:
        page = store.history(thread, limit=1000, before=before)
        for checkpoint in page:  # newest first
            if WalkRecord.from_state(thread, checkpoint.state).schema == schema:
                first = checkpoint.created_at
        if len(page) < 1000:
            return first
        before = page[-1].id


def run_walk_demo(
    store: Any, url: str, plan: WalkPlan, folder: Path, display: WalkDisplay, log_level: str
) -> tuple[WalkRun, list[Worker]]:
    """Runs steps 2-4 of the module docstring (the store is filled already); stops every worker it started."""
    v1_hash = release_access("v1", plan.graph_id).for_graph(plan.graph_id).hash
    v2_hash = release_access("v2", plan.graph_id).for_graph(plan.graph_id).hash
    run = WalkRun()
    workers: list[Worker] = []
    deadline = time.monotonic() + plan.timeout.total_seconds()
    exited: set[str] = set()  # reported (or stopped on purpose)

    def poll(until: Any, what: str) -> bool:
        while True:
            status = {w.name: s for w in workers if (s := read_status(folder, w.name)) is not None}
            view = read_view(store, plan, folder)
            display.update(workers, view, status)
            if until(view, status):
                return True
            for worker in workers:
                if worker.process.poll() is not None and not worker.killed and worker.name not in exited:
                    exited.add(worker.name)
                    display.note(f"{worker.name} exited with status {worker.process.returncode}: "
                                 + " | ".join(worker.log_tail()[-2:]))  # fmt: skip
            if time.monotonic() > deadline:
                display.note(f"gave up waiting for {what} after {plan.timeout.total_seconds():.0f}s")
                run.timed_out = True
                return False
            time.sleep(POLL_S)

    try:
        workers.append(start_walk_worker("v1-1", "v1", url, folder, plan, log_level))
        display.note(f"started v1-1 (pid {workers[0].pid}), release v1: schema {v1_hash} (tenant only)")
        if not poll(lambda view, _s: view.record is not None and view.record.completed, "v1's walk"):
            return run, workers
        display.note(f"v1's walk of {plan.graph_id} completed (schema {v1_hash}: nothing to change)")
        for name in ("v2-1", "v2-2"):
            workers.append(start_walk_worker(name, "v2", url, folder, plan, log_level))
        display.note(
            f"started v2-1 (pid {workers[1].pid}), v2-2 (pid {workers[2].pid}), release v2: schema {v2_hash} "
            "(tenant, region); v2's walk waits while a v1 member is alive"
        )
        if not poll(lambda _v, status: all(w.name in status for w in workers), "the v2 processes"):
            return run, workers
        overlap_end = time.monotonic() + plan.overlap.total_seconds()
        if not poll(lambda _v, _s: time.monotonic() >= overlap_end, "the overlap"):
            return run, workers
        view = read_view(store, plan, folder)
        run.v2_waited = view.record is not None and view.record.schema == v1_hash
        v1 = workers[0]
        exited.add(v1.name)
        stopping = time.monotonic()
        stop_workers([v1])
        run.v1_stop_took_s = time.monotonic() - stopping
        run.v1_stopped_at = datetime.now(UTC)
        run.v1_stopped_s = display.elapsed()
        display.note(f"stopped v1-1 (SIGTERM, {v1.status()} after {run.v1_stop_took_s:.1f}s); its membership "
                     f"expires in {plan.ttl.total_seconds():g}s")  # fmt: skip
        if v1.status() != "stopped":
            for line in v1.log_tail():
                display.note(f"  v1-1: {line}")
        if not poll(lambda view, _s: view.record is not None and view.record.schema == v2_hash, "v2's walk"):
            return run, workers
        view = read_view(store, plan, folder)
        run.walk_started_s = display.elapsed()
        run.walk_started_by = view.holder or view.node
        display.note(f"v2's walk started by {run.walk_started_by}: heads {view.record.heads if view.record else '-'}")
        if plan.crash:
            due = max(1, int(plan.threads * CRASH_AT))

            def walked_enough(view: WalkView, _s: Any) -> bool:
                record = view.record
                return record is not None and (record.completed or (record.count >= due and view.holder is not None))

            if not poll(walked_enough, "a third of the walk"):
                return run, workers
            view = read_view(store, plan, folder)
            victim = next((w for w in workers if w.name == view.holder and w.process.poll() is None), None)
            if victim is None or view.record is None or view.record.completed:
                display.note("the walk completed before the crash could come: no SIGKILL (use more --threads)")
            else:
                os.kill(victim.pid, signal.SIGKILL)
                victim.killed = True
                victim.process.wait()
                record = view.record
                run.killed = {"worker": victim.name, "pid": victim.pid, "at_s": display.elapsed(),
                              "cursor": record.cursor, "count": record.count}  # fmt: skip
                display.note(f"SIGKILL {victim.name} (pid {victim.pid}) mid-walk, holding the lease: cursor "
                             f"{record.cursor} count {record.count}")  # fmt: skip

                def resumed(view: WalkView, _s: Any) -> bool:
                    return view.node is not None and view.node != victim.name and view.record is not None

                if not poll(resumed, "another process to resume the walk"):
                    return run, workers
                view = read_view(store, plan, folder)
                assert view.record is not None
                run.resumed = {"worker": view.node, "at_s": display.elapsed(), "cursor": view.record.cursor,
                               "count": view.record.count}  # fmt: skip
                display.note(f"{view.node} resumed the walk through the lease: cursor {view.record.cursor} "
                             f"count {view.record.count}")  # fmt: skip
        if not poll(lambda view, _s: view.record is not None and view.record.completed, "the walk to complete"):
            return run, workers
        view = read_view(store, plan, folder)
        run.record = view.record
        run.completed_s = display.elapsed()
        run.walk_claimed_at = first_record_at(store, plan, v2_hash)
        display.note(f"v2's walk completed: {view.record.count if view.record else 0} threads stamped")
    finally:
        stop_workers(workers)
        display.note("workers stopped; auditing every row")
    return run, workers


def scenario_checks(run: WalkRun, plan: WalkPlan) -> list[Check]:
    """The scenario's own checks (the stamps are the audit's)."""
    v2_hash = release_access("v2", plan.graph_id).for_graph(plan.graph_id).hash
    started = run.v1_stopped_at is not None and run.walk_claimed_at is not None
    after = started and (run.walk_claimed_at or datetime.min) >= (run.v1_stopped_at or datetime.max)
    gap = (run.walk_claimed_at - run.v1_stopped_at).total_seconds() if started else 0.0  # type: ignore[operator]
    checks = [
        Check(
            name="v2's walk waited while v1 ran",
            passed=run.v2_waited,
            figure=f"v1 and v2 side by side {plan.overlap.total_seconds():g}s",
            problems=() if run.v2_waited else ("the walk record was not v1's when v1 was stopped",),
        ),
        Check(
            name="v2's walk started only after v1 stopped",
            passed=after,
            figure=f"claimed {gap:.1f}s after v1 exited (membership ttl {plan.ttl.total_seconds():g}s)"
            if started
            else "-",
            problems=()
            if after
            else ("v2's walk never started",)
            if not started
            else (f"v2's walk was claimed {-gap:.1f}s before v1 stopped",),
        ),
    ]
    if plan.crash:
        killed, resumed = run.killed, run.resumed
        problems: tuple[str, ...] = ()
        if killed is None:
            problems = ("no walker was killed mid-walk",)
        elif resumed is None:
            problems = ("nobody resumed the walk",)
        elif resumed["worker"] == killed["worker"]:
            problems = ("the killed process is still recorded as walking",)
        elif (resumed["count"] or 0) < (killed["count"] or 0):
            problems = ("the walk's count went back after the takeover",)
        figure = (
            f"{killed['worker']} killed at count {killed['count']}; {resumed['worker']} resumed "
            f"{resumed['at_s'] - killed['at_s']:.1f}s later"
            if killed is not None and resumed is not None
            else "-"
        )
        checks.append(
            Check(
                name="the killed walker's walk resumed by another process",
                passed=not problems,
                figure=figure,
                problems=problems,
            )
        )
    record = run.record
    complete = record is not None and record.completed and record.schema == v2_hash and record.count >= plan.threads
    checks.append(
        Check(
            name="v2's walk completed over every thread",
            passed=complete,
            figure=f"{record.count if record else 0}/{plan.threads} threads",
            problems=() if complete else (f"walk record: {record}",),
        )
    )
    return checks


def audit_checks(result: AuditResult) -> list[Check]:
    """The audit as checks: each count must be 0, and rows must have been read at all."""
    counts = (
        sum(result.unstamped.values()),
        sum(result.misstamped.values()),
        result.cross_tenant,
        result.hidden,
    )
    keys = ("unstamped", "mis-stamped", " read ", "hidden")
    checks = [
        Check(name=name, passed=count == 0, figure=str(count),
              problems=tuple(e for e in result.examples if key in e)[:3])
        for name, count, key in zip(STAMP_CHECKS, counts, keys, strict=True)
    ]
    rows = sum(result.rows.values())
    checks.append(
        Check(
            name="rows audited",
            passed=rows > 0,
            figure=f"{rows} rows, {result.reads} tenant reads",
            problems=() if rows else ("no row of the demo's threads was read",),
        )
    )
    return checks


def audit_table(result: AuditResult) -> Table:
    """Row kind | rows | unstamped | mis-stamped, then the tenant reads."""
    table = Table(title="audit", title_justify="left")
    for column in ("rows", "read", "unstamped", "mis-stamped"):
        table.add_column(column, justify="left" if column == "rows" else "right")
    for kind, count in result.rows.items():
        table.add_row(kind, str(count), str(result.unstamped.get(kind, 0)), str(result.misstamped.get(kind, 0)))
    table.add_row("total", str(sum(result.rows.values())), str(sum(result.unstamped.values())),
                  str(sum(result.misstamped.values())))  # fmt: skip
    return table


def fill(url: str, plan: WalkPlan) -> dict[str, str]:
    """Fills the store as release v1 (step 1); returns thread id -> tenant."""
    store = open_store(url, access=release_access("v1", plan.graph_id))
    try:
        return fill_v1(store, plan)
    finally:
        store.close()


__all__ = [
    "CRASH_AT",
    "POLL_S",
    "TENANTS",
    "WalkDisplay",
    "WalkRun",
    "WalkView",
    "audit",
    "audit_checks",
    "audit_table",
    "fill",
    "read_view",
    "run_walk_demo",
    "scenario_checks",
    "start_walk_worker",
]
