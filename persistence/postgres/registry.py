"""The thread registry of the PostgreSQL store: ``threads`` and ``incomplete``, paged through indexes.

A registry page is one ``SELECT``: one branch per wanted status, each ordered by its own partial index of
``threads`` and limited to the page size plus one, merged in the page's order. A thread's status is decided
by :func:`threadloom.domain.rules.thread_status` on what the row holds, with liveness judged by the database's
clock when the statement arrives.
"""

from __future__ import annotations

from typing import Any

from threadloom.domain import rules
from threadloom.domain.errors import StoreCorrupt
from threadloom.domain.values import (
    CheckpointStatus,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence import codec
from threadloom.persistence.postgres import sql as q
from threadloom.persistence.postgres.calls import Database, as_utc


class Registry:
    """Registry reads over one store's :class:`~threadloom.persistence.postgres.calls.Database`; thread-safe."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._statements: dict[tuple[tuple[str, ...], tuple[str, ...], str], str] = {}

    def threads(self, query: ThreadQuery) -> ThreadPage:
        """The registry page ``query`` asks for: root threads newest ``updated_at`` first (as the store's
        ``threads``)."""
        conditions: list[str] = []
        params: list[Any] = []
        if query.after is not None:
            conditions.append("(t.updated_at, t.thread_id) < (%s, %s)")
            params += [query.after.updated_at, query.after.thread_id]
        if query.updated_since is not None:
            conditions.append("t.updated_at >= %s")
            params.append(query.updated_since)
        if query.graph_id is not None:
            conditions.append("t.graph_id = %s")
            params.append(query.graph_id)
        wanted = query.statuses if query.statuses is not None else frozenset(ThreadStatus)
        statuses = sorted(status.value for status in wanted)
        if not statuses:
            return ThreadPage()
        rows = self._page(
            "threads", query.tenant_id, statuses, tuple(conditions), params, newest_first=True, limit=query.limit
        )
        return ThreadPage.of([row for row in rows if query.matches(row)], query.limit)

    def incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        """IDLE root threads of ``tenant_id``, oldest ``updated_at`` first (as the store's ``incomplete``)."""
        conditions: tuple[str, ...] = ()
        params: list[Any] = []
        if after is not None:
            conditions = ("(t.updated_at, t.thread_id) > (%s, %s)",)
            params = [after.updated_at, after.thread_id]
        rows = self._page("incomplete", tenant_id, ["idle"], conditions, params, newest_first=False, limit=limit)
        return ThreadPage.of([row for row in rows if row.status is ThreadStatus.IDLE], limit)

    def _page(
        self,
        operation: str,
        tenant_id: str | None,
        statuses: list[str],
        conditions: tuple[str, ...],
        params: list[Any],
        *,
        newest_first: bool,
        limit: int,
    ) -> list[ThreadSummary]:
        """Up to ``limit + 1`` registry rows of ``statuses``, merged from one index-ordered branch per status."""
        order = "DESC" if newest_first else "ASC"
        key = (tuple(statuses), conditions, order)
        statement = self._statements.get(key)
        if statement is None:
            where = " AND ".join((q.REGISTRY_ROOTS, *conditions))
            branches = [
                f"(SELECT {q.REGISTRY_COLUMNS} FROM {{s}}.threads t WHERE {where} AND {q.REGISTRY_BRANCHES[status]} "
                f"ORDER BY t.updated_at {order}, t.thread_id {order} LIMIT %s)"
                for status in statuses
            ]
            statement = self._statements[key] = self._db.render(
                f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS page ORDER BY 6 {order}, 1 {order} LIMIT %s"
            )
        values: list[Any] = []
        for _status in statuses:
            values += [tenant_id or "", *params, limit + 1]
        values.append(limit + 1)
        return _summaries(self._db.call(operation, None, statement, values, write=False))


def _latest_status(status: str, thread_id: str) -> CheckpointStatus:
    try:
        return CheckpointStatus(status)
    except ValueError:
        raise StoreCorrupt(
            "decode", f"thread {thread_id!r} has the latest status {status!r}, which this version does not know"
        ) from None


def _summaries(rows: list[tuple[Any, ...]]) -> list[ThreadSummary]:
    """Registry rows (``sql.REGISTRY_COLUMNS``) as summaries, in the rows' order."""
    out = []
    for thread_id, tenant_id, status, live, metadata, updated_at, latest_id, latest_run, graph_id in rows:
        meta = codec.decode_metadata(metadata, thread_id)
        status = rules.thread_status(_latest_status(status, thread_id), live_claim=live, metadata=meta)
        out.append(
            ThreadSummary(
                thread_id=thread_id, tenant_id=tenant_id, status=status, updated_at=as_utc(updated_at),
                latest_checkpoint_id=latest_id, latest_run_id=latest_run, graph_id=graph_id, metadata=meta,
            )  # fmt: skip
        )
    return out


__all__ = ["Registry"]
