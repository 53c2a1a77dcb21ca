"""What ``threadloom demo --walk`` runs: its parameters (:class:`WalkPlan`), the two releases' access schemas, and
the threads the "v1" release leaves in the store.

Release v1 declares the tenant-only schema of the graph kind :data:`WALK_DEMO_GRAPH`; release v2 declares a new
attribute, ``region``, from the checkpoint metadata key ``region``. Every row v1 wrote carries v1's stamp; the walk
of v2 must re-stamp them all with ``region``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from threadloom.domain.access import AccessAttribute, AccessSchema, AccessSchemas
from threadloom.domain.values import (
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
)

WALK_DEMO_GRAPH = "support-agent"
"""The graph kind the demo's threads belong to (and the walk re-stamps)."""
TENANTS = ("acme", "globex", "initech", "umbrella")
"""The tenants the demo's threads are spread over, in turn."""
REGIONS = ("eu", "us", "apac")
"""The regions (checkpoint metadata ``region``) the threads are in."""
RELEASES = ("v1", "v2")
"""The releases: v1 declares the tenant only; v2 adds ``region`` (checkpoint metadata key ``region``)."""
REGION = AccessAttribute("region", "metadata", "region")
"""The attribute release v2 adds."""


def release_access(release: str, graph_id: str = WALK_DEMO_GRAPH) -> AccessSchemas:
    """The declarations of ``release`` (``v1`` or ``v2``) for the graph kind ``graph_id``."""
    if release == "v1":
        return AccessSchemas([AccessSchema(graph_id)])
    if release == "v2":
        return AccessSchemas([AccessSchema(graph_id, (REGION,))])
    raise ValueError(f"unknown release {release!r}")

FILL_STEPS = 3
"""Checkpoints each thread gets from v1 (with pending writes, events and an effect record)."""


@attrs.frozen(kw_only=True)
class WalkPlan:
    """The parameters of ``threadloom demo --walk``.

    Attributes:
        threads: threads v1 leaves in the store (spread over :data:`TENANTS`).
        walk_share, walk_rate: v2's walk pace (``AccessStampOptions``): share of its time, threads a second at most.
        interval: a walk page holds what the pace stamps in this long (so the cursor is recorded this often).
        overlap: how long v1 and v2 run side by side before v1 is stopped.
        commits_per_s: live commits each worker makes a second (to random threads, while it runs).
        ttl, renew_every: the workers' claim, walk lease and membership ttl, and their renewal period.
        crash: SIGKILL the v2 process holding the walk lease once a third of the threads was walked.
        prefix: the threads are ``<prefix>-0001``…
        graph_id: the graph kind of the threads (one of its own per run on a store the user named).
        timeout: the demo gives up after this long.
    """

    threads: int = 240
    walk_share: float = 0.1
    walk_rate: float = 40.0
    interval: timedelta = timedelta(seconds=1)
    overlap: timedelta = timedelta(seconds=3)
    commits_per_s: float = 10.0
    ttl: timedelta = timedelta(seconds=2)
    renew_every: timedelta = timedelta(milliseconds=500)
    crash: bool = True
    prefix: str = "chat"
    graph_id: str = WALK_DEMO_GRAPH
    timeout: timedelta = timedelta(minutes=3)

    def thread_id(self, index: int) -> str:
        """Thread ``index`` (0-based)."""
        return f"{self.prefix}-{index + 1:0{max(4, len(str(self.threads)))}d}"

    @property
    def thread_ids(self) -> list[str]:
        """Every thread, ascending (the walk's order)."""
        return [self.thread_id(index) for index in range(self.threads)]

    @staticmethod
    def tenant_of(index: int) -> str:
        """The tenant of thread ``index``."""
        return TENANTS[index % len(TENANTS)]

    @staticmethod
    def region_of(index: int) -> str:
        """The region of thread ``index`` (it never changes: live commits keep it)."""
        return REGIONS[(index // len(TENANTS)) % len(REGIONS)]


def fill_v1(store: Any, plan: WalkPlan, holder: str = "v1-fill") -> dict[str, str]:
    """Writes the demo's threads as release v1 (``store`` opened with ``release_access("v1", plan.graph_id)``):
    :data:`FILL_STEPS`
    fenced commits each, with a pending write, an event and an effect record per commit.

    Returns:
        thread id -> its tenant.
    """
    owners: dict[str, str] = {}
    now = datetime.now(UTC)
    for index, thread_id in enumerate(plan.thread_ids):
        tenant = plan.tenant_of(index)
        claim = store.claim(thread_id, ClaimRequest(holder=holder, ttl=timedelta(minutes=5), tenant_id=tenant))
        parent = None
        for step in range(FILL_STEPS):
            cp_id = f"{thread_id}-v1-{step}"
            checkpoint = Checkpoint(
                id=cp_id,
                parent=parent,
                thread_id=thread_id,
                run_id=holder,
                status=CheckpointStatus.RUNNING,
                created_at=now,
                state={"turns": step, "customer": f"{tenant}-customer-{index}"},
                graph_id=plan.graph_id,
                tenant_id=tenant,
                metadata={"region": plan.region_of(index), "release": "v1"},
            )
            store.commit(
                thread_id,
                Commit(
                    token=claim.token,
                    checkpoint=checkpoint,
                    pending_writes=(PendingWrite(checkpoint_id=cp_id, task_id=f"t{step}", node_id="agent",
                                                 payload={"reply": step}),),
                    events=(EventDraft(run_id=holder, type="turn", timestamp=now, payload={"step": step},
                                       checkpoint_id=cp_id),),
                    effects=(EffectRecord(key=f"{thread_id}:lookup:{step}", run_id=holder, recorded_at=now,
                                          result={"ok": True}, checkpoint_id=cp_id),),
                ),
            )  # fmt: skip
            parent = cp_id
        store.release(thread_id, claim.token)
        owners[thread_id] = tenant
    return owners


__all__ = [
    "FILL_STEPS",
    "REGIONS",
    "RELEASES",
    "TENANTS",
    "REGION",
    "WALK_DEMO_GRAPH",
    "WalkPlan",
    "fill_v1",
    "release_access",
]
