"""Section ``sqlite``: fenced commits/s against LangGraph's ``SqliteSaver`` and raw sqlite3; WAL pages; reads.

A *commit* is what a runtime writes per step: a new checkpoint on its thread (about 2.5 KB of JSON state), one
pending write and one event, fenced by the writer's claim, built and validated through the public API. Each
figure is measured at ``synchronous=NORMAL`` (the store's default) and at ``synchronous=FULL`` (LangGraph's, as
SQLite's own default), every side of a row at the same setting, in WAL mode. Writers: 1, and 8 threads each
committing to a thread of its own. Two baselines, alternated with ours in the same run:

* LangGraph's ``SqliteSaver`` persisting the same step the way LangGraph does: ``put`` of a checkpoint whose
  channels hold the same state, then ``put_writes`` of one write (two transactions, unfenced). 1 writer: one
  saver on one connection. 8 writers: the better of one saver shared by the 8 threads (as
  ``from_conn_string`` makes it) and 8 savers on a connection each. When ``langgraph.checkpoint.sqlite`` is
  not importable (``pip install langgraph-checkpoint-sqlite``; never a dependency) the row says so.
* The cheapest durable write SQLite allows: one ``INSERT`` of a 2.5 KB row and ``COMMIT`` through the standard
  ``sqlite3`` module (8 writers: 8 connections).

**WAL pages.** Frames appended to the write-ahead log per commit (``PRAGMA wal_checkpoint`` after a run of
commits on an emptied log), ours against the raw insert's, both files of SQLite's default page size (checked: a
page count compares only between pages of one size; larger pages would lower the raw insert's count, whose 2.5 KB
rows take a page each at 4 KiB, more than ours); LangGraph's per step in the note. Each frame is a page written
twice (to the log, then by the checkpoint to the database), and the log checkpoints every 1,000.

**Reads.** The median of ``latest`` and of ``history(limit=100)`` on a thread of 10,000 checkpoints (2,000 with
``--quick``) against one of 100 (goal: flat), and against LangGraph's ``get_tuple`` and ``list(limit=100)`` on a
thread of the same length (goal: no slower).
"""

from __future__ import annotations

import functools
import json
import math
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
"""Our commits/s at least this share of raw INSERT+COMMIT/s."""
LANGGRAPH_GOALS = {"NORMAL": 1.5, "FULL": 1.8}
"""Our commits/s at least this multiple of LangGraph's steps/s, by ``synchronous`` setting."""
WAL_GOAL = 2.0
"""WAL pages per commit at most this multiple of the raw insert's."""
FLAT_GOAL = 1.5
READ_GOAL = 1.0
"""``latest``/``history`` at most this multiple of LangGraph's ``get_tuple``/``list``."""
SYNCHRONOUS = ("NORMAL", "FULL")
WRITERS = (1, 8)
ROUNDS = 2
WAL_COMMITS = 40
"""Commits per WAL page count (well under the 1,000-page auto-checkpoint, which would restart the log)."""
LANGGRAPH_MISSING = "not installed (pip install langgraph-checkpoint-sqlite)"


def store_journal() -> str:
    """The journal mode the SQLite store uses, read from its module."""
    try:
        from threadloom.persistence.sqlite import store as module
    except ImportError as error:
        raise SectionUnavailable(f"the SQLite store is not available ({error})") from error
    return str(module.JOURNAL_MODE)


def open_sqlite(path: Path, synchronous: str = "NORMAL"):
    """A SQLite store over the file ``path``."""
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return SqliteCheckpointer.open(str(path), synchronous=synchronous)


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


class LangGraphStep:
    """One LangGraph step per call on one thread: ``put`` of the next checkpoint, then ``put_writes`` of one write.

    The checkpoint's channels are the state's keys (``messages``, ``step``, ``scratch``), all new at every step,
    as LangGraph writes channels that changed. Works over any LangGraph saver (SQLite, PostgreSQL).
    """

    def __init__(self, saver, thread_id: str) -> None:
        self.saver = saver
        self.config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        self.versions: dict[str, str] = {}
        self.step = 0

    def __call__(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.step += 1
        new_versions = {channel: self.saver.get_next_version(self.versions.get(channel), None) for channel in STATE}
        self.versions.update(new_versions)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {**STATE, "step": self.step}
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["versions_seen"] = {"answer": dict(self.versions)}
        metadata = {"source": "loop", "step": self.step, "parents": {}}
        self.config = self.saver.put(self.config, checkpoint, metadata, new_versions)
        self.saver.put_writes(self.config, [("answer", PAYLOAD)], f"task-{self.step}")


def langgraph_sqlite_available() -> bool:
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
    except ImportError:
        return False
    return True


def langgraph_connection(path: Path, synchronous: str) -> sqlite3.Connection:
    """What ``SqliteSaver.from_conn_string`` opens, at ``synchronous`` (the saver itself switches to WAL)."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
    conn.execute(f"PRAGMA synchronous = {synchronous}")  # one of SYNCHRONOUS
    return conn


def langgraph_savers(path: Path, synchronous: str, writers: int, shared: bool):
    """``writers`` SqliteSavers over ``path`` (``shared``: one saver on one connection for all), and their closer."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conns = [langgraph_connection(path, synchronous) for _ in range(1 if shared else writers)]
    savers = [SqliteSaver(conn) for conn in conns]
    for saver in savers:
        saver.setup()
    return [savers[0]] * writers if shared else savers, lambda: [conn.close() for conn in conns]


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


def _rate(settings: Settings, side: str, writers: int, journal: str, synchronous: str, tag: str) -> float:
    """Commits (steps) per second of one side on a fresh file."""
    path = settings.workdir / f"{side}-{synchronous}-{writers}-{tag}.db"
    if side == "ours":
        with open_sqlite(path, synchronous) as store:
            return throughput(writers, settings.seconds, lambda i, store=store: committer(store, f"writer-{i}"))
    if side == "raw":
        raw_writer(path, journal, synchronous)  # creates the table before the writers race
        return throughput(writers, settings.seconds, lambda _i: raw_writer(path, journal, synchronous))
    savers, close = langgraph_savers(path, synchronous, writers, shared=side == "lg-shared")
    try:
        return throughput(writers, settings.seconds, lambda i: LangGraphStep(savers[i], f"writer-{i}"))
    finally:
        close()


def _commit_rows(settings: Settings, journal: str) -> list[Row]:
    have_langgraph = langgraph_sqlite_available()
    rows = []
    for synchronous in SYNCHRONOUS:
        for writers in WRITERS:
            who = f"{writers} writer{'s' if writers > 1 else ''}"
            sides = ["ours", "raw"]
            if have_langgraph:
                sides += ["lg-own", "lg-shared"] if writers > 1 else ["lg-own"]
            best = dict.fromkeys(sides, 0.0)
            for round_ in range(ROUNDS):
                for side in sides if round_ % 2 == 0 else list(reversed(sides)):
                    best[side] = max(best[side], _rate(settings, side, writers, journal, synchronous, str(round_)))
            ours = best["ours"]
            note = (
                f"sqlite commits: a checkpoint with {len(RAW_ROW):,} B of JSON state + 1 pending write + 1 event, "
                f"fenced, one transaction; LangGraph: put (the same state as 3 channels) + put_writes (1 write), two "
                f"transactions; raw: one {len(RAW_ROW):,} B row per INSERT. All journal_mode={journal}, synchronous "
                f"as the row says, under {settings.workdir.parent.parent}. Best of {ROUNDS} alternating rounds of "
                f"{settings.seconds:g} s on fresh files; 8 writers: 8 threads on one store (raw: 8 connections)."
            )
            goal = LANGGRAPH_GOALS[synchronous]
            measure = f"fenced commits/s, {who}, synchronous={synchronous}"
            if have_langgraph:
                if writers == 1:
                    lg, lg_label = best["lg-own"], "LangGraph SqliteSaver put+put_writes, 1 writer"
                else:
                    lg = max(best["lg-own"], best["lg-shared"])
                    how = "8 savers × 1 connection" if best["lg-own"] >= best["lg-shared"] else "1 shared saver"
                    lg_label = (f"LangGraph SqliteSaver put+put_writes, {who} (best: {how}; other "
                                f"{min(best['lg-own'], best['lg-shared']):,.0f}/s)")
                rows.append(Row(section="sqlite", measure=measure, value=ours, baseline=lg, baseline_label=lg_label,
                                unit="/s", goal=f"≥ {goal:g}×", met=ours / lg >= goal if lg else None, note=note))
            else:
                rows.append(Row(section="sqlite", measure=measure, value=ours, baseline=math.nan,
                                baseline_label=f"LangGraph SqliteSaver: {LANGGRAPH_MISSING}", unit="/s",
                                goal=f"≥ {goal:g}×", met=None, note=note))
            rows.append(Row(
                section="sqlite", measure=measure, value=ours, baseline=best["raw"],
                baseline_label=f"raw sqlite3 INSERT+COMMIT, {who}", unit="/s", goal=f"≥ {COMMIT_GOAL}×",
                met=ours / best["raw"] >= COMMIT_GOAL if best["raw"] else None, note=note,
            ))
    return rows


def wal_frames(path: Path, op: Callable[[], None], commits: int) -> tuple[float, dict[str, float]]:
    """WAL frames appended per call of ``op`` (the log is emptied first, then ``commits`` calls, then counted),
    and the same frames by the b-tree their page belongs to (empty when SQLite has no ``dbstat`` table)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError("the WAL could not be emptied (a reader held it)")
        for _ in range(commits):
            op()
        by_tree = _frames_by_tree(conn, Path(f"{path}-wal"), commits)
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return frames / commits, by_tree
    finally:
        conn.close()


def page_size(path: Path) -> int:
    """``PRAGMA page_size`` of the SQLite file ``path``."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def _frames_by_tree(conn: sqlite3.Connection, wal: Path, commits: int) -> dict[str, float]:
    """Frames per commit by b-tree (``name:pagetype``), read from the log's frame headers (SQLite's WAL format:
    a 32-byte header, then per frame a 24-byte header starting with the page number, then the page)."""
    try:
        owners = dict(conn.execute("SELECT pageno, name || ':' || pagetype FROM dbstat").fetchall())
    except sqlite3.OperationalError:  # built without SQLITE_ENABLE_DBSTAT_VTAB
        return {}
    data = wal.read_bytes()
    if len(data) < 32:
        return {}
    page_size = int.from_bytes(data[8:12], "big")
    counts: dict[str, float] = {}
    for offset in range(32, len(data) - 23, 24 + page_size):
        owner = owners.get(int.from_bytes(data[offset : offset + 4], "big"), "other")
        counts[owner] = counts.get(owner, 0.0) + 1.0 / commits
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def _wal_rows(settings: Settings, journal: str) -> list[Row]:
    warm = 20  # the first commits of a file create tables' first pages: not what a steady commit writes
    with open_sqlite(settings.workdir / "wal-ours.db") as store:
        op = committer(store, "wal")
        for _ in range(warm):
            op()
        ours, by_tree = wal_frames(settings.workdir / "wal-ours.db", op, WAL_COMMITS)
    raw = raw_writer(settings.workdir / "wal-raw.db", journal, "NORMAL")
    for _ in range(warm):
        raw()
    raw_pages, _ = wal_frames(settings.workdir / "wal-raw.db", raw, WAL_COMMITS)
    sizes = {page_size(settings.workdir / name) for name in ("wal-ours.db", "wal-raw.db")}
    if len(sizes) != 1:  # pages of different sizes would not compare
        raise RuntimeError(f"the store's file and the raw insert's have different page sizes: {sorted(sizes)}")
    lg_note = f"LangGraph SqliteSaver: {LANGGRAPH_MISSING}"
    if langgraph_sqlite_available():
        savers, close = langgraph_savers(settings.workdir / "wal-lg.db", "NORMAL", 1, shared=True)
        try:
            step = LangGraphStep(savers[0], "wal")
            for _ in range(warm):
                step()
            lg_pages, _ = wal_frames(settings.workdir / "wal-lg.db", step, WAL_COMMITS)
            lg_note = f"LangGraph SqliteSaver {lg_pages:.1f}"
        finally:
            close()
    return [Row(
        section="sqlite", measure="WAL pages per commit", value=ours, baseline=raw_pages,
        baseline_label="raw sqlite3 INSERT+COMMIT's", unit="pages", goal=f"≤ {WAL_GOAL:g}×",
        met=ours <= WAL_GOAL * raw_pages if raw_pages else None,
        note=(f"WAL pages: frames appended per commit over {WAL_COMMITS} commits on an emptied log (both files "
              f"{sizes.pop():,}-byte pages); "
              f"per step: {lg_note} (put + put_writes). Ours by b-tree: "
              + (", ".join(f"{name} {pages:.2f}" for name, pages in by_tree.items()) or "(no dbstat here)") + "."),
    )]


def _fill_langgraph(path: Path, sizes: dict[str, int]) -> None:
    savers, close = langgraph_savers(path, "OFF", 1, shared=True)  # a throwaway file: durability does not matter
    try:
        for thread_id, size in sizes.items():
            step = LangGraphStep(savers[0], thread_id)
            for _ in range(size):
                step()
    finally:
        close()


def _latency_rows(settings: Settings) -> list[Row]:
    small, big = 100, (2_000 if settings.quick else 10_000)
    samples = 200 if settings.quick else 1_000
    have_langgraph = langgraph_sqlite_available()
    if have_langgraph:
        _fill_langgraph(settings.workdir / "reads-lg.db", {"long": big})
    with open_sqlite(settings.workdir / "reads.db", "OFF") as store:
        for thread_id, size in (("short", small), ("long", big)):
            op = committer(store, thread_id)
            for _ in range(size):
                op()
        rows = []
        reads = (
            ("latest", lambda t: store.latest(t), "get_tuple",
             lambda saver: saver.get_tuple({"configurable": {"thread_id": "long", "checkpoint_ns": ""}})),
            ("history(limit=100)", lambda t: store.history(t, limit=100), "list(limit=100)",
             lambda saver: list(saver.list({"configurable": {"thread_id": "long", "checkpoint_ns": ""}}, limit=100))),
        )
        for name, read, lg_name, lg_read in reads:
            short, long = paired_median_us(
                functools.partial(read, "short"), functools.partial(read, "long"), samples,
                budget_s=2 * settings.seconds,
            )
            measure = f"{name} median, {big:,}-checkpoint thread"
            rows.append(Row(
                section="sqlite", measure=measure, value=long, baseline=short,
                baseline_label=f"{name} median, {small}-checkpoint thread", unit="µs", goal=f"flat (≤ {FLAT_GOAL}×)",
                met=long / short <= FLAT_GOAL if short else None,
            ))
            if not have_langgraph:
                rows.append(Row(section="sqlite", measure=measure, value=long, baseline=math.nan,
                                baseline_label=f"LangGraph SqliteSaver {lg_name}: {LANGGRAPH_MISSING}", unit="µs",
                                goal=f"≤ {READ_GOAL:g}×", met=None))
                continue
            savers, close = langgraph_savers(settings.workdir / "reads-lg.db", "NORMAL", 1, shared=True)
            try:
                ours, lg = paired_median_us(
                    functools.partial(read, "long"), functools.partial(lg_read, savers[0]), samples,
                    budget_s=2 * settings.seconds,
                )
            finally:
                close()
            rows.append(Row(
                section="sqlite", measure=measure, value=ours, baseline=lg,
                baseline_label=f"LangGraph SqliteSaver {lg_name} median, {big:,}-checkpoint thread", unit="µs",
                goal=f"≤ {READ_GOAL:g}×", met=ours <= READ_GOAL * lg if lg else None,
            ))
    return rows


def run(settings: Settings) -> list[Row]:
    """The SQLite section's rows: commits/s at NORMAL and FULL with 1 and 8 writers, WAL pages, read latencies."""
    journal = store_journal()
    return _commit_rows(settings, journal) + _wal_rows(settings, journal) + _latency_rows(settings)


SECTION = Section(
    name="sqlite",
    title="fenced commits/s vs LangGraph's SqliteSaver and raw sqlite3 (NORMAL, FULL); WAL pages; read latency",
    run=run,
    order=10,
)
