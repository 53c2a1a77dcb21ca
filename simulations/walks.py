"""Access walks in the simulation: the schemas of the two releases, the walk options, the tenant-scoped reads.

In a *walk seed* (about one seed in :data:`WALK_SEEDS_ONE_IN`, drawn from a generator of its own so the other seeds
run as before) every node's store declares an access schema for the job graph: the nodes booted first run release
``v1`` (tenant and ``n``), and at a time the seed picks a rolling release starts ``v2`` nodes (which add ``step``,
an attribute every commit changes) and stops the ``v1`` nodes one by one. The walkers are the runtime's own
(:class:`~threadloom.actors.walker.Walker` actors on the simulated scheduler and clock); the workload's threads
belong to tenants, and clients read them through the stamp-checked reads. The seed ends only once the walk of the
last release completed (:func:`walk_completed`).
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from threadloom.actors.graph import STEP_KEY
from threadloom.actors.walker import DEFAULT_GROUP
from threadloom.domain.access import (
    AccessAttribute,
    AccessSchema,
    AccessSchemas,
    AccessStampOptions,
    WalkRecord,
    walk_thread_id,
)
from threadloom.domain.errors import ThreadloomError

WALK_SEEDS_ONE_IN = 5
"""About one seed in this many runs walks (the others skip the walks' extra store calls: CI time)."""

WALK_OPTIONS = AccessStampOptions(
    interval=timedelta(seconds=1), walk_batch=2, walk_share=0.5, walk_rate=20.0
)
"""Short pages and a brisk pace, so that a walk spans pauses, crashes and commits within a seed."""

def releases(job_graph: str) -> tuple[AccessSchemas, AccessSchemas]:
    """The declarations of release ``v1`` (tenant, ``n`` from the state) and ``v2`` (adds ``step`` from the
    checkpoint metadata) for the graph kind ``job_graph``."""
    n = AccessAttribute(name="n", source="state", key="/n")
    step = AccessAttribute(name="step", source="metadata", key=STEP_KEY)
    return (
        AccessSchemas([AccessSchema(job_graph, (n,))]),
        AccessSchemas([AccessSchema(job_graph, (n, step))]),
    )


def is_walk_seed(seed: int) -> bool:
    """True when ``seed`` runs walks (when its configuration allows them)."""
    return random.Random(f"walks:{seed}").randrange(WALK_SEEDS_ONE_IN) == 0


def tenant_of(thread_id: str) -> str | None:
    """The tenant a workload thread (``t<i>``) belongs to in a walk seed: ``acme``, ``globex`` or none."""
    index = int(thread_id[1:].split(".")[0]) if thread_id[1:].split(".")[0].isdigit() else 0
    return ("acme", "globex", None)[index % 3]


def walk_thread(graph_id: str) -> str:
    """The walk thread of ``graph_id`` in the runtimes' default walk group."""
    return walk_thread_id(DEFAULT_GROUP, graph_id)


def walk_completed(inner: Any, graph_id: str, schema: str) -> bool:
    """Whether the walk of ``graph_id`` by ``schema`` is recorded completed — or there is nothing to walk (no
    thread of the kind is stored: no walk is claimed then)."""
    latest = inner.latest(walk_thread(graph_id))
    if latest is not None:
        try:
            record = WalkRecord.from_state(walk_thread(graph_id), latest.checkpoint.state)
        except ThreadloomError:
            return False
        if record.schema == schema and record.completed:
            return True
    return not inner.graph_threads(graph_id, after=None, limit=1)


def tenant_read(store: Any, rng: random.Random, thread_id: str, tenant: str | None) -> str:
    """One stamp-checked read of ``thread_id`` (or of ``tenant``'s export) through a node's store; returns a probe
    name (the oracle checks what it returned)."""
    kind = rng.choice(("history", "events", "export"))
    try:
        if kind == "history":
            store.tenant_history(thread_id, tenant, limit=20)
        elif kind == "events":
            store.tenant_events_after(thread_id, tenant, 0, 100)
        else:
            store.export_tenant(tenant, limit=10)
    except ThreadloomError as error:
        return f"tenant_read_refused.{type(error).__name__}"
    return f"tenant_read_done.{kind}"


__all__ = [
    "WALK_OPTIONS",
    "WALK_SEEDS_ONE_IN",
    "is_walk_seed",
    "releases",
    "tenant_of",
    "tenant_read",
    "walk_completed",
    "walk_thread",
]
