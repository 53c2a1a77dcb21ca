"""The runtime's tenant-checked reads of threads (:class:`ThreadReadsMixin`): a thread's latest checkpoint, its
history, events, children, a tenant's export and its root threads, each read through the runtime's store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from threadloom.domain import validation as v
from threadloom.domain.access import TenantExportPage
from threadloom.domain.errors import TenantMismatch
from threadloom.domain.values import (
    Checkpoint,
    EventRecord,
    StoredCheckpoint,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
)
from threadloom.persistence.base import Checkpointer


class ThreadReadsMixin:
    """:class:`~threadloom.actors.runtime.GraphRuntime`'s reads of threads; each checks its arguments, refuses a
    closed runtime, and never shows another tenant's rows."""

    store: Checkpointer

    if TYPE_CHECKING:

        def _ensure_open(self, operation: str) -> None: ...

    def _check_tenant(self, thread_id: str, tenant_id: str | None) -> StoredCheckpoint | None:
        latest = self.store.latest(thread_id)
        if latest is not None and latest.checkpoint.tenant_id != tenant_id:
            raise TenantMismatch(thread_id, tenant_id)
        return latest

    # -- reads ----------------------------------------------------------------------------------------------

    def latest(self, thread_id: str, tenant_id: str | None = None) -> StoredCheckpoint | None:
        """The thread's latest checkpoint and pending writes, for ``tenant_id``; None for a new thread.

        Raises:
            TenantMismatch: the thread is another tenant's.
        """
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("latest")
        return self._check_tenant(thread_id, tenant_id)

    def history(
        self, thread_id: str, tenant_id: str | None = None, *, limit: int = 50, before: str | None = None
    ) -> list[Checkpoint]:
        """Up to ``limit`` (1..1000) of the thread's checkpoints stamped for ``tenant_id``, newest first, before
        checkpoint ``before`` (README "Access schemas": tenant-scoped reads fail closed).

        Read through the store's ``tenant_history``: a checkpoint stamped for another tenant is never returned,
        and one without the current schema's stamp is first stamped from its thread's latest checkpoint (one
        write transaction), never shown unchecked. Another tenant's thread reads as an empty list.

        Raises:
            CheckpointNotFound: ``before`` is not a checkpoint of the thread.
            ValidationError, ProcessingError: a bad argument; the store failed or the runtime is closed.
            Retrying is safe.
        """
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("history")
        return self.store.tenant_history(thread_id, tenant_id, limit=limit, before=before)

    def events(
        self, thread_id: str, tenant_id: str | None = None, *, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        """Up to ``limit`` (1..1000) of the thread's events with ``seq > after_seq`` stamped for ``tenant_id``,
        oldest first, read through the store's ``tenant_events_after`` (fails closed like :meth:`history`).

        Raises:
            ReplayUnavailable: ``after_seq`` is below the thread's replay floor; ThreadDeleted: the thread is gone.
            ValidationError, ProcessingError: a bad argument; the store failed or the runtime is closed.
            Retrying is safe.
        """
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("events")
        return self.store.tenant_events_after(thread_id, tenant_id, after_seq, limit)

    def export_tenant(self, tenant_id: str | None, *, after: str | None = None, limit: int = 10) -> TenantExportPage:
        """One page (``limit`` 1..100 threads) of ``tenant_id``'s threads, ascending by thread id after ``after``,
        each with its checkpoints, pending writes, events and effect records - only rows stamped for that tenant
        (the store's ``export_tenant``; README "Access schemas"). Page on with the page's ``next``.

        Raises:
            ValidationError, ProcessingError: a bad argument; the store failed or the runtime is closed.
            Retrying is safe.
        """
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("export_tenant")
        return self.store.export_tenant(tenant_id, after=after, limit=limit)

    def children(
        self, thread_id: str, tenant_id: str | None = None, *, limit: int = 50, after: str | None = None
    ) -> list[str]:
        """Up to ``limit`` (1..1000) direct children of the thread, oldest first, after child ``after``.

        The runtime checks the parent's tenant.

        Raises:
            TenantMismatch: the parent is another tenant's.
            ValidationError: a bad argument, or ``after`` is not known as a child of the thread.
        """
        v.check_id("thread_id", thread_id)
        v.check_optional_id("tenant_id", tenant_id)
        self._ensure_open("children")
        self._check_tenant(thread_id, tenant_id)
        return self.store.children(thread_id, limit=limit, after=after)

    def threads(self, query: ThreadQuery) -> ThreadPage:
        """A page of ``query.tenant_id``'s root threads, newest first: only that tenant's."""
        v.check_instance("query", query, ThreadQuery)
        self._ensure_open("threads")
        return self.store.threads(query)

    def incomplete(
        self, tenant_id: str | None = None, *, limit: int = 50, after: ThreadCursor | None = None
    ) -> ThreadPage:
        """The tenant's incomplete root threads (IDLE), oldest first; only that tenant's.

        A thread whose cascade delete began is not listed. For operators: a queue entry, not this list, says
        which run should run again.
        """
        self._ensure_open("incomplete")
        return self.store.incomplete(tenant_id, limit=limit, after=after)


__all__ = ["ThreadReadsMixin"]
