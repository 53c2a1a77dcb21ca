"""Integrity checks of a store's rows: the invariants every store keeps, checked on what it holds.

A store's ``check()`` reads one consistent snapshot (SQLite: one read transaction; PostgreSQL: one REPEATABLE READ
READ ONLY transaction), hands each thread's rows to :func:`audit_thread` and adds its own findings (SQLite's
``PRAGMA integrity_check``, rows of no thread). The invariants, by the :attr:`Problem.check` name that reports them:

``integrity``
    the database engine's own check of the file (SQLite only).
``decode``
    every checkpoint, pending write, event, effect record and thread metadata decodes, and says it belongs to the
    thread (and place) it is stored under; the thread's row holds integers where it keeps numbers and a known
    status.
``events``
    a thread keeps every event from its floor (below it, compaction and retention dropped them) up to the one
    right below its next number, without a gap.
``tokens``
    no token is above the store's token counter; a thread's checkpoints and events carry non-decreasing tokens, none
    above its claim's; a claim has its holder and expiry.
``registry``
    the thread's row names its newest checkpoint (id, place, status and run) and counts its checkpoints and pending
    writes right.
``pending``
    the pending writes point at the thread's latest checkpoint, which exists.
``tombstone``
    a deleted thread (tombstone) holds no checkpoint or pending write.
``orphan``
    no checkpoint, pending write, event or effect record is stored under a thread the store has no row for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from threadloom.domain.errors import StoreCorrupt
from threadloom.domain.values import Checkpoint, CheckpointStatus
from threadloom.persistence import codec

MAX_PROBLEMS = 1000
"""A check stops collecting after this many problems (:attr:`CheckReport.truncated` then says so)."""


@attrs.frozen
class Problem:
    """One broken invariant.

    Attributes:
        check: the invariant's name (see the module): ``integrity``, ``decode``, ``events``, ``tokens``,
            ``registry``, ``pending``, ``tombstone`` or ``orphan``.
        thread_id: the thread it was found in, or None for the store as a whole.
        detail: what is wrong, in words.
    """

    check: str
    thread_id: str | None
    detail: str


@attrs.frozen
class CheckReport:
    """What a store's ``check()`` found.

    Attributes:
        problems: the broken invariants, in the order found (threads by id), at most :data:`MAX_PROBLEMS`.
        truncated: more problems were found than :data:`MAX_PROBLEMS`; the check stopped collecting them.
        threads: thread rows read (tombstones included).
        checkpoints, events, pending_writes, effects: rows of each kind read.
    """

    problems: tuple[Problem, ...]
    truncated: bool = False
    threads: int = 0
    checkpoints: int = 0
    events: int = 0
    pending_writes: int = 0
    effects: int = 0

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


@attrs.frozen
class ThreadRows:
    """One thread's row and its rows, as a store's check reads them (iterables are consumed once, in order).

    Attributes:
        thread_id, first_seq, next_seq, floor: the thread's numbering.
        claim_holder, claim_token, claim_expires: its claim (all None when unclaimed); expiry as the store keeps it.
        deleted: the thread is a tombstone (deleted, nothing committed since).
        latest_id, latest_position: what the row names as the newest checkpoint.
        n_checkpoints, n_pending: what the row counts, or None where the store keeps no count.
        metadata: the thread's metadata as stored (JSON text), or None.
        latest_status, latest_run_id: the status (text) and run the row keeps for its newest checkpoint (None when
            it names none); ``...`` (the default) where the store keeps no such column.
        checkpoints: ``(position, id, body)`` by position; pending: ``(idx, body)`` in order; events:
            ``(seq, body)`` by seq; effects: ``(key, body)``.
    """

    thread_id: str
    first_seq: int
    next_seq: int
    floor: int
    claim_holder: str | None
    claim_token: int | None
    claim_expires: Any
    deleted: bool
    latest_id: str | None
    latest_position: int | None
    n_checkpoints: int | None
    n_pending: int | None
    metadata: str | None
    checkpoints: Iterable[tuple[int, str, str]]
    pending: Iterable[tuple[int, str]]
    events: Iterable[tuple[int, str]]
    effects: Iterable[tuple[str, str]]
    latest_status: Any = ...
    latest_run_id: Any = ...


_NUMBERS = ("first_seq", "next_seq", "floor", "claim_token", "latest_position", "n_checkpoints", "n_pending")
"""The row's columns that hold integers; each but the first three may be None."""
_STATUSES = frozenset(status.value for status in CheckpointStatus)


def _row_decodes(rows: ThreadRows, found: Collector) -> bool:
    """Whether the thread's row holds integers where it keeps numbers and a known status (problems to ``found``)."""
    sound = True
    for name in _NUMBERS:
        value = getattr(rows, name)
        if (value is None and name not in _NUMBERS[:3]) or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        found.add("decode", rows.thread_id, f"the thread's row holds {value!r} as {name}, not an integer; the row is "
                                            "damaged")
        sound = False
    status = rows.latest_status
    if status is not ... and status is not None and status not in _STATUSES:
        found.add("decode", rows.thread_id, f"the thread's row holds the latest status {status!r}, which this version "
                                            "does not know; the row is damaged")
        sound = False
    return sound


class Collector:
    """Gathers problems and counts for one :class:`CheckReport`, stopping at :data:`MAX_PROBLEMS`."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.truncated = False
        self.counts = {"threads": 0, "checkpoints": 0, "events": 0, "pending_writes": 0, "effects": 0}

    def add(self, check: str, thread_id: str | None, detail: str) -> None:
        """Records one problem (dropped, and :attr:`truncated` set, past :data:`MAX_PROBLEMS`)."""
        if len(self.problems) >= MAX_PROBLEMS:
            self.truncated = True
            return
        self.problems.append(Problem(check, thread_id, detail))

    def report(self) -> CheckReport:
        """The report of everything collected."""
        return CheckReport(problems=tuple(self.problems), truncated=self.truncated, **self.counts)


def _decoded(found: Collector, thread_id: str, decode: Callable[[str, str], Any], body: str) -> Any:
    try:
        return decode(body, thread_id)
    except StoreCorrupt as error:
        found.add("decode", thread_id, error.message)
        return None


def _decode_checkpoint(body: str, thread_id: str) -> Checkpoint:
    """The checkpoint of ``body``, its state decoded too (a read decodes it only when it is first read)."""
    cp = codec.decode_checkpoint(body, thread_id)
    _ = cp.state
    return cp


def audit_thread(rows: ThreadRows, last_token: int, found: Collector) -> None:
    """Checks one thread's rows against the invariants of the module; problems go to ``found``."""
    tid = rows.thread_id
    found.counts["threads"] += 1
    add = found.add
    if not _row_decodes(rows, found):
        return  # its numbers cannot be compared with its rows
    if rows.metadata is not None:
        _decoded(found, tid, codec.decode_metadata, rows.metadata)
    claim = rows.claim_token
    if claim is not None:
        if rows.claim_holder is None or rows.claim_expires is None:
            add("tokens", tid, f"the claim of token {claim} has no holder or no expiry")
        if claim > last_token:
            add("tokens", tid, f"the claim's token {claim} is above the store's token counter {last_token}")

    def check_token(what: str, token: int | None, previous: int | None) -> int | None:
        if token is None:
            return previous
        if token > last_token:
            add("tokens", tid, f"{what} carries token {token}, above the store's token counter {last_token}")
        if previous is not None and token < previous:
            add("tokens", tid, f"{what} carries token {token}, below the token {previous} of the one before it")
        if claim is not None and token > claim:
            add("tokens", tid, f"{what} carries token {token}, above the token {claim} of the thread's claim")
        return token

    count = 0
    newest: tuple[int, str] | None = None
    newest_cp: Checkpoint | None = None
    token: int | None = None
    for position, checkpoint_id, body in rows.checkpoints:
        count += 1
        newest = (position, checkpoint_id)
        newest_cp = cp = _decoded(found, tid, _decode_checkpoint, body)
        if cp is None:
            continue
        if cp.id != checkpoint_id or cp.thread_id != tid:
            add("decode", tid, f"the checkpoint stored as {checkpoint_id!r} reads as {cp.id!r} of {cp.thread_id!r}")
        token = check_token(f"checkpoint {checkpoint_id!r}", cp.fencing_token, token)
    found.counts["checkpoints"] += count
    if rows.deleted and rows.latest_id is None and count:
        add("tombstone", tid, f"the deleted thread still holds {count} checkpoint(s)")
    if newest is None:
        if rows.latest_id is not None:
            add("registry", tid, f"the row names latest checkpoint {rows.latest_id!r}, but no checkpoint is stored")
    elif (newest[1], newest[0]) != (rows.latest_id, rows.latest_position):
        add(
            "registry", tid,
            f"the row names latest checkpoint {rows.latest_id!r} at {rows.latest_position}, but the newest stored "
            f"is {newest[1]!r} at {newest[0]}",
        )
    _check_latest(rows, newest_cp if newest is not None and newest[1] == rows.latest_id else None, found)
    if rows.n_checkpoints is not None and rows.n_checkpoints != count:
        add("registry", tid, f"the row counts {rows.n_checkpoints} checkpoint(s), {count} are stored")

    count = 0
    for _idx, body in rows.pending:
        count += 1
        pw = _decoded(found, tid, codec.decode_pending_write, body)
        if pw is not None and pw.checkpoint_id != rows.latest_id:
            add(
                "pending", tid,
                f"a pending write of task {pw.task_id!r} points at checkpoint {pw.checkpoint_id!r}, not at the "
                f"latest checkpoint {rows.latest_id!r}",
            )
    found.counts["pending_writes"] += count
    if rows.deleted and rows.latest_id is None and count:
        add("tombstone", tid, f"the deleted thread still holds {count} pending write(s)")
    if rows.n_pending is not None and rows.n_pending != count:
        add("registry", tid, f"the row counts {rows.n_pending} pending write(s), {count} are stored")

    count = 0
    previous_seq: int | None = None
    token = None
    low = max(rows.floor, rows.first_seq)
    def missing(first: int, last: int, why: str) -> None:
        which = f"event {first} is" if first == last else f"events {first} to {last} are"
        add("events", tid, f"{which} missing ({why})")

    for seq, body in rows.events:
        count += 1
        if previous_seq is None:
            if seq < low:
                add("events", tid, f"event {seq} is below the thread's floor {low} (events before it were dropped)")
            elif seq > low:
                missing(low, seq - 1, f"the thread's floor is {low}: every event from there on is kept")
        elif seq != previous_seq + 1:
            missing(previous_seq + 1, seq - 1, "a gap in the numbering")
        previous_seq = seq
        event = _decoded(found, tid, codec.decode_event, body)
        if event is None:
            continue
        if event.seq != seq or event.thread_id != tid:
            add("decode", tid, f"the event stored as {seq} reads as event {event.seq} of {event.thread_id!r}")
        token = check_token(f"event {seq}", event.token, token)
    found.counts["events"] += count
    if previous_seq is None and rows.next_seq > low:
        missing(low, rows.next_seq - 1, f"the thread numbered events up to {rows.next_seq - 1}; none is stored")
    if previous_seq is not None and previous_seq != rows.next_seq - 1:
        add(
            "events", tid,
            f"the newest event is {previous_seq}, but the thread's next number is {rows.next_seq} (expected "
            f"{rows.next_seq - 1})",
        )

    count = 0
    for key, body in rows.effects:
        count += 1
        effect = _decoded(found, tid, codec.decode_effect, body)
        if effect is not None and effect.key != key:
            add("decode", tid, f"the effect stored under key {key!r} reads as key {effect.key!r}")
    found.counts["effects"] += count


def _check_latest(rows: ThreadRows, newest: Checkpoint | None, found: Collector) -> None:
    """The status and run the row keeps against the newest checkpoint it names (when that one decoded)."""
    if rows.latest_status is ...:
        return
    if rows.latest_id is None:
        if rows.latest_status is not None or rows.latest_run_id is not None:
            found.add("registry", rows.thread_id, f"the row names no latest checkpoint, but keeps the latest status "
                                                  f"{rows.latest_status!r} and run {rows.latest_run_id!r}")
        return
    if newest is None:
        return
    status, run = rows.latest_status, rows.latest_run_id
    if (status, run) != (newest.status.value, newest.run_id):
        found.add(
            "registry", rows.thread_id,
            f"the row keeps status {status!r} and run {run!r} for checkpoint {newest.id!r}, which is "
            f"{newest.status.value!r} of run {newest.run_id!r}",
        )


def orphans(found: Collector, rows: Iterator[tuple[str, str]]) -> None:
    """Records each ``(kind, thread_id)`` of rows stored under a thread the store has no row for."""
    for kind, thread_id in rows:
        found.add("orphan", thread_id, f"{kind} stored under a thread the store has no row for")


__all__ = ["MAX_PROBLEMS", "CheckReport", "Collector", "Problem", "ThreadRows", "audit_thread", "orphans"]
