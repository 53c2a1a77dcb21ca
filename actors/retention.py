"""Child retention: what the runtime deletes of a thread's children when a run of the thread ends.

A graph with a :class:`~threadloom.actors.policies.ChildRetention` keeps the newest ``keep`` children of each of
its threads; older children whose latest checkpoint is settled are deleted, each with its own descendants, by
the run that just ended, while it still holds the parent's claim. Every write is fenced by that claim
(``delete_thread(child, child_token, fence=(parent, parent_token))``), so a run that lost the parent deletes
nothing more and the run that took the parent over never finds a child it may take up gone.
"""

from __future__ import annotations

from typing import Any

from threadloom.actors.cascade import CascadeDelete, all_children
from threadloom.actors.policies import ChildRetention
from threadloom.actors.runs import RunEnv
from threadloom.domain.errors import StaleClaim, TenantMismatch, ThreadBusy
from threadloom.domain.values import StoredCheckpoint

PAGE = 100
"""How many children one ``children`` call reads while retention lists a parent's children."""


def _settled_child_of(parent: str) -> Any:
    """The check made under a child's claim: its latest checkpoint is settled and still names ``parent``."""

    def check(latest: StoredCheckpoint | None) -> bool:
        if latest is None:
            return False
        origin = latest.checkpoint.origin
        return latest.checkpoint.status.settled and origin is not None and origin.parent_thread == parent

    return check


def retain_children(
    env: RunEnv,
    policy: ChildRetention,
    *,
    parent: str,
    token: int,
    run_id: str,
    tenant_id: str | None,
    log: Any,
) -> list[str]:
    """Deletes the children of ``parent`` that ``policy`` does not keep; runs on the caller's thread.

    Lists every child of ``parent`` (oldest first, ``PAGE`` at a time), then takes up each child older than the
    newest ``policy.keep``: claims it for ``run_id`` and, if its latest checkpoint is settled and still names
    ``parent``, deletes it and its descendants, every write fenced by ``(parent, token)``. A child held by a
    live run, incomplete, suspended or another tenant's is kept. The parent's claim is renewed while this runs.

    Args:
        env: the runtime's environment.
        policy: the graph's child retention.
        parent: the thread whose run ended; ``token``: that run's claim on it (still held).
        run_id: the run that ended (the holder of the children's claims while they are deleted).
        tenant_id: the run's tenant.
        log: the run's bound logger.

    Returns:
        The deleted thread ids, in the order deleted (each child's descendants before the child).

    Raises:
        StaleClaim: the run no longer holds ``parent`` (nothing more was deleted after the store said so).
        ProcessingError: the store failed; what was deleted stays deleted, a child whose delete began is left
            marked and the next retention (or a ``delete_thread`` of it) finishes it.
    """
    store = env.store
    children = all_children(store, parent, page_size=PAGE)
    doomed = children[: max(0, len(children) - policy.keep)]
    deleted: list[str] = []
    renewed_at = env.clock.now()
    check = _settled_child_of(parent)
    for child in doomed:
        if env.clock.now() - renewed_at >= env.claim_policy.renew_every:
            store.renew(parent, token, env.claim_policy.ttl)
            renewed_at = env.clock.now()
        cascade = CascadeDelete(env, child, tenant_id, fence=(parent, token), run_id=run_id, only_if=check)
        try:
            gone = cascade.run()
        except ThreadBusy as error:
            log.info("retention.kept", op="delete_thread", child=child, reason="busy", holder=str(error.holder))
            continue
        except TenantMismatch:
            log.info("retention.kept", op="delete_thread", child=child, reason="tenant")
            continue
        except StaleClaim as error:
            if error.thread_id == parent:
                raise
            log.info("retention.kept", op="delete_thread", child=child, reason="taken_over")
            continue
        if gone:
            deleted.extend(gone)
            log.info("retention.deleted", op="delete_thread", child=child, threads=len(gone), token=token)
        else:
            log.debug("retention.kept", op="delete_thread", child=child, reason="not_settled")
    return deleted
