"""Section ``walks``: what an access walk costs live commits, the share it takes, and how fast it walks.

On one SQLite file (and on PostgreSQL when ``THREADLOOM_BENCH_PG`` names a server) filled with threads a node
without declarations wrote, so that a node declaring a new attribute must re-stamp them all:

- live commits/s of four writer threads (each commit a checkpoint and one event) while a runtime walks at
  ``walk_share=0.1``, against the same workload with no walk, measured in the same run, in four rounds of a phase of
  each whose order alternates (with-without, without-with, ...), so that a drift of the load from elsewhere touches
  both alike; the note lists each round's ratio, which shows how noisy the machine was (goal: at least 0.9x);
- the p99 commit latency in the same two phases (goal: at most 1.1x; SQLite serializes the walk's transactions
  with the commits, so a commit may wait for one);
- the walk's measured share - the time its ``stamp_thread`` calls took over the walk's elapsed time while it ran -
  against its target 0.1 (goal 0.8-1.05x);
- the walk's threads/s at ``walk_share=1.0`` (nothing in the way but its page reads and records) against a bare
  loop calling ``stamp_thread`` over threads prepared alike.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from bench_metered import committer
from benchlib import Row, Section, Settings

from threadloom import (
    AccessAttribute,
    AccessSchema,
    AccessSchemas,
    AccessStampOptions,
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    GraphRuntime,
    open_store,
)
from threadloom.persistence.forwarding import ForwardingCheckpointer

PG_ENV = "THREADLOOM_BENCH_PG"
GRAPH = "walked"
WRITERS = 4
SHARE = 0.1
ROUNDS = 4
"""Rounds of a phase with the walk and one without; the order alternates (ABBA) so a drift in the machine's load
touches both alike."""
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _schemas(graph_id: str) -> AccessSchemas:
    return AccessSchemas([AccessSchema(graph_id, (AccessAttribute("region", "metadata", "region"),))])


def _fill(store: Any, count: int, prefix: str, graph_id: str = GRAPH) -> list[str]:
    """``count`` threads of ``graph_id``, three checkpoints each, written without a declared schema."""
    ids = [f"{prefix}{index:06d}" for index in range(count)]
    for thread_id in ids:
        claim = store.claim(thread_id, ClaimRequest(holder="fill", ttl=timedelta(hours=1), tenant_id="acme"))
        parent = None
        for step in range(3):
            checkpoint = Checkpoint(
                id=f"c{step}", parent=parent, thread_id=thread_id, run_id="fill", status=CheckpointStatus.RUNNING,
                created_at=_T0, state={"step": step}, graph_id=graph_id, tenant_id="acme",
                metadata={"region": "eu"},
            )
            store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint))
            parent = checkpoint.id
        store.release(thread_id, claim.token)
    return ids


class _TimedStamps(ForwardingCheckpointer):
    """Sums the time of the ``stamp_thread`` calls made through it (the walk's own work)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.busy = 0.0
        self.first: float | None = None
        self.last = 0.0
        self.longest = 0.0

    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        began = time.perf_counter()
        try:
            return super().stamp_thread(thread_id, fence=fence)
        finally:
            ended = time.perf_counter()
            self.busy += ended - began
            self.longest = max(self.longest, ended - began)
            self.first = began if self.first is None else self.first
            self.last = ended


def _commit_phase(store: Any, seconds: float, tag: str) -> tuple[int, list[float]]:
    """Commits from :data:`WRITERS` threads for ``seconds``: (commits, latencies in µs)."""
    latencies: list[list[float]] = [[] for _ in range(WRITERS)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop(index: int) -> None:
        commit = committer(store, f"{tag}-{index}-{uuid.uuid4().hex[:6]}")
        mine = latencies[index]
        try:
            while not stop.is_set():
                began = time.perf_counter_ns()
                commit()
                mine.append((time.perf_counter_ns() - began) / 1000.0)
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    flat = [value for per in latencies for value in per]
    return len(flat), flat


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def _walk_done(runtime: GraphRuntime) -> bool:
    record = runtime.walks().get(GRAPH)
    return record is not None and record.completed


def _measure(name: str, url: str, settings: Settings, threads: int, cleanup: Callable[[], None]) -> list[Row]:
    writer = open_store(url)
    opened = [writer]
    try:
        store = open_store(url, access=_schemas(GRAPH))
        opened.append(store)
        timed = _TimedStamps(store)
        _fill(writer, threads, "w")
        options = AccessStampOptions(interval=timedelta(seconds=1), walk_share=SHARE, walk_rate=10_000.0)
        phase = max(settings.seconds / 2, 0.25)  # as long as before the rounds were four: the share is paced per
        # thread, so a phase much shorter than a second is dominated by one long stamp (a lock wait) and its pause
        walking: list[float] = []
        quiet: list[float] = []
        busy = walked_s = longest = 0.0
        presses = 0
        done = False
        pairs: list[float] = []
        for round_ in range(ROUNDS):  # ABBA: with-without, then without-with, ...: a load drift touches both alike
            order = ("with", "without") if round_ % 2 == 0 else ("without", "with")
            counts: dict[str, int] = {}
            for kind in order:
                if kind == "without":
                    counts[kind], lat = _commit_phase(store, phase, "without")
                    quiet += lat
                    continue
                runtime = GraphRuntime(timed, node_id="bench", access_options=options, access_group="share")
                try:
                    time.sleep(0.3)  # claimed (or resumed at its cursor) and walking
                    before, pressed_before = timed.busy, store.write_pressure.presses
                    timed.longest = 0.0
                    began = time.perf_counter()
                    counts[kind], lat = _commit_phase(store, phase, "with")
                    walked_s += time.perf_counter() - began
                    busy += timed.busy - before
                    longest = max(longest, timed.longest)
                    presses += store.write_pressure.presses - pressed_before
                    walking += lat
                    done = done or _walk_done(runtime)
                finally:
                    runtime.close()
            pairs.append(counts["with"] / max(counts["without"], 1))
        with_rate, without_rate = len(walking) / (ROUNDS * phase), len(quiet) / (ROUNDS * phase)
        share = busy / walked_s
        # walk threads/s at share 1.0 over a kind of its own, against a bare stamp_thread loop over another
        _fill(writer, threads, "f", "walked-full")
        bare = _fill(writer, threads, "b", "walked-bare")
        full_store = open_store(url, access=_schemas("walked-full"))
        bare_store = open_store(url, access=_schemas("walked-bare"))
        opened += [full_store, bare_store]
        full = AccessStampOptions(interval=timedelta(seconds=1), walk_share=1.0, walk_rate=1_000_000.0)
        began = time.perf_counter()
        walker = GraphRuntime(full_store, node_id="bench-full", access_options=full, access_group="full")
        try:
            while True:
                record = walker.walks().get("walked-full")
                if record is not None and record.completed:
                    break
                time.sleep(0.005)
            walk_rate = record.count / (time.perf_counter() - began)
        finally:
            walker.close()
        began = time.perf_counter()
        for thread_id in bare:
            bare_store.stamp_thread(thread_id)
        bare_rate = len(bare) / (time.perf_counter() - began)
    finally:
        for each in opened:
            each.close()
        cleanup()
    note = (
        f"{name}: {threads} threads of 3 checkpoints to walk; {WRITERS} writer threads, a checkpoint and an event"
        f" per commit, in {ROUNDS} rounds of a phase with the walk and one without (ABBA order; with/without per"
        f" round: {', '.join(f'{r:.2f}' for r in pairs)}); the share is the walk's stamp_thread time over the"
        f" phases it ran in (the longest stamp_thread call in them: {longest * 1000:.0f} ms; the store's presses"
        f" in them: {presses})"
    )
    bound = " (walk completed: a lower bound)" if done else ""
    p99_with, p99_without = _p99(walking), _p99(quiet)
    return [
        Row(name, f"live commits/s, walk at share {SHARE}", with_rate, without_rate, "the same, no walk", "/s",
            "≥ 0.9×", with_rate / without_rate >= 0.9, note),
        Row(name, f"commit p99, walk at share {SHARE}", p99_with, p99_without, "the same, no walk", "µs",
            "≤ 1.1×", p99_with / p99_without <= 1.1),
        Row(name, f"walk's measured share{bound}", share, SHARE, "its walk_share", "share", "0.8–1.05×",
            0.8 <= share / SHARE <= 1.05),
        Row(name, "walk threads/s at share 1.0", walk_rate, bare_rate, "a bare stamp_thread loop", "/s"),
    ]


def run(settings: Settings) -> list[Row]:
    threads = 200 if settings.quick else 1500
    rows = []
    path = settings.workdir / f"walks-{uuid.uuid4().hex[:8]}.db"

    def remove() -> None:
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(f"{path}{suffix}")
            except FileNotFoundError:
                pass

    rows += _measure("sqlite", f"sqlite:///{path}", settings, threads, remove)
    dsn = os.environ.get(PG_ENV)
    if dsn:
        import psycopg

        schema = f"bench_walks_{uuid.uuid4().hex[:8]}"

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        sep = "&" if "?" in dsn else "?"
        rows += _measure("postgres", f"{dsn}{sep}schema={schema}", settings, threads, drop)
    return rows


SECTION = Section(
    name="walks",
    title="an access walk against live commits: throughput, p99, measured share, walk speed",
    run=run,
    order=80,
)

