"""The errors of threadloom.

One root, :class:`ThreadloomError`. Every error carries its fields as attributes (attrs ``auto_exc``): compare
errors by their fields, not with ``==``. Each message names the thread and says what to do.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs


class ThreadloomError(Exception):
    """The root of every error threadloom raises."""

    retryable: ClassVar[bool] = False
    """Whether the same call may simply be made again as it was: False for every error but
    :class:`StoreUnavailable` and :class:`OutcomeUnknown`. A contract refusal (``ThreadBusy``, ``StaleClaim``, ...)
    is never retryable as it is: its message says what to do instead."""


@attrs.define(auto_exc=True, str=False)
class ThreadBusy(ThreadloomError):
    """A live claim refused a claim.

    Attributes:
        thread_id: the thread asked for.
        latest_checkpoint: the id of its latest checkpoint, or None for a thread without one.
        holder: a :class:`~threadloom.domain.values.BusyHolder`: the holder's RunId only for the same tenant.
    """

    thread_id: str
    latest_checkpoint: str | None
    holder: Any

    def __str__(self) -> str:
        return (
            f"thread {self.thread_id!r} is held by a live claim ({self.holder}); "
            "wait for it to end or expire, then claim again"
        )


@attrs.define(auto_exc=True, str=False)
class StaleClaim(ThreadloomError):
    """A token that is not the thread's current claim.

    Attributes:
        thread_id: the thread whose claim was checked (for a fence, the fencing thread).
        token: the token presented.
        current: the thread's current claim token, or None when nothing holds it.
    """

    thread_id: str
    token: int
    current: int | None

    def __str__(self) -> str:
        return (
            f"token {self.token} is not the current claim of thread {self.thread_id!r} "
            f"(current: {self.current}); this run lost the thread and must stop writing to it"
        )


@attrs.define(auto_exc=True, str=False)
class CheckpointConflict(ThreadloomError):
    """A new checkpoint's parent is not the thread's latest."""

    thread_id: str
    expected: str | None
    actual: str | None

    def __str__(self) -> str:
        return (
            f"checkpoint parent {self.expected!r} is not the latest checkpoint {self.actual!r} of thread "
            f"{self.thread_id!r}; re-read the thread and commit on its latest"
        )


@attrs.define(auto_exc=True, str=False)
class InvalidCommit(ThreadloomError):
    """A commit the store cannot apply: duplicate checkpoint id, misdirected pending write, bare retract_turn."""

    thread_id: str
    reason: str

    def __str__(self) -> str:
        return f"invalid commit to thread {self.thread_id!r}: {self.reason}"


@attrs.define(auto_exc=True, str=False)
class ReplayUnavailable(ThreadloomError):
    """Reading from behind the replay floor."""

    thread_id: str
    earliest_seq: int

    def __str__(self) -> str:
        return (
            f"events of thread {self.thread_id!r} before {self.earliest_seq} were compacted or pruned; "
            f"read from after_seq >= {self.earliest_seq - 1}"
        )


@attrs.define(auto_exc=True, str=False)
class ThreadDeleted(ThreadloomError):
    """Reading inside the log of a deleted incarnation of the thread id."""

    thread_id: str
    first_seq: int

    def __str__(self) -> str:
        return (
            f"thread {self.thread_id!r} was deleted; its current log starts at {self.first_seq} "
            f"(read from after_seq 0 or {self.first_seq - 1})"
        )


@attrs.define(auto_exc=True, str=False)
class CheckpointNotFound(ThreadloomError):
    """``history(before=…)`` names a checkpoint the history does not hold."""

    thread_id: str
    checkpoint_id: str

    def __str__(self) -> str:
        return (
            f"checkpoint {self.checkpoint_id!r} is not in the history of thread {self.thread_id!r}; "
            "page again from the start"
        )


@attrs.define(auto_exc=True, str=False)
class ValidationError(ThreadloomError, ValueError):
    """Bad input, raised before anything is read or written.

    Attributes:
        field: the argument or value field that is wrong, e.g. ``"thread_id"`` or ``"commit.checkpoint.state"``.
        problems: what is wrong with it, one sentence each.
    """

    field: str
    problems: tuple[str, ...]

    def __str__(self) -> str:
        return f"invalid {self.field}: " + "; ".join(self.problems)


@attrs.define(auto_exc=True, str=False)
class ProcessingError(ThreadloomError):
    """The storage failed, timed out, or the store is closed.

    Attributes:
        operation: the store method, e.g. ``"commit"``.
        message: what happened, naming the thread where there is one.
    """

    operation: str
    message: str

    retryable: ClassVar[bool] = False
    """Whether the same call may simply be made again. True for :class:`StoreUnavailable`; an
    :class:`OutcomeUnknown` write may be retried too, since fencing refuses or applies it once."""

    def __str__(self) -> str:
        return f"{self.operation} failed: {self.message}"


@attrs.define(auto_exc=True, str=False)
class StoreClosed(ProcessingError):
    """A call on a store after ``close()``: open a new store. Not retryable on this store."""

    retryable: ClassVar[bool] = False


@attrs.define(auto_exc=True, str=False)
class StoreUnavailable(ProcessingError):
    """The storage could not be reached or answered too late, and the call did not apply.

    Connection lost or refused, a call timeout before anything was sent, a database busy past ``busy_timeout``,
    a full disk that rolled the write back. **Retryable**: nothing was written, so the same call may be made
    again (after a pause).
    """

    retryable: ClassVar[bool] = True


@attrs.define(auto_exc=True, str=False)
class StoreCorrupt(ProcessingError):
    """The storage holds what this code cannot read: a damaged file, a row that does not decode, a schema
    newer than the code. **Not retryable**: a person must look (restore a backup, upgrade the code)."""

    retryable: ClassVar[bool] = False


@attrs.define(auto_exc=True, str=False)
class OutcomeUnknown(ProcessingError):
    """The call failed while its commit was in flight: it may or may not have applied.

    A retry is safe: fencing refuses a write from a run whose claim was replaced, and a checkpoint already
    applied makes the retry a :class:`CheckpointConflict` or :class:`InvalidCommit` (read the thread to learn).
    """

    retryable: ClassVar[bool] = True

    def __str__(self) -> str:
        return (
            f"{self.operation}: outcome unknown ({self.message}); it may have applied - "
            "read the thread before retrying"
        )


@attrs.define(auto_exc=True, str=False)
class CancelledError(ThreadloomError):
    """A call ended by its cancel event."""

    operation: str

    def __str__(self) -> str:
        return f"{self.operation} was cancelled"


@attrs.define(auto_exc=True, str=False)
class TenantMismatch(ThreadloomError):
    """The thread is not one of the caller's tenant (the runtime checks tenants).

    Raised by the runtime before anything of the thread is returned or changed. A ``start``, ``resume`` or
    ``recover`` checks under the claim it takes and releases it again, so a refused one still spends a fencing
    token (the thread's data is untouched); a ``delete_thread`` checks before it claims and writes nothing. The
    message never names the thread's own tenant or shows its data. Not retryable as it is.

    Attributes:
        thread_id: the thread asked for.
        tenant_id: the tenant the caller named (None for the tenant-less).
    """

    thread_id: str
    tenant_id: str | None

    def __str__(self) -> str:
        return (
            f"thread {self.thread_id!r} is not a thread of tenant {self.tenant_id!r}; none of its data was read or "
            "changed (call with the thread's own tenant)"
        )


@attrs.define(auto_exc=True, str=False)
class InvalidRunState(ThreadloomError):
    """The thread's latest checkpoint does not allow the run asked for (start, recover, resume).

    Raised under the run's claim, which is released again; nothing was written.

    Attributes:
        thread_id: the thread asked for.
        operation: ``"start"``, ``"recover"``, ``"resume"`` or ``"admit"``.
        reason: what the thread holds and what to do instead, one sentence.
    """

    thread_id: str
    operation: str
    reason: str

    def __str__(self) -> str:
        return f"cannot {self.operation} a run on thread {self.thread_id!r}: {self.reason}"


@attrs.define(auto_exc=True, str=False)
class RunFailed(ThreadloomError):
    """A node of the run raised (or returned something that is not a valid step); the run committed FAILED.

    Attributes:
        thread_id: the thread the run ran on.
        run_id: the run.
        node: the graph node that failed.
        message: the node's error, ``"<type>: <text>"``.
    """

    thread_id: str
    run_id: str
    node: str
    message: str

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} of thread {self.thread_id!r} failed in node {self.node!r} ({self.message}); "
            "its latest checkpoint is FAILED: start a new run to go on"
        )


@attrs.define(auto_exc=True, str=False)
class EffectMayHaveRun(ThreadloomError):
    """``ctx.effect(..., on_uncertain="raise")`` met an effect whose intent was recorded but never its result:
    an earlier execution of the step may have called the side effect (its process died, or its run lost the
    thread, before the step committed).

    Attributes:
        thread_id: the thread.
        key: the effect's key, as the node passed it.
        idempotency_key: the key every execution of this effect was (and would be) given.
        run_id: the run that recorded the intent.
        recorded_at: when it did, by that run's clock (aware UTC datetime).
    """

    thread_id: str
    key: str
    idempotency_key: str
    run_id: str
    recorded_at: Any

    def __str__(self) -> str:
        return (
            f"effect {self.key!r} of thread {self.thread_id!r} may have run: run {self.run_id!r} recorded its "
            f"intent at {self.recorded_at} but never its result; ask the provider about idempotency key "
            f"{self.idempotency_key!r}, or call again with it (on_uncertain='repeat')"
        )


@attrs.define(auto_exc=True, str=False)
class StaleLease(ThreadloomError):
    """An attempt that no longer holds its run-queue entry.

    Attributes:
        entry_id: the entry.
        attempt: the attempt number presented (the lease's fencing number).
        current: the entry's current attempt while it is open and leased, else None.
    """

    entry_id: int
    attempt: int
    current: int | None

    def __str__(self) -> str:
        return (
            f"attempt {self.attempt} no longer holds run-queue entry {self.entry_id} (current: {self.current}); "
            "this worker lost the entry and must not finish it"
        )
