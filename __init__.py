"""threadloom: durable, fenced agent threads in memory, SQLite or PostgreSQL.

Everything a user needs is importable from here (``from threadloom import GraphRuntime, open_store``); the
names are listed in ``__all__`` and loaded on first use, so ``import threadloom`` is cheap and has no side
effects (logging is never configured). Modules whose names start with ``_`` and names not listed here are
internal. The README's "Module map" says what each package holds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it. Loaded lazily (PEP 562) so that the command line starts fast.
_EXPORTS: dict[str, str] = {
    # values, errors and clocks (domain)
    **dict.fromkeys(
        (
            "BusyHolder", "Checkpoint", "CheckpointOrigin", "CheckpointPage", "CheckpointStatus", "ClaimRequest",
            "Commit", "EffectRecord", "EventDraft", "EventRecord", "PendingWrite", "RetentionPolicy", "RunClaim",
            "StoredCheckpoint", "SweepGuard", "SweepPage", "SweepPolicy", "TenantCount", "TenantPage", "ThreadCursor",
            "ThreadPage", "ThreadQuery", "ThreadStatus", "ThreadSummary",
        ),
        "threadloom.domain.values",
    ),
    **dict.fromkeys(
        (
            "CancelledError", "CheckpointConflict", "CheckpointNotFound", "EffectMayHaveRun", "InvalidCommit",
            "InvalidRunState", "OutcomeUnknown", "ProcessingError", "ReplayUnavailable", "RunFailed", "StaleClaim",
            "StaleLease", "StoreClosed", "StoreCorrupt", "StoreUnavailable", "TenantMismatch", "ThreadBusy",
            "ThreadDeleted", "ThreadloomError", "ValidationError",
        ),
        "threadloom.domain.errors",
    ),
    **dict.fromkeys(
        (
            "AccessAttribute", "AccessSchema", "AccessSchemas", "AccessStamp", "AccessStampOptions", "Member",
            "TenantExportPage", "TenantThread", "WalkRecord",
        ),
        "threadloom.domain.access",
    ),
    "Clock": "threadloom.domain.clock",
    "ManualClock": "threadloom.domain.clock",
    "EntryStatus": "threadloom.domain.queue",
    "Lease": "threadloom.domain.queue",
    "PurgePage": "threadloom.domain.queue",
    "QueueDepth": "threadloom.domain.queue",
    "QueueEntry": "threadloom.domain.queue",
    # stores (persistence)
    "Checkpointer": "threadloom.persistence.base",
    "StoreBase": "threadloom.persistence.base",
    "ForwardingCheckpointer": "threadloom.persistence.forwarding",
    "SystemClock": "threadloom.persistence.clock",
    "open_store": "threadloom.persistence",
    "AsyncStore": "threadloom.persistence.aio",
    "open_async_store": "threadloom.persistence.aio",
    "RunQueue": "threadloom.persistence.queue",
    "InMemoryCheckpointer": "threadloom.persistence.memory",
    "SqliteCheckpointer": "threadloom.persistence.sqlite",
    "PostgresCheckpointer": "threadloom.persistence.postgres",
    "PostgresCheckpointerConfig": "threadloom.persistence.postgres",
    "Meter": "threadloom.persistence.metrics",
    "InMemoryMeter": "threadloom.persistence.metrics",
    "MeteredCheckpointer": "threadloom.persistence.metrics",
    "PrometheusMeter": "threadloom.persistence.metrics.prometheus",
    "OpenTelemetryMeter": "threadloom.persistence.metrics.otel",
    # the runtime (actors)
    "EffectKeys": "threadloom.actors.graph",
    "Graph": "threadloom.actors.graph",
    "NodeContext": "threadloom.actors.graph",
    "RunOutcome": "threadloom.actors.graph",
    "Step": "threadloom.actors.graph",
    "effect_keys": "threadloom.actors.graph",
    "merge_input": "threadloom.actors.graph",
    "ChildRetention": "threadloom.actors.policies",
    "ClaimPolicy": "threadloom.actors.policies",
    "ServePolicy": "threadloom.actors.policies",
    "SweepSchedule": "threadloom.actors.policies",
    "WatchPolicy": "threadloom.actors.policies",
    "GraphRuntime": "threadloom.actors.runtime",
    "IdFactory": "threadloom.actors.scheduler",
    "RandomIds": "threadloom.actors.scheduler",
    "SequentialIds": "threadloom.actors.scheduler",
    "Subscription": "threadloom.actors.subscription",
    "RunHandle": "threadloom.actors.runs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'threadloom' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # the names as a type checker sees them
    from threadloom.actors.graph import EffectKeys, Graph, NodeContext, RunOutcome, Step, effect_keys, merge_input
    from threadloom.actors.policies import ChildRetention, ClaimPolicy, ServePolicy, SweepSchedule, WatchPolicy
    from threadloom.actors.runs import RunHandle
    from threadloom.actors.runtime import GraphRuntime
    from threadloom.actors.scheduler import IdFactory, RandomIds, SequentialIds
    from threadloom.actors.subscription import Subscription
    from threadloom.domain.access import (
        AccessAttribute,
        AccessSchema,
        AccessSchemas,
        AccessStamp,
        AccessStampOptions,
        Member,
        TenantExportPage,
        TenantThread,
        WalkRecord,
    )
    from threadloom.domain.clock import Clock, ManualClock
    from threadloom.domain.errors import (
        CancelledError,
        CheckpointConflict,
        CheckpointNotFound,
        EffectMayHaveRun,
        InvalidCommit,
        InvalidRunState,
        OutcomeUnknown,
        ProcessingError,
        ReplayUnavailable,
        RunFailed,
        StaleClaim,
        StaleLease,
        StoreClosed,
        StoreCorrupt,
        StoreUnavailable,
        TenantMismatch,
        ThreadBusy,
        ThreadDeleted,
        ThreadloomError,
        ValidationError,
    )
    from threadloom.domain.queue import EntryStatus, Lease, PurgePage, QueueDepth, QueueEntry
    from threadloom.domain.values import (
        BusyHolder,
        Checkpoint,
        CheckpointOrigin,
        CheckpointPage,
        CheckpointStatus,
        ClaimRequest,
        Commit,
        EffectRecord,
        EventDraft,
        EventRecord,
        PendingWrite,
        RetentionPolicy,
        RunClaim,
        StoredCheckpoint,
        SweepGuard,
        SweepPage,
        SweepPolicy,
        TenantCount,
        TenantPage,
        ThreadCursor,
        ThreadPage,
        ThreadQuery,
        ThreadStatus,
        ThreadSummary,
    )
    from threadloom.persistence import open_store
    from threadloom.persistence.aio import AsyncStore, open_async_store
    from threadloom.persistence.base import Checkpointer, StoreBase
    from threadloom.persistence.clock import SystemClock
    from threadloom.persistence.forwarding import ForwardingCheckpointer
    from threadloom.persistence.memory import InMemoryCheckpointer
    from threadloom.persistence.metrics import InMemoryMeter, Meter, MeteredCheckpointer
    from threadloom.persistence.metrics.otel import OpenTelemetryMeter
    from threadloom.persistence.metrics.prometheus import PrometheusMeter
    from threadloom.persistence.postgres import PostgresCheckpointer, PostgresCheckpointerConfig
    from threadloom.persistence.queue import RunQueue
    from threadloom.persistence.sqlite import SqliteCheckpointer
