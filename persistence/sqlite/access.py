"""The SQLite store's access stamps (README "Access schemas"): the work of ``stamp_thread``, membership and the
stamp-checked reads, each run by :class:`~threadloom.persistence.sqlite.store.SqliteCheckpointer` inside one
transaction (writes: ``BEGIN IMMEDIATE``, which holds the file's write lock, so a commit to the thread cannot
interleave with a stamp: the stamp is derived and written under that lock). Statements are in
:mod:`threadloom.persistence.sqlite.schema`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from threadloom.domain import rules
from threadloom.domain.access import WALK_GRAPH_ID, AccessSchemas, Member, StampColumns
from threadloom.domain.clock import from_micros
from threadloom.domain.errors import CheckpointNotFound, StoreCorrupt
from threadloom.persistence import codec
from threadloom.persistence.sqlite import retention
from threadloom.persistence.sqlite import schema as sql

_UNSTAMPED: tuple[None, None, None] = (None, None, None)


def _stamp(schema: Any, tenant: Any, attrs: Any) -> StampColumns | None:
    return None if schema is None else (schema, tenant, attrs)


def _check_fence(conn: sqlite3.Connection, fence: tuple[str, int] | None) -> None:
    if fence is not None:
        row = conn.execute(sql.TOKEN_OF, (fence[0],)).fetchone()
        rules.check_token(fence[0], fence[1], row[0] if row is not None else None)


def derive(
    conn: sqlite3.Connection, access: AccessSchemas, thread_id: str, graph_id: str | None, position: int | None
) -> StampColumns | None:
    """The stamp of the thread's latest checkpoint (at ``position``) by ``access``; None for no checkpoint or a walk
    thread."""
    if graph_id is None or position is None or graph_id == WALK_GRAPH_ID:
        return None
    row = conn.execute(sql.LATEST_BODY, (thread_id, position)).fetchone()
    if row is None:
        raise StoreCorrupt("stamp_thread", f"thread {thread_id!r} names a latest checkpoint its history lacks")
    return access.for_graph(graph_id).columns(codec.decode_checkpoint(row[0], thread_id))


def log_stamp(
    conn: sqlite3.Connection,
    access: AccessSchemas,
    thread_id: str,
    graph_id: str | None,
    position: int | None,
    thread_stamp: list[Any],
) -> tuple[Any, Any, Any]:
    """The stamp of a commit without a checkpoint: the thread's (its latest checkpoint's) when it is of this store's
    schema, else derived again from the latest checkpoint and set on the thread's older rows too, in the commit's
    transaction (one more read and the re-stamp, only after a schema change)."""
    if graph_id is None or graph_id == WALK_GRAPH_ID:
        return _UNSTAMPED
    if thread_stamp[0] is not None and thread_stamp[0] == access.for_graph(graph_id).hash:
        return (thread_stamp[0], thread_stamp[1], thread_stamp[2])
    stamp = derive(conn, access, thread_id, graph_id, position)
    if stamp is None:
        return _UNSTAMPED
    restamp(conn, thread_id, stamp)
    return stamp


def restamp(conn: sqlite3.Connection, thread_id: str, stamp: StampColumns) -> int:
    """Sets ``stamp`` on every row of the thread whose stamp differs, and on the thread's row (inside the write
    transaction). Returns the rows changed (the thread's row not counted)."""
    params = (*stamp, thread_id)
    changed = 0
    for statement in (sql.RESTAMP_CHECKPOINTS, sql.RESTAMP_PENDING, sql.RESTAMP_EVENTS, sql.RESTAMP_EFFECTS):
        changed += conn.execute(statement, params).rowcount
    conn.execute(sql.RESTAMP_THREAD, params)
    return changed


def stamp_thread(
    conn: sqlite3.Connection, access: AccessSchemas, thread_id: str, fence: tuple[str, int] | None
) -> int:
    """``stamp_thread`` inside the write transaction: the fence first, then the derived stamp on every row that
    differs. Returns the rows changed."""
    _check_fence(conn, fence)
    row = conn.execute(sql.STAMP_READ, (thread_id,)).fetchone()
    if row is None:
        return 0
    stamp = derive(conn, access, thread_id, row[0], row[1])
    return 0 if stamp is None else restamp(conn, thread_id, stamp)


def heartbeat(
    conn: sqlite3.Connection, group: str, member: str, serves: tuple[str, ...], now_us: int, expires_us: int
) -> None:
    """Replaces ``member``'s heartbeat and drops the group's expired ones."""
    conn.execute(sql.EXPIRE_MEMBERS, (group, now_us))
    conn.execute(sql.HEARTBEAT, (group, member, codec.dumps(list(serves)), expires_us))


def members(rows: list[tuple[Any, ...]]) -> list[Member]:
    """The rows of ``MEMBERS`` as values."""
    out = []
    for member, serves, expires_us in rows:
        decoded = codec.loads(serves) if isinstance(serves, str) else None
        if not isinstance(decoded, list) or not all(isinstance(item, str) for item in decoded):
            raise StoreCorrupt("members", f"the heartbeat of member {member!r} does not decode; the row is damaged")
        out.append(Member(member=member, serves=tuple(decoded), expires_at=from_micros(expires_us)))
    return out


def stamped_history(
    conn: sqlite3.Connection, thread_id: str, limit: int, before: str | None
) -> tuple[str | None, list[Any]]:
    """A ``history`` page with each checkpoint's stamp, and the thread's graph kind (one snapshot)."""
    graph = conn.execute(sql.THREAD_GRAPH, (thread_id,)).fetchone()
    if before is None:
        rows = conn.execute(sql.STAMPED_HISTORY, (thread_id, limit)).fetchall()
    else:
        found = conn.execute(sql.POSITION_OF, (thread_id, before)).fetchone()
        if found is None:
            raise CheckpointNotFound(thread_id, before)
        rows = conn.execute(sql.STAMPED_HISTORY_BEFORE, (thread_id, found[0], limit)).fetchall()
    return (graph[0] if graph else None), [
        (codec.decode_checkpoint(body, thread_id), _stamp(*stamp)) for body, *stamp in rows
    ]


def stamped_events(
    conn: sqlite3.Connection, thread_id: str, after_seq: int, limit: int
) -> tuple[str | None, list[Any]]:
    """An ``events_after`` page with each event's stamp, and the thread's graph kind (one snapshot)."""
    first_seq, floor, mark, graph = conn.execute(sql.EVENTS_HEADER, (thread_id,)).fetchone()
    start = max(1, mark)
    rules.read_start(
        thread_id,
        after_seq,
        first_seq=first_seq if first_seq is not None else start,
        floor=floor if floor is not None else start,
    )
    rows = conn.execute(sql.STAMPED_EVENTS, (thread_id, retention.clamp(after_seq), limit)).fetchall()
    return graph, [(codec.decode_event(body, thread_id), _stamp(*stamp)) for body, *stamp in rows]


def stamped_thread(conn: sqlite3.Connection, thread_id: str) -> Any:
    """Every row of the thread with its stamp, and its graph kind (one snapshot)."""
    graph = conn.execute(sql.THREAD_GRAPH, (thread_id,)).fetchone()
    return (
        graph[0] if graph else None,
        [(codec.decode_checkpoint(b, thread_id), _stamp(*st)) for b, *st in conn.execute(sql.ALL_CHECKPOINTS,
                                                                                        (thread_id,))],
        [(codec.decode_pending_write(b, thread_id), _stamp(*st)) for b, *st in conn.execute(sql.ALL_PENDING,
                                                                                           (thread_id,))],
        [(codec.decode_event(b, thread_id), _stamp(*st)) for b, *st in conn.execute(sql.ALL_EVENTS, (thread_id,))],
        [(codec.decode_effect(b, thread_id), _stamp(*st)) for b, *st in conn.execute(sql.ALL_EFFECTS, (thread_id,))],
    )


__all__ = ["derive", "heartbeat", "log_stamp", "members", "restamp", "stamp_thread", "stamped_events",
           "stamped_history", "stamped_thread"]
