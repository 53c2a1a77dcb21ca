"""The cascade delete of ``GraphRuntime.delete_thread``.

The root's tenant is checked first (its latest checkpoint's, or its claim's before its first checkpoint: another
tenant's delete writes nothing), then the root is claimed (so a
live run in any runtime refuses the delete, naming its holder to the same tenant), its tenant checked again under
the claim, and marked with a fenced metadata commit ``{"threadloom.deleting": "true"}``
(the registry then reports it ``DELETED`` and ``incomplete`` leaves it out). Then every descendant is claimed and
deleted, children before their parent, each delete fenced by the root's claim, so a run that took the root over
meanwhile never finds a child gone. The root goes last. A cascade that stops half-way leaves the root marked and
its claim released: any runtime finishes it by deleting the root again.

Child retention runs the same cascade on each child it deletes, with an outer ``fence``: the claim of the parent
whose run ended. Every write of that cascade (the mark, each descendant's delete and the child's own) is then
fenced by the parent's claim instead of the child's, and the parent's claim is renewed with the cascade's own.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from threadloom.actors._failures import error_kind, is_fatal, store_closed
from threadloom.actors.logs import elapsed_ms
from threadloom.actors.logs import log as _log
from threadloom.actors.runs import RunEnv
from threadloom.domain.errors import ProcessingError, TenantMismatch, ThreadBusy, ThreadloomError
from threadloom.domain.rules import DELETING_KEY
from threadloom.domain.values import ClaimRequest, Commit, StoredCheckpoint
from threadloom.persistence.base import Checkpointer


@attrs.define(eq=False)
class _Held:
    thread_id: str
    token: int
    after: str | None = None  # the cursor past children this cascade must skip (an origin cycle)


class CascadeDelete:
    """One cascade delete, run on the caller's thread (plain methods).

    Args:
        env: the runtime's environment.
        thread_id: the root to delete.
        tenant_id: the caller's tenant; the root must be this tenant's.
        fence: ``(thread_id, token)`` of an outer claim (child retention: the parent's) that fences every
            write of the cascade, the root's delete included, and is renewed with the cascade's claims. None:
            the descendants' deletes are fenced by the root's claim, the root's by its own.
        run_id: the holder of the cascade's claims (default: a new RunId).
        only_if: checked under the root's claim with its latest checkpoint; False releases the root and
            deletes nothing (``run`` returns ``[]``).
    """

    def __init__(
        self,
        env: RunEnv,
        thread_id: str,
        tenant_id: str | None,
        *,
        fence: tuple[str, int] | None = None,
        run_id: str | None = None,
        only_if: Callable[[StoredCheckpoint | None], bool] | None = None,
    ) -> None:
        self.env = env
        self.root = thread_id
        self.tenant_id = tenant_id
        self.outer = fence
        self.only_if = only_if
        self.run_id = run_id if run_id is not None else env.ids.run_id(env.node_id)
        self.deleted: list[str] = []
        self._held: list[_Held] = []
        self._renewed_at = env.clock.now()
        self._log = _log.bind(
            thread_id=thread_id, root=thread_id, run_id=self.run_id, tenant_id=tenant_id, node_id=env.node_id
        )

    def _claim(self, thread_id: str) -> _Held:
        started = self.env.clock.now()
        try:
            claim = self.env.store.claim(
                thread_id,
                ClaimRequest(holder=self.run_id, ttl=self.env.claim_policy.ttl, tenant_id=self.tenant_id),
            )
        except ThreadBusy as error:
            self._log.info("claim.busy", op="claim", thread_id=thread_id, holder=str(error.holder))
            raise
        event = "claim.taken_over" if claim.taken_over_from is not None else "claim.granted"
        self._log.info(
            event,
            op="claim",
            thread_id=thread_id,
            token=claim.token,
            taken_over_from=claim.taken_over_from,
            duration_ms=elapsed_ms(self.env.clock, started),
        )
        held = _Held(thread_id, claim.token)
        self._held.append(held)
        return held

    def _keep_alive(self) -> None:
        """Renews every claim the cascade holds once ``renew_every`` passed since the last renewal."""
        now = self.env.clock.now()
        if now - self._renewed_at < self.env.claim_policy.renew_every:
            return
        for held in self._held:
            self.env.store.renew(held.thread_id, held.token, self.env.claim_policy.ttl)
        if self.outer is not None:
            self.env.store.renew(self.outer[0], self.outer[1], self.env.claim_policy.ttl)
        self._renewed_at = now

    def _delete(self, held: _Held, fence: tuple[str, int] | None) -> None:
        started = self.env.clock.now()
        self.env.store.delete_thread(held.thread_id, held.token, fence=fence)
        self._held.remove(held)
        self.deleted.append(held.thread_id)
        self._log.info(
            "commit.applied",
            op="delete_thread",
            thread_id=held.thread_id,
            token=held.token,
            fence=list(fence) if fence else None,
            duration_ms=elapsed_ms(self.env.clock, started),
        )

    def run(self) -> list[str]:
        """Deletes the root and every descendant.

        Returns:
            The deleted thread ids, descendants first (children before their parents), the root last.

        Raises:
            ThreadBusy: the root or a descendant is held by a live claim (the holder named to the same tenant);
                what was deleted stays deleted, the root stays marked.
            TenantMismatch: the root is another tenant's; nothing was written (no claim either).
            StaleClaim: the root's claim (or the outer ``fence``'s) was taken over during the cascade; the rest is
                left to its new holder.
            ProcessingError: the store failed. Deleting again finishes the cascade (once the store is repaired,
                for ``StoreCorrupt``; with an open store, for ``StoreClosed``).
        """
        store = self.env.store
        # Another tenant's delete is refused before the claim, so it writes nothing (not even a claim that spends
        # a fencing token or takes over a lapsed one) and is not told that a run holds the thread: by the latest
        # checkpoint's tenant, or, before the first checkpoint, by the tenant of the claim of the run starting
        # it. The check is repeated under the claim: the root may have been created meanwhile.
        try:
            self._check_tenant(store.latest(self.root), store)
        except TenantMismatch as error:
            self._log.info(
                "delete.stopped",
                op="delete_thread",
                deleted=0,
                error=f"{type(error).__name__}: {error}",
                error_kind=error_kind(error),
            )
            raise
        root = self._claim(self.root)
        try:
            latest = store.latest(self.root)
            self._check_tenant(latest)
            if self.only_if is not None and not self.only_if(latest):
                self._release_all()
                return []
            store.commit(self.root, Commit(token=root.token, metadata={DELETING_KEY: "true"}, fence=self.outer))
            self._log.info("commit.applied", op="commit", token=root.token, metadata=DELETING_KEY)
            fence = self.outer if self.outer is not None else (self.root, root.token)
            stack: list[_Held] = [root]
            while stack:
                self._keep_alive()
                top = stack[-1]
                page = store.children(top.thread_id, limit=1, after=top.after)
                child = page[0] if page else None
                if child is not None and all(held.thread_id != child for held in stack):
                    stack.append(self._claim(child))
                    continue
                if child is not None:  # an origin cycle: an ancestor, deleted when its own turn comes
                    top.after = child
                    continue
                stack.pop()
                if top is not root:
                    self._delete(top, fence)
            self._delete(root, self.outer)
        except ThreadloomError as error:
            # A refusal before anything was deleted (another tenant's thread, a live run) is the caller's answer,
            # told by the exception alone: info. A cascade stopped half-way, or a store failure, is worth more.
            if is_fatal(error, store):
                log = self._log.error
            elif self.deleted or isinstance(error, ProcessingError):
                log = self._log.warning
            else:
                log = self._log.info
            log(
                "delete.stopped",
                op="delete_thread",
                deleted=len(self.deleted),
                error=f"{type(error).__name__}: {error}",
                error_kind=error_kind(error),
            )
            self._release_all()
            raise
        except BaseException:
            self._release_all()
            raise
        return list(self.deleted)

    def _check_tenant(self, latest: StoredCheckpoint | None, store: Checkpointer | None = None) -> None:
        """Raises TenantMismatch when the root's latest checkpoint is another tenant's; with ``store`` (before the
        claim), also when it has none yet but a claim of another tenant's run (a run starting, live or lapsed)."""
        if latest is not None:
            if latest.checkpoint.tenant_id != self.tenant_id:
                raise TenantMismatch(self.root, self.tenant_id)
            return
        if store is not None:
            claim = store.current_claim(self.root)
            if claim is not None and claim.tenant_id != self.tenant_id:
                raise TenantMismatch(self.root, self.tenant_id)

    def _release_all(self) -> None:
        if store_closed(self.env.store):
            self._held.clear()  # nothing can be written any more: the claims expire by themselves
            return
        for held in reversed(self._held):
            try:
                self.env.store.release(held.thread_id, held.token)
            except ThreadloomError:
                pass
        self._held.clear()


def all_children(store: Checkpointer, parent: str, *, page_size: int = 100) -> list[str]:
    """Every child thread id of ``parent``, in the order their first commits landed, read ``page_size`` at a time
    with ``store.children`` (each page one consistent read; a child added meanwhile may or may not be listed).

    Raises:
        ProcessingError: as ``Checkpointer.children``; safe to retry (it only reads).
    """
    children: list[str] = []
    after: str | None = None
    while True:
        page = store.children(parent, limit=page_size, after=after)
        children.extend(page)
        if len(page) < page_size:
            return children
        after = page[-1]
