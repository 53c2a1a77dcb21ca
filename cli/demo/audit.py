"""The final audit of ``threadloom demo --walk``: every row's stamp, read from the stamp columns themselves, and
tenant-scoped reads for every tenant.

- **rows unstamped**: rows of the demo's threads (checkpoints, pending writes, events, effect records, and the
  thread row) whose ``access_schema`` is not the current schema's hash (NULL, or an older release's);
- **rows mis-stamped**: rows stamped with the current schema's hash whose ``access_tenant`` or ``access_attrs``
  differ from what that schema derives from the thread's latest checkpoint;
- **cross-tenant reads**: for each tenant, ``export_tenant`` (every page) and, for every thread of every tenant,
  ``tenant_history`` and ``tenant_events_after``: any thread, checkpoint or event of another tenant returned;
- **rows not returned to their tenant**: what those reads left out of the owner's own threads (a fail-closed read
  hides a row it cannot vouch for; after a complete walk none should be hidden).

The stamp columns are read first, before any tenant read (a tenant read stamps what it finds unstamped: the
follower), with SQL on the store's own file or schema.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

import attrs

from threadloom.domain.access import AccessSchemas
from threadloom.domain.values import EventRecord

SQLITE_TABLES = (("checkpoints", "checkpoints"), ("pending writes", "pending"), ("events", "events"),
                 ("effect records", "effects"), ("thread rows", "threads"))  # fmt: skip
"""(row kind, table) of the stamped rows on SQLite."""
POSTGRES_TABLES = (("checkpoints", "checkpoints"), ("pending writes", "pending_writes"), ("events", "events"),
                   ("effect records", "effects"), ("thread rows", "threads"))  # fmt: skip
"""(row kind, table) of the stamped rows on PostgreSQL."""
PAGE = 100
"""Threads per ``export_tenant`` page; checkpoints and events per tenant read."""

StampRow = tuple[str, str, str | None, str | None, Any]
"""(row kind, thread id, access_schema, access_tenant, access_attrs) as stored."""


@attrs.frozen(kw_only=True)
class AuditResult:
    """What the audit found.

    Attributes:
        rows: row kind -> rows of the demo's threads read.
        unstamped, misstamped: row kind -> rows not stamped by the current schema / stamped wrongly.
        cross_tenant: rows (threads, checkpoints, events) a tenant read returned of another tenant.
        hidden: rows of a tenant's own threads its reads did not return.
        reads: tenant-scoped read calls made.
        examples: up to five problems, described.
    """

    rows: dict[str, int]
    unstamped: dict[str, int]
    misstamped: dict[str, int]
    cross_tenant: int
    hidden: int
    reads: int
    examples: list[str]

    @property
    def clean(self) -> bool:
        """No row unstamped or mis-stamped, no cross-tenant read, nothing hidden, and rows were read at all."""
        return (
            sum(self.rows.values()) > 0
            and not any(self.unstamped.values())
            and not any(self.misstamped.values())
            and self.cross_tenant == 0
            and self.hidden == 0
        )

    def json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "rows": dict(self.rows),
            "unstamped": dict(self.unstamped),
            "misstamped": dict(self.misstamped),
            "cross_tenant_reads": self.cross_tenant,
            "hidden": self.hidden,
            "tenant_reads": self.reads,
            "examples": list(self.examples),
        }


def stamp_rows(store: Any) -> Iterable[StampRow]:
    """Every stamped row of the store, read from its tables with SQL (SQLite: its file; PostgreSQL: its schema).

    Raises:
        TypeError: the store is neither (the demo runs on these two only).
    """
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    inner = _concrete(store)
    if isinstance(inner, SqliteCheckpointer):
        conn = sqlite3.connect(f"file:{inner.path}?mode=ro", uri=True)
        try:
            for kind, table in SQLITE_TABLES:
                query = f"SELECT thread_id, access_schema, access_tenant, access_attrs FROM {table}"  # noqa: S608
                for thread_id, schema, tenant, attrs_text in conn.execute(query):
                    yield kind, thread_id, schema, tenant, attrs_text
        finally:
            conn.close()
        return
    from threadloom.persistence.postgres.store import PostgresCheckpointer

    if not isinstance(inner, PostgresCheckpointer):
        raise TypeError(f"the audit reads SQLite and PostgreSQL stores, not {type(inner).__name__}")
    from psycopg import sql

    with inner.pool.connection() as pg:
        for kind, table in POSTGRES_TABLES:
            select = sql.SQL("SELECT thread_id, access_schema, access_tenant, access_attrs FROM {}.{}").format(
                sql.Identifier(inner.config.schema), sql.Identifier(table)
            )
            for thread_id, schema, tenant, attrs_value in pg.execute(select).fetchall():
                yield kind, thread_id, schema, tenant, attrs_value


def _concrete(store: Any) -> Any:
    while getattr(store, "inner", None) is not None:
        store = store.inner
    return store


def misstamp_one(store: Any, thread_id: str, tenant: str) -> int:
    """Re-stamps the newest checkpoint row of ``thread_id`` for ``tenant`` with SQL, behind the store's back (the
    demo's ``--plant-misstamp``: the audit must then fail). Returns the rows changed (1)."""
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    inner = _concrete(store)
    latest = store.latest(thread_id)
    assert latest is not None
    if isinstance(inner, SqliteCheckpointer):
        conn = sqlite3.connect(inner.path)
        try:
            with conn:
                changed = conn.execute(
                    "UPDATE checkpoints SET access_tenant = ? WHERE thread_id = ? AND id = ?",
                    (tenant, thread_id, latest.checkpoint.id),
                ).rowcount
        finally:
            conn.close()
        return int(changed)
    from psycopg import sql

    with inner.pool.connection() as conn:
        query = sql.SQL("UPDATE {}.checkpoints SET access_tenant = %s WHERE thread_id = %s AND id = %s").format(
            sql.Identifier(inner.config.schema)
        )
        return int(conn.execute(query, (tenant, thread_id, latest.checkpoint.id)).rowcount)


def _attrs(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _all_events(store: Any, thread_id: str, tenant: str | None) -> tuple[list[EventRecord], int]:
    """Every event of ``thread_id`` (tenant-scoped when ``tenant``), with the read calls made."""
    found: list[EventRecord] = []
    after, calls = 0, 0
    while True:
        calls += 1
        if tenant is None:
            page = store.events_after(thread_id, after, PAGE)
        else:
            page = store.tenant_events_after(thread_id, tenant, after, PAGE)
        found += page
        if len(page) < PAGE:
            return found, calls
        after = page[-1].seq


def _all_history(store: Any, thread_id: str, tenant: str | None) -> tuple[list[Any], int]:
    """Every checkpoint of ``thread_id`` (tenant-scoped when ``tenant``), newest first, with the calls made."""
    found: list[Any] = []
    before, calls = None, 0
    while True:
        calls += 1
        if tenant is None:
            page = store.history(thread_id, limit=PAGE, before=before)
        else:
            page = store.tenant_history(thread_id, tenant, limit=PAGE, before=before)
        found += page
        if len(page) < PAGE:
            return found, calls
        before = page[-1].id


def _owner(store: Any, thread_id: str) -> str | None:
    """The tenant of a thread this demo did not write (an earlier run's on the same store, another program's): the
    one its latest checkpoint names, as the store's own tenant reads judge it."""
    latest = store.latest(thread_id)
    return None if latest is None else latest.checkpoint.tenant_id


def audit(
    store: Any, access: AccessSchemas, graph_id: str, owners: dict[str, str], tenants: Iterable[str]
) -> AuditResult:
    """Audits the store (opened with ``access``, the current release's declarations).

    Args:
        store: the store, opened with ``access`` (a SQLite or PostgreSQL store, or a wrapper of one).
        access: the current declarations: ``access.for_graph(graph_id)`` is the schema every row must carry.
        graph_id: the demo's graph kind.
        owners: thread id -> its tenant (as written). A tenant's export may also hold threads not in ``owners``
            (written before, on the same store): each is judged by the tenant its latest checkpoint names.
        tenants: every tenant to read as.

    Returns:
        The counts; :attr:`AuditResult.clean` is the verdict. The tenant reads may stamp rows (the follower): run
        it once the walk is over. Reads only, apart from that; safe to repeat.
    """
    schema = access.for_graph(graph_id)
    expected: dict[str, tuple[str | None, Any]] = {}
    for thread_id in owners:
        latest = store.latest(thread_id)
        if latest is not None:
            stamp = schema.derive(latest.checkpoint)
            expected[thread_id] = (stamp.tenant_id, stamp.attributes)
    rows: dict[str, int] = {}
    unstamped: dict[str, int] = {}
    misstamped: dict[str, int] = {}
    examples: list[str] = []
    for kind, thread_id, hash_, tenant, attrs_value in stamp_rows(store):
        if thread_id not in owners:
            continue  # another thread kind (the walk's own record is never stamped)
        rows[kind] = rows.get(kind, 0) + 1
        unstamped.setdefault(kind, 0)
        misstamped.setdefault(kind, 0)
        if hash_ != schema.hash:
            unstamped[kind] += 1
            if len(examples) < 5:
                examples.append(f"unstamped {kind} row of {thread_id}: schema {hash_}")
        elif (tenant, _attrs(attrs_value)) != expected.get(thread_id):
            misstamped[kind] += 1
            if len(examples) < 5:
                examples.append(f"mis-stamped {kind} row of {thread_id}: {tenant} {_attrs(attrs_value)}")
    cross, hidden, reads = 0, 0, 0
    tenants = sorted(set(tenants))
    for tenant in tenants:
        seen: set[str] = set()
        after: str | None = None
        while True:
            reads += 1
            page = store.export_tenant(tenant, after=after, limit=PAGE)
            for thread in page.threads:
                seen.add(thread.thread_id)
                foreign = [cp for cp in thread.checkpoints if cp.tenant_id != tenant]
                owner = owners[thread.thread_id] if thread.thread_id in owners else _owner(store, thread.thread_id)
                if owner != tenant:
                    cross += 1 + len(thread.checkpoints) + len(thread.events)
                    if len(examples) < 5:
                        examples.append(f"{tenant} read {thread.thread_id} of {owner} (export)")
                elif foreign:
                    cross += len(foreign)
                    if len(examples) < 5:
                        examples.append(f"{tenant} read {len(foreign)} checkpoints of another tenant (export)")
            if page.next is None:
                break
            after = page.next
        hidden += len({t for t, owner in owners.items() if owner == tenant} - seen)
    for thread_id, owner in owners.items():
        all_history, _ = _all_history(store, thread_id, None)
        all_events, _ = _all_events(store, thread_id, None)
        for tenant in tenants:
            history, calls = _all_history(store, thread_id, tenant)
            events, more = _all_events(store, thread_id, tenant)
            reads += calls + more
            if tenant == owner:
                hidden += len({cp.id for cp in all_history} - {cp.id for cp in history})
                hidden += len({e.seq for e in all_events} - {e.seq for e in events})
                cross += len([cp for cp in history if cp.tenant_id != owner])
            elif history or events:
                cross += len(history) + len(events)
                if len(examples) < 5:
                    examples.append(f"{tenant} read {len(history)} checkpoints, {len(events)} events of {thread_id}")
    return AuditResult(
        rows=rows, unstamped=unstamped, misstamped=misstamped, cross_tenant=cross, hidden=hidden, reads=reads,
        examples=examples,
    )  # fmt: skip


__all__ = ["PAGE", "AuditResult", "StampRow", "audit", "misstamp_one", "stamp_rows"]
