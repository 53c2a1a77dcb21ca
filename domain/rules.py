"""The pure rules of the store contract, shared by every store so they decide alike.

Nothing here reads a clock or storage: the caller passes ``now`` (the store's clock) and the rows it read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import attrs

from threadloom.domain.errors import (
    CheckpointConflict,
    InvalidCommit,
    ReplayUnavailable,
    StaleClaim,
    ThreadDeleted,
)
from threadloom.domain.values import BusyHolder, CheckpointStatus, RetentionPolicy, ThreadStatus

DELETING_KEY = "threadloom.deleting"
"""Thread metadata key a cascade delete sets on its root first."""

MAX_PAGE = 1000
"""Largest ``limit`` of ``history``, ``children`` and ``incomplete`` (as ``ThreadQuery.MAX_LIMIT``)."""

MAX_SCAN = 1000
"""Most checkpoints one ``search_history`` call examines (its ``scan`` window, and its default)."""

MAX_FILTER_KEYS = 64
"""Most keys of a ``search_history`` metadata filter."""

MAX_EVENTS_PAGE = 10_000
"""Largest ``limit`` of ``events_after`` and ``await_events_after``."""


def check_token(thread_id: str, token: int, current: int | None) -> None:
    """A write under ``token`` needs it to be the thread's current claim (rule 1; commits, renewals, deletes).

    Raises:
        StaleClaim: naming ``current`` (None: no claim holds the thread).
    """
    if current != token:
        raise StaleClaim(thread_id, token, current)


def check_commit(
    thread_id: str,
    *,
    token: int,
    current: int | None,
    fence: tuple[str, int] | None,
    fence_current: Callable[[str], int | None],
    checkpoint: tuple[str, str | None] | None,
    contains: Callable[[str], bool],
    latest_id: Callable[[], str | None],
    pending_targets: Sequence[tuple[str, str]],
    retract_turn: bool,
) -> None:
    """Commit rule 3: the checks of a commit, in order, the first failure winning (every store calls this).

    The store passes what it read inside its write transaction; the callables are asked only when their check
    is reached, so a refused commit reads no more than it must.

    Args:
        token, current: the commit's token and the thread's current claim token (None: no claim).
        fence, fence_current: the commit's fence ``(other_thread, other_token)`` and a reader of another
            thread's current claim token.
        checkpoint: ``(id, parent)`` of the commit's checkpoint, or None.
        contains: whether the thread's history holds a checkpoint id (as it stands before the commit: with
            ``retract_turn`` before the cut).
        latest_id: the thread's latest checkpoint id before the commit (None for an empty history): what the
            checkpoint's parent must name — with ``retract_turn`` too, the cut coming after every check — and
            what pending writes name when the commit has no checkpoint.
        pending_targets: ``(task_id, checkpoint_id)`` of each pending write, in order.
        retract_turn: the commit's flag.

    Raises:
        StaleClaim: own token, then the fence's token (naming the fence's thread).
        CheckpointConflict: the checkpoint's parent is not ``latest_id()``.
        InvalidCommit: the checkpoint id is already in the history; a pending write names another checkpoint
            than the resulting latest; ``retract_turn`` without a checkpoint.
    """
    check_token(thread_id, token, current)
    if fence is not None:
        check_token(fence[0], fence[1], fence_current(fence[0]))
    if checkpoint is not None:
        checkpoint_id, parent = checkpoint
        latest = latest_id()
        if parent != latest:
            raise CheckpointConflict(thread_id, parent, latest)
        if contains(checkpoint_id):
            raise InvalidCommit(thread_id, f"checkpoint {checkpoint_id!r} is already in the history")
    if pending_targets:
        resulting = checkpoint[0] if checkpoint is not None else latest_id()
        for task_id, target in pending_targets:
            if target != resulting:
                raise InvalidCommit(
                    thread_id,
                    f"pending write of task {task_id!r} names checkpoint {target!r}, not the latest {resulting!r}",
                )
    if retract_turn and checkpoint is None:
        raise InvalidCommit(thread_id, "retract_turn needs a checkpoint to follow the settled one")


def claim_is_live(expires_at: datetime, now: datetime) -> bool:
    """A claim is live while ``now < expires_at``; at exactly ``expires_at`` it has expired (rule 1)."""
    return now < expires_at


def same_tenant(recorded: str | None, requested: str | None) -> bool:
    """Whether a claim's recorded tenant is the request's: ``None`` matches only ``None`` (rule 1)."""
    return recorded == requested


def busy_holder(claim_holder: str, claim_tenant: str | None, request_tenant: str | None) -> BusyHolder:
    """Who a ``ThreadBusy`` names: the holder only to the same tenant, else ``UNNAMED``."""
    if same_tenant(claim_tenant, request_tenant):
        return BusyHolder.Run(claim_holder)
    return BusyHolder.UNNAMED


def taken_over_from(old_holder: str | None, old_tenant: str | None, request_tenant: str | None) -> str | None:
    """The ``RunClaim.taken_over_from`` of a claim that replaces an expired, unreleased one (rule 1)."""
    if old_holder is not None and same_tenant(old_tenant, request_tenant):
        return old_holder
    return None


def thread_status(
    latest_status: CheckpointStatus, *, live_claim: bool, metadata: Mapping[str, str]
) -> ThreadStatus:
    """A thread's registry status (cascade deletes included).

    ``DELETED`` once a cascade delete has marked it, else ``RUNNING`` while a live claim holds it, else the
    latest checkpoint's status, with ``RUNNING`` read as ``IDLE``.
    """
    if metadata.get(DELETING_KEY) == "true":
        return ThreadStatus.DELETED
    if live_claim:
        return ThreadStatus.RUNNING
    return {
        CheckpointStatus.RUNNING: ThreadStatus.IDLE,
        CheckpointStatus.SUSPENDED: ThreadStatus.SUSPENDED,
        CheckpointStatus.COMPLETED: ThreadStatus.COMPLETED,
        CheckpointStatus.FAILED: ThreadStatus.FAILED,
    }[latest_status]


def read_start(thread_id: str, after_seq: int, *, first_seq: int, floor: int) -> int:
    """The ``after_seq`` a read really starts after, or the error the read is.

    Args:
        after_seq: what the caller asked for (>= 0).
        first_seq: the first number of the thread's current incarnation (1 for a thread never deleted and
            created before any reclamation).
        floor: the replay floor: the smallest number still readable (``first_seq`` until compaction).

    Returns:
        The effective ``after_seq``: 0 and ``first_seq - 1`` both read from the incarnation's first event.

    Raises:
        ThreadDeleted: ``1 <= after_seq <= first_seq - 2`` (inside a deleted incarnation's log).
        ReplayUnavailable: the start lies behind the replay floor.
    """
    if 1 <= after_seq <= first_seq - 2:
        raise ThreadDeleted(thread_id, first_seq)
    effective = max(after_seq, first_seq - 1)
    if effective < floor - 1:
        raise ReplayUnavailable(thread_id, floor)
    return effective


@attrs.frozen
class CheckpointRow:
    """What retention needs to know of one stored checkpoint, oldest first in a history."""

    id: str
    run_id: str
    committed_at: datetime
    seq_mark: int
    """The thread's next event number when the checkpoint was committed (its commit's events start here)."""


def expired(committed_at: datetime, max_age: timedelta | None, now: datetime) -> bool:
    """Whether something the store committed at ``committed_at`` is too old: ``now >= committed_at + max_age``."""
    return max_age is not None and now >= committed_at + max_age


def checkpoints_to_prune(
    rows: Sequence[CheckpointRow],
    policy: RetentionPolicy,
    now: datetime,
    protected_runs: Iterable[str] = (),
) -> list[str]:
    """The ids of the checkpoints ``policy`` removes from a history.

    Args:
        rows: the whole history, oldest first (the last is the latest, always kept).
        policy: ``max_checkpoints`` keeps the newest that many; ``max_age`` removes what the store committed
            ``max_age`` ago or longer, by ``now``.
        protected_runs: run ids whose newest checkpoint is kept whatever the policy.

    Returns:
        Ids to remove, oldest first.
    """
    if not rows or (policy.max_age is None and policy.max_checkpoints is None):
        return []
    keep: set[str] = {rows[-1].id}
    protected = set(protected_runs)
    if protected:
        seen: set[str] = set()
        for row in reversed(rows):
            if row.run_id in protected and row.run_id not in seen:
                seen.add(row.run_id)
                keep.add(row.id)
    newest_kept_by_count = len(rows) - (policy.max_checkpoints or len(rows))
    removed = []
    for index, row in enumerate(rows):
        if row.id in keep:
            continue
        if index < newest_kept_by_count or expired(row.committed_at, policy.max_age, now):
            removed.append(row.id)
    return removed


def pruned_floor(
    *,
    floor: int,
    next_seq: int,
    policy: RetentionPolicy,
    oldest_kept_mark: int | None,
    newest_expired_seq: int | None,
) -> int:
    """The replay floor after retention. Never lowers it, never passes ``next_seq``.

    Args:
        floor: the current replay floor.
        next_seq: the number the thread's next event would take.
        oldest_kept_mark: when checkpoints were pruned, the ``seq_mark`` of the oldest kept: events before it go.
        newest_expired_seq: the highest number of an event committed ``max_age`` ago or longer, if any.
    """
    new = floor
    if oldest_kept_mark is not None:
        new = max(new, oldest_kept_mark)
    if newest_expired_seq is not None:
        new = max(new, newest_expired_seq + 1)
    if policy.max_events is not None:
        new = max(new, next_seq - policy.max_events)
    return min(new, next_seq)


def compacted_floor(*, floor: int, next_seq: int, before_seq: int) -> int:
    """The replay floor after ``compact_events(before_seq)``: raised to ``before_seq``, at most ``next_seq``."""
    return min(max(floor, before_seq), max(floor, next_seq))


def tombstone_next_seq(*, first_seq: int, next_seq: int) -> int | None:
    """Where the next incarnation numbers from after a delete, or None when this one numbered no event.

    The deleted log ended at ``next_seq - 1``; the next incarnation starts one number past it
    (``next_seq + 1``, "one number skipped" by a delete).
    """
    if next_seq > first_seq:
        return next_seq + 1
    return None
