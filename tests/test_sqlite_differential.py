"""The SQLite store against the reference: the same random calls, the same answers (DESIGN §3 "Stores").

Each seed drives one random sequence of calls - claims, renewals, releases, fenced commits (checkpoints, retract
turns, pending writes, events, effects, metadata, origins), deletes, compaction, pruning, sweeps with guards,
registry pages and every read - through an :class:`InMemoryCheckpointer` and a SQLite arrangement sharing one
:class:`ManualClock` (which moves forward, and sometimes back). Every return value and every error (type and
fields) must be equal.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import timedelta
from typing import Any

import attrs
import pytest

from threadloom.domain import rules
from threadloom.domain.errors import ThreadloomError
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing.sqlite_harness import SqliteHarness, SqlitePairHarness, SqliteReopeningHarness

THREADS = ["a", "b", "c", "p", "ü-x", "z"]
PARENTS = ["p", "a"]
RUNS = ["r1", "r2", "r3", "r4"]
TENANTS = [None, "t1", "t2"]
CHECKPOINT_IDS = [f"c{i}" for i in range(24)]
KEYS = ["k1", "k2", "k3"]


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except ThreadloomError as error:
        return ("error", (type(error).__name__, attrs.astuple(error, recurse=True)))


class _Guard:
    def __init__(self, rng: random.Random, fail: bool) -> None:
        self.rng = rng
        self.fail = fail

    def protected(self, thread_ids: tuple[str, ...]) -> dict[str, frozenset[str]]:
        if self.fail:
            raise ValueError("guard refused")
        return {
            thread_id: frozenset(self.rng.sample(RUNS, self.rng.randint(0, 2)))
            for thread_id in thread_ids
            if self.rng.random() < 0.4
        }


class _Driver:
    """Generates one random call at a time and applies it to both stores."""

    def __init__(self, seed: int, reference: InMemoryCheckpointer, store: Any, clock: Any) -> None:
        self.rng = random.Random(seed)
        self.reference = reference
        self.store = store
        self.clock = clock
        self.tokens: dict[str, int] = {}
        self.issued: list[int] = []
        self.cursors: list[ThreadCursor] = []
        self.step = 0

    def both(self, name: str, *args: Any, **kwargs: Any) -> Any:
        expected = _outcome(lambda: getattr(self.reference, name)(*args, **kwargs))
        actual = _outcome(lambda: getattr(self.store, name)(*args, **kwargs))
        assert actual == expected, f"step {self.step}: {name}{args} {kwargs}"
        return expected

    def token(self, thread_id: str) -> int:
        choice = self.rng.random()
        if choice < 0.75 and thread_id in self.tokens:
            return self.tokens[thread_id]
        if choice < 0.9 and self.issued:
            return self.rng.choice(self.issued)
        return self.rng.randint(1, 60)

    def json(self) -> Any:
        return self.rng.choice([None, 1, 2.5, "s", [1, (2, 3)], {"k": [True, None]}, {"deep": {"x": "ü"}}])

    def draft_checkpoint(self, thread_id: str) -> Checkpoint:
        latest = self.reference.latest(thread_id)
        parent = latest.checkpoint.id if latest is not None else None
        if self.rng.random() < 0.15:
            parent = self.rng.choice([None, *CHECKPOINT_IDS[:10]])
        history = [cp.id for cp in self.reference.history(thread_id, limit=1000)]
        if self.rng.random() < 0.2 and history:
            cid = self.rng.choice(history)  # a duplicate id
        else:
            cid = self.rng.choice(CHECKPOINT_IDS)
            if cid == parent:
                cid = CHECKPOINT_IDS[-1] if parent != CHECKPOINT_IDS[-1] else CHECKPOINT_IDS[-2]
        origin = None
        if self.rng.random() < 0.4:
            origin = CheckpointOrigin(parent_thread=self.rng.choice([p for p in PARENTS if p != thread_id]))
        return Checkpoint(
            id=cid,
            parent=parent,
            thread_id=thread_id,
            run_id=self.rng.choice(RUNS),
            status=self.rng.choice(list(CheckpointStatus)),
            created_at=self.clock.now() - timedelta(days=self.rng.randint(0, 3)),
            state={"n": self.rng.randint(0, 9), "v": self.json()},
            graph_id=self.rng.choice(["g1", "g2"]),
            tenant_id=self.rng.choice(TENANTS),
            origin=origin,
            metadata=self.rng.choice([{}, {"m": "1"}]),
        )

    def commit(self, thread_id: str) -> None:
        rng = self.rng
        cp = self.draft_checkpoint(thread_id) if rng.random() < 0.7 else None
        latest = self.reference.latest(thread_id)
        resulting = cp.id if cp is not None else (latest.checkpoint.id if latest is not None else "c0")
        writes = [
            PendingWrite(
                checkpoint_id=resulting if rng.random() < 0.9 else "c1",
                task_id=f"task{i}",
                node_id="n",
                payload=self.json(),
            )
            for i in range(rng.choice([0, 0, 1, 2]))
        ]
        events = [
            EventDraft(run_id=rng.choice(RUNS), type="e", timestamp=self.clock.now(), payload=self.json())
            for _ in range(rng.choice([0, 1, 1, 2, 3]))
        ]
        effects = [
            EffectRecord(key=key, run_id=rng.choice(RUNS), recorded_at=self.clock.now(), result=self.json())
            for key in rng.sample(KEYS, rng.choice([0, 0, 1, 2]))
        ]
        fence = None
        if rng.random() < 0.1:
            other = rng.choice([t for t in THREADS if t != thread_id])
            fence = (other, self.token(other))
        metadata = None
        if rng.random() < 0.15:
            metadata = rng.choice([{"x": str(rng.randint(0, 3))}, {rules.DELETING_KEY: "true"}, {"y": "1", "x": "0"}])
        commit = Commit(
            token=self.token(thread_id),
            checkpoint=cp,
            pending_writes=writes,
            events=events,
            effects=effects,
            retract_turn=rng.random() < 0.15,
            fence=fence,
            metadata=metadata,
        )
        self.both("commit", thread_id, commit)

    def policy(self) -> RetentionPolicy:
        rng = self.rng
        return RetentionPolicy(
            max_age=rng.choice([None, None, timedelta(seconds=rng.randint(1, 60))]),
            max_checkpoints=rng.choice([None, None, rng.randint(1, 4)]),
            max_events=rng.choice([None, None, rng.randint(0, 5)]),
        )

    def run(self, steps: int) -> None:
        rng = self.rng
        for self.step in range(steps):
            thread_id = rng.choice(THREADS)
            kind = rng.random()
            if kind < 0.15:
                outcome = self.both(
                    "claim",
                    thread_id,
                    ClaimRequest(
                        holder=rng.choice(RUNS), ttl=timedelta(seconds=rng.randint(1, 40)), tenant_id=rng.choice(TENANTS)
                    ),
                )
                if outcome[0] == "ok":
                    self.tokens[thread_id] = outcome[1].token
                    self.issued.append(outcome[1].token)
            elif kind < 0.16:
                self.both("renew", thread_id, self.token(thread_id), timedelta(seconds=rng.randint(1, 40)))
            elif kind < 0.20:
                self.both("release", thread_id, self.token(thread_id))
            elif kind < 0.45:
                self.commit(thread_id)
            elif kind < 0.48:
                fence = None
                if rng.random() < 0.2:
                    other = rng.choice([t for t in THREADS if t != thread_id])
                    fence = (other, self.token(other))
                self.both("delete_thread", thread_id, self.token(thread_id), fence=fence)
            elif kind < 0.52:
                self.both("latest", thread_id)
            elif kind < 0.55:
                self.both("checkpoint", thread_id, rng.choice(CHECKPOINT_IDS[:12]))
            elif kind < 0.59:
                self.both(
                    "history", thread_id, limit=rng.randint(1, 4), before=rng.choice([None, *CHECKPOINT_IDS[:12]])
                )
            elif kind < 0.62:
                self.both("children", rng.choice(PARENTS), limit=rng.randint(1, 3), after=rng.choice([None, *THREADS]))
            elif kind < 0.68:
                self.both("events_after", thread_id, rng.randint(0, 14), rng.randint(1, 5))
            elif kind < 0.70:
                self.both("compact_events", thread_id, rng.randint(0, 14))
            elif kind < 0.72:
                self.both("effect", thread_id, rng.choice(KEYS))
            elif kind < 0.74:
                self.both("lookup_run", thread_id, rng.sample(RUNS, rng.randint(0, 3)))
            elif kind < 0.77:
                self.both("prune", thread_id, self.policy())
            elif kind < 0.81:
                policy = SweepPolicy(
                    retention=self.policy(),
                    batch_size=rng.randint(1, 4),
                    tombstone_age=rng.choice([None, timedelta(seconds=rng.randint(1, 30))]),
                )
                seed = rng.random()
                fail = rng.random() < 0.1
                after = rng.choice([None, *THREADS, "b-"])
                expected = _outcome(lambda: self.reference.sweep(policy, _Guard(random.Random(seed), fail), after=after))
                actual = _outcome(lambda: self.store.sweep(policy, _Guard(random.Random(seed), fail), after=after))
                assert actual == expected, f"step {self.step}: sweep({policy}, after={after!r})"
            elif kind < 0.86:
                statuses = None
                if rng.random() < 0.3:
                    statuses = frozenset(rng.sample(list(ThreadStatus), rng.randint(1, 3)))
                query = ThreadQuery(
                    tenant_id=rng.choice(TENANTS),
                    limit=rng.randint(1, 4),
                    after=rng.choice([None, *self.cursors[-3:]]),
                    statuses=statuses,
                    updated_since=rng.choice([None, self.clock.now() - timedelta(seconds=rng.randint(0, 120))]),
                    graph_id=rng.choice([None, "g1", "g2"]),
                )
                outcome = self.both("threads", query)
                if outcome[0] == "ok" and outcome[1].next is not None:
                    self.cursors.append(outcome[1].next)
            elif kind < 0.89:
                outcome = self.both(
                    "incomplete",
                    rng.choice(TENANTS),
                    limit=rng.randint(1, 3),
                    after=rng.choice([None, *self.cursors[-3:]]),
                )
                if outcome[0] == "ok" and outcome[1].next is not None:
                    self.cursors.append(outcome[1].next)
            elif kind < 0.97:
                self.clock.advance(timedelta(seconds=rng.randint(0, 25), microseconds=rng.randint(0, 999_999)))
            else:
                self.clock.advance(-timedelta(seconds=rng.randint(1, 5)))  # a clock that steps back
        self.compare_everything()

    def compare_everything(self) -> None:
        for thread_id in THREADS:
            self.both("latest", thread_id)
            self.both("history", thread_id, limit=1000)
            self.both("events_after", thread_id, 0, 10_000)
            for key in KEYS:
                self.both("effect", thread_id, key)
        for parent in PARENTS:
            self.both("children", parent, limit=1000)
        for tenant in TENANTS:
            self.both("threads", ThreadQuery(tenant_id=tenant, limit=1000))
            self.both("incomplete", tenant, limit=1000)
        self.both("sweep", SweepPolicy(batch_size=1000), None)


def _check_run_starts(path: str) -> None:
    """The runs' index holds each run's stretches: ``run_start`` is 1 exactly on the checkpoints whose predecessor
    in their history is of another run, or that have none (what ``lookup_run`` and retention read)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT thread_id, position, run_id, run_start FROM checkpoints ORDER BY thread_id, position"
        ).fetchall()
    finally:
        conn.close()
    before: dict[str, str] = {}
    for thread_id, position, run_id, run_start in rows:
        assert run_start == (None if before.get(thread_id) == run_id else 1), (thread_id, position, run_id)
        before[thread_id] = run_id


ARRANGEMENTS = [(SqliteHarness, range(40), 250), (SqlitePairHarness, range(8), 200), (SqliteReopeningHarness, range(4), 150)]


@pytest.mark.parametrize(
    ("harness_class", "seed", "steps"),
    [(harness, seed, steps) for harness, seeds, steps in ARRANGEMENTS for seed in seeds],
    ids=lambda value: getattr(value, "name", str(value)),
)
def test_same_answers_as_the_reference(harness_class: type, seed: int, steps: int) -> None:
    harness = harness_class()
    try:
        store = harness.open()
        reference = InMemoryCheckpointer(harness.clock)
        _Driver(seed, reference, store, harness.clock).run(steps)
        _check_run_starts(harness.path)
    finally:
        harness.cleanup()
