"""The PostgreSQL store's access stamps (README "Access schemas"): ``stamp_thread``, membership and the
stamp-checked reads, mixed into :class:`~threadloom.persistence.postgres.store.PostgresCheckpointer`.

``stamp_thread`` reads the thread's latest checkpoint (one read), derives its stamp here, then calls
``tl_stamp`` (``migrations/functions/access.sql``), which locks the thread's row (``SELECT … FOR UPDATE``, the
fence's too, in id order), checks the fence and that the latest checkpoint is still the one read (positions are
never reused), and only then writes the stamp: the stamp written is always the one derived from the latest
checkpoint under the thread's lock. A commit that moved the latest meanwhile makes it read and derive again.

A commit without a checkpoint derives the same way when the thread's stamp is of another schema than this
store's (``tl_commit`` answers the latest checkpoint instead of applying; the store derives its stamp with
:meth:`PostgresAccess._log_stamp` and sends the commit again with it, which then also re-stamps the thread's
older rows, in the commit's transaction).

A stamp fenced by a walk lease (a walk's) reads as one prepared statement and commits without waiting for its WAL
flush (``STAMP_WALK``: what a walk costs live commits is its stamps' server time and none of their flushes; the
walk's next record commit makes them durable).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from threadloom.domain import rules
from threadloom.domain.access import WALK_GRAPH_ID, AccessSchemas, Member, StampColumns
from threadloom.domain.clock import duration_micros
from threadloom.domain.errors import CheckpointNotFound, StoreCorrupt, StoreUnavailable
from threadloom.persistence import codec
from threadloom.persistence.postgres.calls import as_utc

if TYPE_CHECKING:
    from threadloom.domain.values import Checkpoint, EventRecord

ACCESS_STATEMENTS = (
    "STAMP", "HEARTBEAT", "STAMP_SOURCE", "GRAPH_THREADS", "TENANT_THREADS", "TOKEN_HIGH_WATER", "MEMBERS",
    "STAMPED_HISTORY", "STAMPED_HISTORY_BEFORE", "STAMPED_EVENTS", "STAMPED_THREAD", "STAMP_WALK",
)  # fmt: skip
"""The statements of :mod:`~threadloom.persistence.postgres.sql` this mixin runs."""

STAMP_ATTEMPTS = 8
"""How many times ``stamp_thread`` (or a commit without a checkpoint to a thread another schema stamped) reads and
derives again when commits keep moving the thread's latest checkpoint between its read and its write, before it
gives up with ``StoreUnavailable`` (nothing written; retry)."""


def declared_hashes(access: AccessSchemas) -> str | None:
    """The JSON object ``tl_commit`` takes as ``p_schemas``: each declared graph kind's schema hash (a kind not in
    it has the implicit schema, whose hash the database computes); None when nothing is declared."""
    return codec.dumps({item.graph_id: item.hash for item in access.schemas}) if access.schemas else None


def moving_latest(operation: str, thread_id: str) -> StoreUnavailable:
    """The error of a stamp derived :data:`STAMP_ATTEMPTS` times from a latest checkpoint commits kept replacing."""
    return StoreUnavailable(
        operation,
        f"commits kept moving thread {thread_id!r}'s latest checkpoint during {STAMP_ATTEMPTS} attempts to derive "
        "its access stamp; nothing was written; retry",
    )


def _stamp(row: list[Any]) -> StampColumns | None:
    return None if row[1] is None else (row[1], row[2], row[3])


class PostgresAccess:
    """The access hooks of the PostgreSQL store (see the module docstring)."""

    _access: AccessSchemas

    def _call(self, operation: str, thread_id: str | None, name: str, params: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - the store provides it

    def _log_stamp(self, thread_id: str, body: str | None) -> StampColumns:
        """The stamp of a commit without a checkpoint whose thread another schema stamped: derived by this store's
        schema from ``body``, the text of the thread's latest checkpoint ``tl_commit`` answered."""
        if body is None:
            raise StoreCorrupt("commit", f"thread {thread_id!r} names a latest checkpoint its history lacks")
        latest = codec.decode_checkpoint(body, thread_id)
        return self._access.for_graph(latest.graph_id).columns(latest)

    def _stamp_thread(self, thread_id: str, fence: tuple[str, int] | None) -> int:
        fence_thread, fence_token = fence if fence is not None else (None, None)
        for _attempt in range(STAMP_ATTEMPTS):
            rows = self._call("stamp_thread", thread_id, "STAMP_SOURCE", (thread_id,), write=False, prepared=True)
            graph, position, body = rows[0] if rows else (None, None, None)
            stamp: tuple[Any, Any, Any] = (None, None, None)
            if graph is not None and graph != WALK_GRAPH_ID and body is not None:
                stamp = self._access.for_graph(graph).columns(codec.decode_checkpoint(body, thread_id))
            answer = self._call(
                "stamp_thread", thread_id, "STAMP" if fence is None else "STAMP_WALK",
                (thread_id, fence_thread, fence_token, position, *stamp),
                write=True,
            )
            code, fence_current, changed = answer[0]
            if code == 1:
                assert fence is not None
                rules.check_token(fence[0], fence[1], fence_current)  # raises StaleClaim
            if code == 0:
                return int(changed)
        raise moving_latest("stamp_thread", thread_id)

    def _graph_threads(self, graph_id: str, after: str | None, limit: int) -> list[str]:
        rows = self._call("graph_threads", None, "GRAPH_THREADS", (graph_id, after or "", limit), write=False)
        return [row[0] for row in rows]

    def _token_high_water(self) -> int:
        rows = self._call("token_high_water", None, "TOKEN_HIGH_WATER", (), write=False)
        return int(rows[0][0])

    def _heartbeat(self, group: str, member: str, serves: tuple[str, ...], ttl: timedelta) -> None:
        self._call(
            "heartbeat", None, "HEARTBEAT", (group, member, codec.dumps(list(serves)), duration_micros(ttl)),
            write=True,
        )

    def _members(self, group: str) -> list[Member]:
        out = []
        for member, serves, expires_at in self._call("members", None, "MEMBERS", (group,), write=False):
            decoded = codec.loads(serves) if isinstance(serves, str) else None
            if not isinstance(decoded, list) or not all(isinstance(item, str) for item in decoded):
                raise StoreCorrupt("members", f"the heartbeat of member {member!r} does not decode; the row is damaged")
            out.append(Member(member=member, serves=tuple(decoded), expires_at=as_utc(expires_at)))
        return out

    def _stamped_history(self, thread_id: str, limit: int, before: str | None) -> tuple[str | None, list[Any]]:
        if before is None:
            rows = self._call("tenant_history", thread_id, "STAMPED_HISTORY", (limit, thread_id), write=False)
            if not rows:
                return None, []
        else:
            rows = self._call(
                "tenant_history", thread_id, "STAMPED_HISTORY_BEFORE", (limit, thread_id, before), write=False
            )
            if not rows:
                raise CheckpointNotFound(thread_id, before)
        graph, items = rows[0]
        page: list[tuple[Checkpoint, StampColumns | None]] = [
            (codec.decode_checkpoint(item[0], thread_id), _stamp(item)) for item in items
        ]
        return graph, page

    def _stamped_events(self, thread_id: str, after_seq: int, limit: int) -> tuple[str | None, list[Any]]:
        rows = self._call(
            "tenant_events_after", thread_id, "STAMPED_EVENTS", (thread_id, after_seq, limit, thread_id), write=False
        )
        first_seq, floor, mark, graph, items = rows[0]
        if first_seq is None:
            first_seq = floor = max(1, mark)
        rules.read_start(thread_id, after_seq, first_seq=first_seq, floor=floor)
        page: list[tuple[EventRecord, StampColumns | None]] = [
            (codec.decode_event(item[0], thread_id), _stamp(item)) for item in items
        ]
        return graph, page

    def _tenant_threads(self, tenant_id: str | None, after: str | None, limit: int) -> list[str]:
        rows = self._call(
            "export_tenant", None, "TENANT_THREADS", (tenant_id or "", after or "", limit), write=False
        )
        return [row[0] for row in rows]

    def _stamped_thread(self, thread_id: str) -> Any:
        rows = self._call("export_tenant", thread_id, "STAMPED_THREAD", (thread_id,), write=False)
        if not rows:
            return None, [], [], [], []
        graph, checkpoints, pending, events, effects = rows[0]
        return (
            graph,
            [(codec.decode_checkpoint(item[0], thread_id), _stamp(item)) for item in checkpoints],
            [(codec.decode_pending_write(item[0], thread_id), _stamp(item)) for item in pending],
            [(codec.decode_event(item[0], thread_id), _stamp(item)) for item in events],
            [(codec.decode_effect(item[0], thread_id), _stamp(item)) for item in effects],
        )


__all__ = ["ACCESS_STATEMENTS", "STAMP_ATTEMPTS", "PostgresAccess", "declared_hashes", "moving_latest"]
