"""Values, errors and pure rules of threadloom. No I/O, threads, wall clock or randomness."""

from threadloom.domain.clock import Clock, ManualClock
from threadloom.domain.errors import (
    CancelledError,
    CheckpointConflict,
    CheckpointNotFound,
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
from threadloom.domain.queue import EntryStatus, Lease, QueueEntry
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
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)

__all__ = [
    "BusyHolder", "CancelledError", "Checkpoint", "CheckpointConflict", "CheckpointNotFound", "CheckpointOrigin",
    "CheckpointPage", "CheckpointStatus", "ClaimRequest", "Clock", "Commit", "EffectRecord", "EventDraft",
    "EventRecord",
    "InvalidCommit", "ManualClock", "OutcomeUnknown", "PendingWrite", "ProcessingError", "StoreClosed", "StoreCorrupt",
    "StoreUnavailable", "ReplayUnavailable",
    "RetentionPolicy", "RunClaim", "StaleClaim", "StoredCheckpoint", "SweepGuard", "SweepPage", "SweepPolicy",
    "ThreadBusy", "ThreadCursor", "ThreadDeleted", "ThreadPage", "ThreadQuery", "ThreadStatus", "ThreadSummary",
    "ThreadloomError", "ValidationError",
    # run queue and runtime
    "EntryStatus", "InvalidRunState", "Lease", "QueueEntry", "RunFailed", "StaleLease", "TenantMismatch",
]
