"""Retention in SQL: what ``prune`` and ``sweep`` do to one thread, inside the caller's write transaction.

The decisions are the reference store's (:mod:`threadloom.domain.rules`: the replay floor after pruning, the
tombstone rules); here they read and delete through the indexes, a bounded number of rows besides what they remove.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from threadloom.domain import rules
from threadloom.domain.clock import duration_micros
from threadloom.domain.values import RetentionPolicy, SweepPolicy
from threadloom.persistence import codec
from threadloom.persistence.sqlite import schema as sql
from threadloom.persistence.sqlite.queue import open_runs_in

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def clamp(value: int) -> int:
    """``value`` within SQLite's 64-bit integers."""
    return max(_INT64_MIN, min(_INT64_MAX, value))


def prune(conn: sqlite3.Connection, thread_id: str, policy: RetentionPolicy, now_us: int) -> None:
    """Applies ``policy`` to one thread; the runs its open queue entries recorded keep their newest checkpoint.

    Those runs are read in this transaction, so an entry finished or a run recorded by another store or process is
    seen as of now.
    """
    row = conn.execute(sql.PRUNE_READ, (thread_id,)).fetchone()
    if row is not None:
        protected = open_runs_in(conn, (thread_id,)).get(thread_id, frozenset())
        prune_row(conn, thread_id, row, policy, now_us, protected)


def prune_row(
    conn: sqlite3.Connection,
    thread_id: str,
    row: tuple[Any, ...],
    policy: RetentionPolicy,
    now_us: int,
    protected: frozenset[str],
) -> bool:
    """Prunes one thread (``row`` as :data:`~threadloom.persistence.sqlite.schema.PRUNE_READ` reads it) as the
    reference store does; True when anything went.

    Reads only what it removes plus a bounded number of rows: the count cut-off is found from the oldest end (the
    rows before it are the ones removed), the age cut-off too (stamps never decrease along a history, so what
    ``max_age`` removes is a prefix of it: the rows the scan passes are the ones removed, or the kept newest
    checkpoints of protected runs).
    """
    _token, _first, next_seq, floor, n_checkpoints, latest_position, *_rest = row
    threshold = None if policy.max_age is None else clamp(now_us - duration_micros(policy.max_age))
    removed = 0
    oldest_kept_mark = None
    if latest_position is not None and (policy.max_age is not None or policy.max_checkpoints is not None):
        start = 0  # the checkpoints before this position go (the latest, at most, stays)
        counted = False
        if policy.max_checkpoints is not None and n_checkpoints > policy.max_checkpoints:
            counted = True
            start = conn.execute(sql.COUNT_CUTOFF, (thread_id, n_checkpoints - policy.max_checkpoints)).fetchone()[0]
        aged = False
        if threshold is not None:
            oldest, fresh = conn.execute(sql.AGE_CUTOFF, (thread_id, threshold)).fetchone()
            first_kept = latest_position if fresh is None else min(fresh, latest_position)
            aged = oldest < first_kept
            start = max(start, first_kept)
        if counted or aged:
            # Events before the oldest checkpoint the policy alone keeps go (protected runs keep theirs).
            oldest_kept_mark, oldest_kept = conn.execute(sql.OLDEST_KEPT, (thread_id, start)).fetchone()
            if protected:
                runs = codec.dumps(sorted(protected))
                positions = conn.execute(sql.PROTECTED_POSITIONS, (thread_id, runs)).fetchall()
                keep = codec.dumps(sorted({p for (p,) in positions if p is not None}))
                removed = conn.execute(sql.PRUNE_BEFORE_KEEP, (thread_id, start, keep)).rowcount
            else:
                removed = conn.execute(sql.PRUNE_BEFORE, (thread_id, start)).rowcount
            if removed:  # what now comes first, or after a kept checkpoint, may start its run's stretch
                conn.execute(sql.RESTART_RUNS, (thread_id, oldest_kept))
    newest_expired = None
    if threshold is not None:
        newest_expired = conn.execute(sql.NEWEST_EXPIRED_EVENT, (thread_id, threshold)).fetchone()[0]
    new_floor = rules.pruned_floor(
        floor=floor,
        next_seq=next_seq,
        policy=policy,
        oldest_kept_mark=oldest_kept_mark,
        newest_expired_seq=newest_expired,
    )
    events_removed = 0
    if new_floor != floor:
        events_removed = conn.execute(sql.DROP_EVENTS_BEFORE, (thread_id, new_floor)).rowcount
    if removed or new_floor != floor:
        conn.execute(sql.PRUNED, (new_floor, n_checkpoints - removed, thread_id))
    return removed > 0 or events_removed > 0


def sweep(
    conn: sqlite3.Connection,
    page: tuple[str, ...],
    policy: SweepPolicy,
    protected: dict[str, frozenset[str]],
    now_us: int,
) -> tuple[list[str], list[str]]:
    """Prunes each thread of ``page`` and reclaims its tombstone once old enough; ``(pruned, reclaimed)`` ids.

    ``protected`` is the sweep guard's answer; whatever it says, the runs open queue entries recorded are kept too,
    read in this transaction. A tombstone is reclaimed when it is older than ``policy.tombstone_age``, holds
    nothing (no claim, checkpoint, pending write, metadata, event or effect) and the guard named no run of it; the
    store-wide reclamation mark is raised past its numbering, so a later incarnation still numbers past it.
    """
    pruned: list[str] = []
    reclaimed: list[str] = []
    age_us = None if policy.tombstone_age is None else duration_micros(policy.tombstone_age)
    queued = open_runs_in(conn, page) if not policy.retention.keeps_everything else {}
    for thread_id in page:
        row = conn.execute(sql.PRUNE_READ, (thread_id,)).fetchone()
        if row is None:
            continue
        runs = protected.get(thread_id, frozenset()) | queued.get(thread_id, frozenset())
        if prune_row(conn, thread_id, row, policy.retention, now_us, runs):
            pruned.append(thread_id)
        claim_token, first_seq, next_seq, _floor, _n, latest_position, n_pending, metadata, deleted_at = row
        if (
            age_us is not None
            and deleted_at is not None
            and now_us - deleted_at > age_us
            and claim_token is None
            and latest_position is None
            and n_pending == 0
            and metadata is None
            and next_seq == first_seq
            and thread_id not in protected
            and conn.execute(sql.HAS_EFFECTS, (thread_id,)).fetchone() is None
        ):
            conn.execute(sql.RAISE_MARK, (first_seq,))
            conn.execute(sql.FORGET, (thread_id,))
            conn.execute(sql.RECLAIM_CHILD, (thread_id,))
            reclaimed.append(thread_id)
    return pruned, reclaimed


__all__ = ["clamp", "prune", "prune_row", "sweep"]
