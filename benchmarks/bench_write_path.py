"""Write-path section: client CPU per fenced commit and per history read, as multiples of plain JSON work.

Each figure is process CPU time (``time.process_time``: every thread of this process, SQLite's own work
included), never wall time, so waiting on the disk does not count. The baselines are measured in the same run
on the same data:

- a *commit* builds ``Checkpoint`` (about 2.5 KB of JSON state), one ``PendingWrite`` and one ``EventDraft``
  through the public constructors and commits them fenced by the writer's claim; the baseline is one
  ``json.dumps`` of the same state. Goals: memory store ≤ 4×, SQLite ≤ 12×.
- ``history(limit=100)`` on SQLite of a thread whose 100 checkpoints carry that state; the baseline is
  ``json.loads`` of the 100 states' JSON texts. Goal ≤ 2×.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchlib import Row, Section, Settings

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    InMemoryCheckpointer,
    PendingWrite,
    SqliteCheckpointer,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STATE = {
    "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: " + "lorem ipsum dolor " * 4,
         "tokens": 17 * i, "score": i / 7}
        for i in range(20)
    ],
    "step": 0,
    "scratch": {"retrieved": [f"doc-{i}" for i in range(10)], "ok": True, "note": None},
}
PAYLOAD = {"node": "answer", "ok": True, "tokens": 512}


def _cpu_per_call(call: Callable[[int], object], count: int, rounds: int = 5) -> float:
    """The least CPU time per call, in µs, over ``rounds`` rounds of ``count`` calls (``call(i)``)."""
    best = float("inf")
    base = 0
    for _ in range(rounds):
        start = time.process_time()
        for i in range(base, base + count):
            call(i)
        best = min(best, (time.process_time() - start) / count)
        base += count
    return best * 1e6


class _Writer:
    """Commits step after step to one thread of ``store``, fenced by one claim."""

    def __init__(self, store, thread_id: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.token = store.claim(thread_id, ClaimRequest(holder="run-1", ttl=timedelta(hours=1))).token
        self.parent: str | None = None

    def step(self, i: int) -> None:
        cp_id = f"cp-{i}"
        state = {**STATE, "step": i}
        checkpoint = Checkpoint(id=cp_id, parent=self.parent, thread_id=self.thread_id, run_id="run-1",
                                status=CheckpointStatus.RUNNING, created_at=NOW, state=state)
        self.store.commit(self.thread_id, Commit(
            token=self.token,
            checkpoint=checkpoint,
            pending_writes=[PendingWrite(checkpoint_id=cp_id, task_id=f"task-{i}", node_id="answer", payload=PAYLOAD)],
            events=[EventDraft(run_id="run-1", type="step", timestamp=NOW, payload={"step": i})],
        ))
        self.parent = cp_id


def run(settings: Settings) -> list[Row]:
    count = 300 if settings.quick else 2000
    dumps_us = _cpu_per_call(lambda i: json.dumps({**STATE, "step": i}), count * 5)
    rows: list[Row] = []
    note = ("CPU per commit: build Checkpoint (2.5 KB state) + PendingWrite + EventDraft, commit fenced; "
            "baseline json.dumps of the state")

    memory = InMemoryCheckpointer()
    writer = _Writer(memory, "memory-thread")
    memory_us = _cpu_per_call(writer.step, count)
    rows.append(Row("write_path", "CPU per fenced commit, memory store", memory_us, dumps_us,
                    "json.dumps of the state", "µs", "≤ 4×", memory_us / dumps_us <= 4, note))

    path: Path = settings.workdir / "write-path.db"
    with SqliteCheckpointer.open(path) as sqlite:
        writer = _Writer(sqlite, "sqlite-thread")
        sqlite_us = _cpu_per_call(writer.step, count // 2)
        rows.append(Row("write_path", "CPU per fenced commit, SQLite", sqlite_us, dumps_us,
                        "json.dumps of the state", "µs", "≤ 12×", sqlite_us / dumps_us <= 12, note))
        history = _Writer(sqlite, "history-thread")
        for i in range(100):
            history.step(i)
        texts = [json.dumps({**STATE, "step": i}) for i in range(100)]
        loads_us = _cpu_per_call(lambda _i: [json.loads(text) for text in texts], 50)
        read_us = _cpu_per_call(lambda _i: sqlite.history("history-thread", limit=100), 50)
        rows.append(Row("write_path", "CPU of history(limit=100), SQLite", read_us, loads_us,
                        "json.loads of the 100 states", "µs", "≤ 2×", read_us / loads_us <= 2,
                        "CPU per history page of 100 checkpoints of 2.5 KB state"))
    return rows


SECTION = Section(
    name="write_path",
    title="client CPU per fenced commit and per history page, against plain JSON encoding and decoding",
    run=run,
    order=5,
)
