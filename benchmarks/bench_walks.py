"""Section ``walks``: what an access walk costs live commits, the share it takes, and how fast it walks.

On one SQLite file (and on PostgreSQL when ``THREADLOOM_BENCH_PG`` names a server) filled with threads a node
without declarations wrote, so that a node declaring a new attribute must re-stamp them all, one runtime walks
them at ``walk_share=0.1`` for the whole measurement, as a node does for the whole of a walk in production:

- live commits/s of four writer threads (each commit a checkpoint and one event) in phases of several seconds
  while the walk runs, against phases of the same workload while the same walker is held between two threads (it
  keeps its lease, cursor and pace; held in its once-a-second read of the store's pressed signal, so the runtime,
  its heartbeats and the walker's thread stay as they are). The phases come in :data:`PAIRS` pairs whose order
  alternates (with-without, without-with, ...: a drift of the load from elsewhere touches both alike); the ratio
  is of the totals, and the note lists each pair's ratio, which shows how noisy the machine was (goal: at least
  0.9x);
- the p99 commit latency in the same two kinds of phase (goal: at most 1.1x; SQLite serializes the walk's
  transactions with the commits, so a commit may wait for one);
- the walk's measured share - the time its ``stamp_thread`` calls took over the time of the phases it ran in -
  against the share its pace aimed at: ``walk_share`` halved while the store's writes were pressed (the mean of
  the share in force, read every 0.1 s; the note gives it next to ``walk_share``) (goal 0.8-1.05x);
- the walk's threads/s at ``walk_share=1.0`` (nothing in the way but its page reads and records) against a bare
  loop calling ``stamp_thread``, fenced by a lease as the walker's calls are, over threads prepared alike.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
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
FILLERS = 4
"""Threads filling the store (a fill commit has no event: on PostgreSQL their fsyncs are shared)."""
SHARE = 0.1
PAIRS = 4
"""Pairs of a phase with the walk and one without; the order alternates (ABBA) so a drift in the machine's load
touches both alike."""
SAMPLE_S = 0.1
"""How often the share in force is read during a phase with the walk."""
HOLD_TIMEOUT_S = 10.0
"""The longest wait for the walker to reach its hold (it reads the pressed signal once a second)."""
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _schemas(graph_id: str) -> AccessSchemas:
    return AccessSchemas([AccessSchema(graph_id, (AccessAttribute("region", "metadata", "region"),))])


def _fill(store: Any, count: int, prefix: str, graph_id: str = GRAPH) -> list[str]:
    """``count`` threads of ``graph_id``, three checkpoints each, written without a declared schema by
    :data:`FILLERS` threads."""
    ids = [f"{prefix}{index:06d}" for index in range(count)]
    failures: list[BaseException] = []

    def fill(part: list[str]) -> None:
        try:
            for thread_id in part:
                claim = store.claim(thread_id, ClaimRequest(holder="fill", ttl=timedelta(hours=1), tenant_id="acme"))
                parent = None
                for step in range(3):
                    checkpoint = Checkpoint(
                        id=f"c{step}", parent=parent, thread_id=thread_id, run_id="fill",
                        status=CheckpointStatus.RUNNING, created_at=_T0, state={"step": step}, graph_id=graph_id,
                        tenant_id="acme", metadata={"region": "eu"},
                    )
                    store.commit(thread_id, Commit(token=claim.token, checkpoint=checkpoint))
                    parent = checkpoint.id
                store.release(thread_id, claim.token)
        except BaseException as error:  # reported below
            failures.append(error)

    workers = [threading.Thread(target=fill, args=(ids[i::FILLERS],)) for i in range(FILLERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return ids


class _Walked(ForwardingCheckpointer):
    """The walker's view of the store: sums the time of its ``stamp_thread`` calls (the walk's own work), and
    holds the walker - between two threads, in its once-a-second read of the pressed signal - while asked to.

    After a hold the walker reads the pressed signal of the last second only (the held time says nothing about
    the walk); its pace applies that reading to the seconds it was held, as it does after any long step.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.busy = 0.0
        self.calls = 0
        self.longest = 0.0
        self._go = threading.Event()
        self._go.set()
        self._held = threading.Event()
        self._resumed = time.monotonic()

    def stamp_thread(self, thread_id: str, *, fence: tuple[str, int] | None = None) -> int:
        began = time.perf_counter()
        try:
            return super().stamp_thread(thread_id, fence=fence)
        finally:
            took = time.perf_counter() - began
            self.busy += took
            self.calls += 1
            self.longest = max(self.longest, took)

    def pressed(self, window: timedelta = timedelta(seconds=1)) -> bool:
        if not self._go.is_set():
            self._held.set()
            self._go.wait()
            self._held.clear()
        since = timedelta(seconds=max(1.0, time.monotonic() - self._resumed))
        return super().pressed(min(window, since))

    def hold(self, finished: Callable[[], bool]) -> None:
        """Returns once the walker is held (it stamps nothing until :meth:`release_hold`) or its walk is
        ``finished`` (it stamps nothing more)."""
        self._go.clear()
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not self._held.wait(0.05):
            if finished():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the walker did not reach its hold within {HOLD_TIMEOUT_S} s")

    def release_hold(self) -> None:
        self._resumed = time.monotonic()
        self._go.set()


def _commit_phase(
    store: Any, seconds: float, tag: str, sample: Callable[[], None] | None = None
) -> tuple[int, list[float]]:
    """Commits from :data:`WRITERS` threads for ``seconds``: (commits, latencies in µs). ``sample`` is called
    every :data:`SAMPLE_S` meanwhile."""
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
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(min(SAMPLE_S, left))
        if sample is not None:
            sample()
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


def _walk_done(runtime: GraphRuntime, graph_id: str = GRAPH) -> bool:
    record = runtime.walks().get(graph_id)
    return record is not None and record.completed


def _walk_speed(url: str, fill_url: str, threads: int) -> tuple[float, float]:
    """(the walk's threads/s at share 1.0, a bare ``stamp_thread`` loop's), each over ``threads`` threads of a
    kind of its own, written alike."""
    writer = open_store(fill_url)
    full_store = open_store(url, access=_schemas("walked-full"))
    bare_store = open_store(url, access=_schemas("walked-bare"))
    try:
        _fill(writer, threads, "f", "walked-full")
        bare = _fill(writer, threads, "b", "walked-bare")
        options = AccessStampOptions(interval=timedelta(seconds=1), walk_share=1.0, walk_rate=1_000_000.0)
        began = time.perf_counter()
        walker = GraphRuntime(full_store, node_id="bench-full", access_options=options, access_group="full")
        try:
            while not _walk_done(walker, "walked-full"):
                time.sleep(0.005)
            walk_rate = threads / (time.perf_counter() - began)
        finally:
            walker.close()
        lease = bare_store.claim("bare#lease", ClaimRequest(holder="bare", ttl=timedelta(hours=1)))
        fence = ("bare#lease", lease.token)  # fenced as the walker's stamps are
        began = time.perf_counter()
        for thread_id in bare:
            bare_store.stamp_thread(thread_id, fence=fence)
        return walk_rate, len(bare) / (time.perf_counter() - began)
    finally:
        for each in (writer, full_store, bare_store):
            each.close()


@dataclass
class _Phases:
    """What the phases measured: commits and latencies per kind (``with``, ``without``), and of the walk in the
    phases with it: its stamp_thread time, calls, longest call, the store's presses, the share in force."""

    counts: dict[str, list[int]] = field(default_factory=lambda: {"with": [], "without": []})
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"with": [], "without": []})
    shares: list[float] = field(default_factory=list)
    busy: float = 0.0
    stamped: int = 0
    longest: float = 0.0
    presses: int = 0
    done: bool = False


def _phases(store: Any, walked: _Walked, runtime: GraphRuntime, phase: float) -> _Phases:
    """:data:`PAIRS` pairs of a phase with the walk and one with the walker held, in ABBA order."""
    out = _Phases()

    def sample() -> None:
        share = runtime.share(GRAPH)
        if share is not None:
            out.shares.append(share)

    holding = False
    for pair in range(PAIRS):  # ABBA: with-without, then without-with, ...: a load drift touches both alike
        for kind in ("with", "without") if pair % 2 == 0 else ("without", "with"):
            if kind == "with" and holding:
                walked.release_hold()
                holding = False
            elif kind == "without" and not holding:
                walked.hold(lambda: _walk_done(runtime))
                holding = True
            busy, calls, presses = walked.busy, walked.calls, store.write_pressure.presses
            walked.longest = 0.0
            count, lat = _commit_phase(store, phase, kind, sample if kind == "with" else None)
            out.counts[kind].append(count)
            out.latencies[kind] += lat
            if kind == "with":
                out.busy += walked.busy - busy
                out.stamped += walked.calls - calls
                out.longest = max(out.longest, walked.longest)
                out.presses += store.write_pressure.presses - presses
            elif walked.calls != calls:
                raise RuntimeError("the walker stamped a thread while held")
    out.done = _walk_done(runtime)
    return out


def _measure(name: str, url: str, fill_url: str, settings: Settings, threads: tuple[int, int]) -> list[Row]:
    """The rows of one store at ``url`` (``fill_url`` writes the threads to walk: the same store, perhaps with
    settings that only make the filling faster); ``threads``: (threads to walk, threads of each speed kind)."""
    phase = max(1.25 * settings.seconds, 0.25)
    writer = open_store(fill_url)
    store = open_store(url, access=_schemas(GRAPH))
    walked = _Walked(store)
    try:
        _fill(writer, threads[0], "w")
        writer.close()
        _commit_phase(store, min(phase, 1.0), "warm")  # the store's pool, caches and its pressure baseline
        options = AccessStampOptions(interval=timedelta(seconds=1), walk_share=SHARE, walk_rate=10_000.0)
        runtime = GraphRuntime(walked, node_id="bench", access_options=options, access_group="share")
        try:
            began = time.perf_counter()
            while walked.calls == 0 and time.perf_counter() - began < HOLD_TIMEOUT_S:
                time.sleep(0.01)  # claimed and walking
            got = _phases(store, walked, runtime, phase)
        finally:
            walked.release_hold()
            runtime.close()
    finally:
        store.close()
        writer.close()
    walk_rate, bare_rate = _walk_speed(url, fill_url, threads[1])
    seconds = PAIRS * phase
    with_rate, without_rate = sum(got.counts["with"]) / seconds, sum(got.counts["without"]) / seconds
    share = got.busy / seconds
    aimed = statistics.fmean(got.shares) if got.shares else SHARE
    pairs = [w / max(wo, 1) for w, wo in zip(got.counts["with"], got.counts["without"], strict=True)]
    note = (
        f"{name}: {threads[0]} threads of 3 checkpoints to walk ({got.stamped} stamped in the phases with the walk);"
        f" {WRITERS} writer threads, a checkpoint and an event per commit; one runtime walks at walk_share {SHARE}"
        f" throughout, held between two threads in the phases without; {PAIRS} pairs of {phase:.1f} s phases in"
        f" ABBA order (with/without per pair: {', '.join(f'{r:.2f}' for r in pairs)};"
        f" median {statistics.median(pairs):.2f}); the share is the walk's stamp_thread time over the phases it ran"
        f" in, against the mean share in force ({aimed:.3g}; walk_share {SHARE}, halved while the store's writes"
        f" were pressed: {got.presses} presses in those phases); the longest stamp_thread call in them:"
        f" {got.longest * 1000:.0f} ms"
    )
    if got.done:
        note += "; the walk completed within the phases: it did not run in all of them"
    bound = " (walk completed: a lower bound)" if got.done else ""
    p99_with, p99_without = _p99(got.latencies["with"]), _p99(got.latencies["without"])
    return [
        Row(name, f"live commits/s, walk at share {SHARE}", with_rate, without_rate, "the same, walker held", "/s",
            "≥ 0.9×", with_rate / without_rate >= 0.9, note),
        Row(name, f"commit p99, walk at share {SHARE}", p99_with, p99_without, "the same, walker held", "µs",
            "≤ 1.1×", p99_with / p99_without <= 1.1),
        Row(name, f"walk's measured share{bound}", share, aimed, "the share in force (mean)", "share",
            "0.8–1.05×", 0.8 <= share / aimed <= 1.05),
        Row(name, "walk threads/s at share 1.0", walk_rate, bare_rate, "a bare fenced stamp_thread loop", "/s"),
    ]


def run(settings: Settings) -> list[Row]:
    scale = 8 if settings.quick else 1
    rows = []
    path = settings.workdir / f"walks-{uuid.uuid4().hex[:8]}.db"
    url = f"sqlite:///{path}"
    try:
        rows += _measure("sqlite", url, url, settings, (5000 // scale, 1000 // scale))
    finally:
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(f"{path}{suffix}")
            except FileNotFoundError:
                pass
    dsn = os.environ.get(PG_ENV)
    if dsn:
        import psycopg
        from psycopg import sql

        schema = f"bench_walks_{uuid.uuid4().hex[:8]}"
        sep = "&" if "?" in dsn else "?"
        url = f"{dsn}{sep}schema={schema}"
        # the filling store commits without waiting for its WAL flush: faster, and nothing it writes is timed
        fill_url = f"{url}&options=-c%20synchronous_commit%3Doff"
        try:
            rows += _measure("postgres", url, fill_url, settings, (2500 // scale, 500 // scale))
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return rows


SECTION = Section(
    name="walks",
    title="an access walk against live commits: throughput, p99, measured share, walk speed",
    run=run,
    order=80,
)
