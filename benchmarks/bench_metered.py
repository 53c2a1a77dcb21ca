"""Section ``metered``: what ``MeteredCheckpointer`` costs a commit (goal: at most 5% fewer commits/s).

Each row is the commits per CPU-second of a store wrapped in a ``MeteredCheckpointer`` (with the in-process meter)
next to those of the same kind of store unwrapped, measured in the same run in alternating back-to-back batches
timed by the writer thread's CPU time (the wrapper costs CPU only; CPU time is not stretched by other processes on
a shared machine, and for a store that waits on fsync the wall-clock overhead is smaller still). One writer commits a
checkpoint and one event per commit, moving to a fresh thread every :data:`COMMITS_PER_THREAD` commits so the
history stays short. The SQLite row appears when the SQLite store is available, the PostgreSQL row when
``THREADLOOM_BENCH_PG`` names a server (the benchmark works in a schema of its own and drops it).
"""

from __future__ import annotations

import gc
import itertools
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from benchlib import Row, Section, Settings

from threadloom import (
    Checkpoint,
    Checkpointer,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    InMemoryCheckpointer,
    InMemoryMeter,
    MeteredCheckpointer,
)

COMMITS_PER_THREAD = 100
PG_ENV = "THREADLOOM_BENCH_PG"
"""A ``postgresql://`` URL: when set, a PostgreSQL row is measured too (in a schema of its own, dropped after)."""

GOAL = 0.95
"""Wrapped commits/s at least this share of bare commits/s (the wrapper costs at most 5%)."""

_START = datetime(2026, 1, 1, tzinfo=UTC)
_TTL = timedelta(hours=1)


class _Committer:
    """Commits a checkpoint and one event per call, on a new thread every :data:`COMMITS_PER_THREAD` commits."""

    def __init__(self, store: Checkpointer, name: str) -> None:
        self.store = store
        self.name = name
        self.threads = itertools.count()
        self.event = EventDraft(run_id="bench", type="step", timestamp=_START, payload={"n": 1})
        self.thread_id = ""
        self.token = 0
        self.parent: str | None = None
        self.done = COMMITS_PER_THREAD

    def __call__(self) -> None:
        if self.done == COMMITS_PER_THREAD:
            self.thread_id = f"{self.name}-{next(self.threads)}"
            self.token = self.store.claim(self.thread_id, ClaimRequest(holder="bench", ttl=_TTL)).token
            self.parent, self.done = None, 0
        cp_id = f"c{self.done}"
        checkpoint = Checkpoint(
            id=cp_id, parent=self.parent, thread_id=self.thread_id, run_id="bench",
            status=CheckpointStatus.RUNNING, created_at=_START, state={"n": self.done},
        )
        self.store.commit(self.thread_id, Commit(token=self.token, checkpoint=checkpoint, events=(self.event,)))
        self.parent = cp_id
        self.done += 1


def committer(store: Checkpointer, name: str) -> Callable[[], None]:
    """One commit per call to ``store``: a checkpoint and one event, on a new thread every 100 commits."""
    return _Committer(store, name)


def commit_overhead(
    make_store: Callable[[], Checkpointer], *, seconds: float, batch: int = 200, min_pairs: int = 5
) -> tuple[float, float]:
    """Commits per CPU-second of a store bare and of one wrapped in a ``MeteredCheckpointer``, in the same run.

    Two stores are built (one bare, one wrapped with an ``InMemoryMeter``) and measured in back-to-back batches
    of ``batch`` commits, alternating which side goes first, for about ``seconds`` in all (at least
    ``min_pairs`` pairs). Each batch is timed by the writer thread's CPU time (``time.thread_time``): the
    wrapper costs CPU only, and CPU time is not stretched by other processes competing for the machine, as
    wall time is. For a store that waits on I/O (an fsync) the ratio is therefore conservative: the wall-clock
    overhead is smaller still. The median batch of each side counts.

    Args:
        make_store: builds a fresh, empty store (called twice).
        seconds: the time budget of the whole measurement.
        batch: commits per timed batch.
        min_pairs: the fewest bare/wrapped pairs measured, whatever ``seconds`` says.

    Returns:
        ``(bare, wrapped)`` median commits per CPU-second of the writer; ``1 - wrapped / bare`` is the
        wrapper's overhead.
    """
    bare_store = make_store()
    wrapped_store = MeteredCheckpointer(make_store(), InMemoryMeter())
    try:
        sides = {"bare": committer(bare_store, "bare"), "wrapped": committer(wrapped_store, "wrapped")}
        for commit in sides.values():  # warm up: first claims, caches, the files' first pages
            for _ in range(min(batch, 50)):
                commit()
        rates: dict[str, list[float]] = {"bare": [], "wrapped": []}
        deadline = time.perf_counter() + seconds
        pairs = 0
        while pairs < min_pairs or time.perf_counter() < deadline:
            for side in ("bare", "wrapped") if pairs % 2 == 0 else ("wrapped", "bare"):
                commit = sides[side]
                gc.collect()
                began = time.thread_time()
                for _ in range(batch):
                    commit()
                rates[side].append(batch / max(time.thread_time() - began, 1e-9))
            pairs += 1
        return statistics.median(rates["bare"]), statistics.median(rates["wrapped"])
    finally:
        bare_store.close()
        wrapped_store.close()


def _drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _stores(settings: Settings) -> list[tuple[str, Callable[[], Checkpointer], Callable[[], None]]]:
    """``(label, make_store, cleanup)`` of every store kind available here."""
    stores: list[tuple[str, Callable[[], Checkpointer], Callable[[], None]]] = [
        ("memory", InMemoryCheckpointer, lambda: None)
    ]
    try:
        from threadloom.persistence.sqlite.store import SqliteCheckpointer
    except ImportError:
        pass
    else:
        files = itertools.count()
        stores.append(
            (
                "sqlite",
                lambda: SqliteCheckpointer.open(str(settings.workdir / f"metered-{next(files)}.db")),
                lambda: None,  # the run removes its work directory
            )
        )
    url = os.environ.get(PG_ENV)
    if url:
        try:
            from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig
        except ImportError:
            pass
        else:
            config = PostgresCheckpointerConfig(schema=f"tl_bench_{uuid.uuid4().hex[:12]}")
            stores.append(
                (
                    "postgresql",
                    lambda: PostgresCheckpointer.open(url, config),
                    lambda: _drop_schema(url, config.schema),
                )
            )
    return stores


def run(settings: Settings) -> list[Row]:
    rows = []
    for label, make_store, cleanup in _stores(settings):
        batch = 500 if label == "memory" else 100
        try:
            bare, wrapped = commit_overhead(make_store, seconds=settings.seconds * 2, batch=batch)
        finally:
            cleanup()
        ratio = wrapped / bare if bare else float("inf")
        rows.append(
            Row(
                section="metered",
                measure=f"commits per CPU-second through MeteredCheckpointer ({label}, 1 writer)",
                value=wrapped,
                baseline=bare,
                baseline_label=f"the same {label} store unwrapped",
                unit="/s",
                goal=f"≥ {GOAL:.2f}× (≤ 5% overhead)",
                met=ratio >= GOAL,
                note=(
                    "metered: commits per CPU-second of the writer thread (time.thread_time), bare and wrapped "
                    "stores in alternating batches, medians; a commit is one checkpoint and one event; the wrapper "
                    "records into an InMemoryMeter"
                ),
            )
        )
    return rows


SECTION = Section(
    name="metered",
    title="MeteredCheckpointer's cost per commit, against the bare store",
    run=run,
    order=60,
)
