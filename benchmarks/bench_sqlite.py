"""SQLite section: fenced commits/s against raw sqlite3, and read latency on a short and a long history.

A *commit* is what a runtime writes per step: a new checkpoint on its thread (about 2.5 KB of JSON state), one
pending write and one event, fenced by the writer's claim, built and validated through the public API. The
baseline is the cheapest durable write SQLite allows in the same setting: one ``INSERT`` of a 2.5 KB row and
``COMMIT`` through the standard ``sqlite3`` module, on the same file system, with the store's journal mode and
``synchronous`` setting. Writers: 1, and 8 threads each committing to a thread of its own (raw: 8 connections).

Latency: the median of ``latest`` and of ``history(limit=100)`` on a thread of 100 checkpoints (the baseline)
and on one of 10,000 (2,000 with ``--quick``); the goal is a flat ratio: reads are index-backed and bounded.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchlib import Row, Section, SectionUnavailable, Settings, paired_median_us, throughput

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    PendingWrite,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STATE = {
    "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: " + "lorem ipsum dolor " * 4}
        for i in range(20)
    ],
    "step": 0,
    "scratch": {"retrieved": [f"doc-{i}" for i in range(10)]},
}
PAYLOAD = {"node": "answer", "ok": True, "tokens": 512}
RAW_ROW = "x" * len(json.dumps(STATE))
COMMIT_GOAL = 0.7
FLAT_GOAL = 1.5
WRITERS = (1, 8)
ROUNDS = 2


def store_settings() -> tuple[str, str]:
    """The journal mode and ``synchronous`` setting the SQLite store uses, read from its module."""
    try:
        from threadloom.persistence.sqlite import store as module
    except ImportError as error:
        raise SectionUnavailable(f"the SQLite store is not available ({error})") from error
    return str(module.JOURNAL_MODE), str(module.SYNCHRONOUS)


def open_sqlite(path: Path):
    """A SQLite store over the file ``path``."""
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return SqliteCheckpointer.open(str(path))


def committer(store, thread_id: str) -> Callable[[], None]:
    """Claims ``thread_id`` and returns an operation that commits the thread's next step."""
    claim = store.claim(thread_id, ClaimRequest(holder=f"run-{thread_id}", ttl=timedelta(hours=1)))
    latest = store.latest(thread_id)
    parent = [latest.checkpoint.id if latest is not None else None]
    count = [0]
    run_id = f"run-{thread_id}"

    def op() -> None:
        count[0] += 1
        checkpoint_id = f"{thread_id}:{count[0]}"
        store.commit(
            thread_id,
            Commit(
                token=claim.token,
                checkpoint=Checkpoint(
                    id=checkpoint_id,
                    parent=parent[0],
                    thread_id=thread_id,
                    run_id=run_id,
                    status=CheckpointStatus.RUNNING,
                    created_at=NOW,
                    state=STATE,
                ),
                pending_writes=(PendingWrite(checkpoint_id=checkpoint_id, task_id="task", node_id="answer",
                                             payload=PAYLOAD),),
                events=(EventDraft(run_id=run_id, type="step", timestamp=NOW, payload=PAYLOAD,
                                   checkpoint_id=checkpoint_id, node_id="answer"),),
            ),
        )
        parent[0] = checkpoint_id

    return op


def raw_writer(path: Path, journal: str, synchronous: str) -> Callable[[], None]:
    """A raw ``sqlite3`` connection to ``path`` and an operation that inserts one 2.5 KB row and commits."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute(f"PRAGMA journal_mode = {journal}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS bench (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")

    def op() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO bench (body) VALUES (?)", (RAW_ROW,))
        conn.execute("COMMIT")

    return op


def _commit_rates(settings: Settings, writers: int, journal: str, synchronous: str) -> tuple[float, float]:
    """Best commits/s of the store and of raw sqlite3 over :data:`ROUNDS` alternating rounds (fresh files each).

    Alternating and keeping the best round of each side keeps a burst of load from elsewhere on the machine
    from hurting one side alone.
    """
    best = {"ours": 0.0, "raw": 0.0}
    for round_ in range(ROUNDS):
        for side in ("ours", "raw") if round_ % 2 == 0 else ("raw", "ours"):
            path = settings.workdir / f"{side}-{writers}-{round_}.db"
            if side == "ours":
                with open_sqlite(path) as store:
                    rate = throughput(writers, settings.seconds, lambda i, store=store: committer(store, f"writer-{i}"))
            else:
                raw_writer(path, journal, synchronous)  # creates the table before the writers race
                rate = throughput(
                    writers, settings.seconds, lambda _i, path=path: raw_writer(path, journal, synchronous)
                )
            best[side] = max(best[side], rate)
    return best["ours"], best["raw"]


def _commit_rows(settings: Settings, journal: str, synchronous: str) -> list[Row]:
    rows = []
    for writers in WRITERS:
        ours, raw = _commit_rates(settings, writers, journal, synchronous)
        rows.append(
            Row(
                section="sqlite",
                measure=f"fenced commits/s, {writers} writer{'s' if writers > 1 else ''}",
                value=ours,
                baseline=raw,
                baseline_label=f"raw sqlite3 INSERT+COMMIT, {writers} writer{'s' if writers > 1 else ''}",
                unit="/s",
                goal=f"≥ {COMMIT_GOAL}×",
                met=ours / raw >= COMMIT_GOAL if raw else None,
                note=(
                    f"sqlite commits: a checkpoint with {len(RAW_ROW):,} B of JSON state + 1 pending write + 1 event, "
                    f"fenced; raw: one {len(RAW_ROW):,} B row per INSERT. Both journal_mode={journal}, "
                    f"synchronous={synchronous}, under {settings.workdir.parent.parent}. 8 writers: 8 threads on one "
                    "store (raw: 8 connections)."
                ),
            )
        )
    return rows


def _latency_rows(settings: Settings) -> list[Row]:
    small, big = 100, (2_000 if settings.quick else 10_000)
    samples = 200 if settings.quick else 1_000
    with open_sqlite(settings.workdir / "reads.db") as store:
        for thread_id, size in (("short", small), ("long", big)):
            op = committer(store, thread_id)
            for _ in range(size):
                op()
        rows = []
        for name, read in (
            ("latest", lambda t: store.latest(t)),
            ("history(limit=100)", lambda t: store.history(t, limit=100)),
        ):
            short, long = paired_median_us(
                functools.partial(read, "short"),
                functools.partial(read, "long"),
                samples,
                budget_s=2 * settings.seconds,
            )
            rows.append(
                Row(
                    section="sqlite",
                    measure=f"{name} median, {big:,}-checkpoint thread",
                    value=long,
                    baseline=short,
                    baseline_label=f"{name} median, {small}-checkpoint thread",
                    unit="µs",
                    goal=f"flat (≤ {FLAT_GOAL}×)",
                    met=long / short <= FLAT_GOAL if short else None,
                )
            )
    return rows


def run(settings: Settings) -> list[Row]:
    """The SQLite section's rows: commits/s with 1 and 8 writers, then read latencies."""
    journal, synchronous = store_settings()
    return _commit_rows(settings, journal, synchronous) + _latency_rows(settings)


SECTION = Section(
    name="sqlite",
    title="fenced commits/s vs raw sqlite3; latest/history latency, 100 vs 10,000 checkpoints",
    run=run,
    order=10,
)
