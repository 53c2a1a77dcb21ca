"""``InMemoryCheckpointer``: the executable reference of the store contract.

Simplest possible: one lock around plain dictionaries. Every value is kept as JSON text (the codec) and
decoded on read, so nothing returned aliases stored state. The durable stores are checked against it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from threadloom.domain import rules
from threadloom.domain.access import WALK_GRAPH_ID, AccessSchemas, Member, StampColumns
from threadloom.domain.clock import Clock
from threadloom.domain.errors import (
    CancelledError,
    CheckpointNotFound,
    StaleClaim,
    ThreadBusy,
    ValidationError,
)
from threadloom.domain.rules import CheckpointRow
from threadloom.domain.values import (
    Checkpoint,
    CheckpointPage,
    CheckpointStatus,
    ClaimRequest,
    EffectRecord,
    EventRecord,
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
    ThreadSummary,
)
from threadloom.persistence import codec
from threadloom.persistence.base import DEFAULT_MAX_JSON_SIZE, StoreBase, ask_guard
from threadloom.persistence.clock import SystemClock, check_clock, read_clock
from threadloom.persistence.encoded import EncodedCheckpoint, EncodedCommit
from threadloom.persistence.memory.queue import InMemoryRunQueue
from threadloom.persistence.wakeups import Waiters, Wakeups


def _end_before(history: list[Any], thread_id: str, before: str | None) -> int:
    """Where a page of ``history`` (oldest first) ends: the position of checkpoint ``before``, or its length.

    Raises:
        CheckpointNotFound: ``before`` is not in the history.
    """
    if before is None:
        return len(history)
    for position, stored in enumerate(history):
        if stored.row.id == before:
            return position
    raise CheckpointNotFound(thread_id, before)


@attrs.define
class _Claim:
    holder: str
    token: int
    expires_at: datetime
    tenant_id: str | None


@attrs.define
class _Stored:
    text: str
    row: CheckpointRow
    checkpoint: EncodedCheckpoint  # its indexed columns, only ever read to decide (never returned: text is decoded)
    stamp: StampColumns | None = None  # (access_schema, access_tenant, access_attrs); None: unstamped


@attrs.define
class _Event:
    seq: int
    committed_at: datetime
    text: str
    stamp: StampColumns | None = None


@attrs.define
class _Thread:
    first_seq: int
    next_seq: int
    floor: int
    history: list[_Stored] = attrs.Factory(list)
    ids: set[str] = attrs.Factory(set)  # the ids in ``history``: a commit's duplicate check reads no history
    pending: list[str] = attrs.Factory(list)
    pending_stamps: list[StampColumns | None] = attrs.Factory(list)  # one per pending write
    events: list[_Event] = attrs.Factory(list)
    effects: dict[str, str] = attrs.Factory(dict)
    effect_stamps: dict[str, StampColumns | None] = attrs.Factory(dict)  # by effect key
    metadata: dict[str, str] = attrs.Factory(dict)
    updated_at: datetime | None = None
    claim: _Claim | None = None
    deleted_at: datetime | None = None
    stamped_at: datetime | None = None  # the last commit's stamp of its checkpoint or events (never lowered)

    def holds_nothing(self) -> bool:
        return not (self.history or self.pending or self.events or self.effects or self.metadata or self.claim)


@attrs.define
class _Counters:
    """The store-wide numbers (shared by every store over one in-memory storage)."""

    last_token: int = 0
    place_counter: int = 0
    mark: int = 0  # the reclamation mark: new threads number from here


def _counter(name: str) -> Any:
    return property(
        lambda self: getattr(self._counters, name), lambda self, value: setattr(self._counters, name, value)
    )


class InMemoryCheckpointer(StoreBase):
    """The store contract in one process's memory: the reference every other store matches.

    Args:
        clock: the store's clock; it decides claim expiry, ``updated_at``, tombstone and retention age.
        access: the access schemas this store stamps with (README "Access schemas"); default: none declared.
        shared: another in-memory store whose storage this one shares (a second node over one storage, each
            with its own ``access``); its clock is used.
        max_json_size: the longest JSON text, in characters, of one record a commit stores (a checkpoint with
            its state, a pending write, an event, an effect record); default 16 MiB, at most 128 MiB. A longer
            one is a ``ValidationError`` (README "Limits").
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        max_json_size: int = DEFAULT_MAX_JSON_SIZE,
        access: AccessSchemas | None = None,
        shared: InMemoryCheckpointer | None = None,
    ) -> None:
        super().__init__(max_json_size=max_json_size, access=access)
        self._clock = check_clock("clock", clock) if clock is not None else SystemClock()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters = Waiters()  # async waiters (README "asyncio"); blocking ones wait on _changed
        self._rows: dict[str, _Thread] = {}
        self._places: dict[str, dict[str, int]] = {}  # parent -> child -> place (order of first origin commit)
        self._counters = _Counters()
        self._members_by_group: dict[str, dict[str, tuple[tuple[str, ...], datetime]]] = {}
        self.queue: InMemoryRunQueue = InMemoryRunQueue(self)
        """The store's run queue: shares this lock; its open entries' runs survive retention."""
        if shared is not None:
            self._share(shared)

    _last_token = _counter("last_token")
    _place_counter = _counter("place_counter")
    _mark = _counter("mark")

    def __repr__(self) -> str:
        return f"InMemoryCheckpointer(clock={self._clock!r})"

    def _share(self, other: InMemoryCheckpointer) -> None:
        """Makes this store a second node over ``other``'s storage (its own ``access``, the same data)."""
        if not isinstance(other, InMemoryCheckpointer):
            raise ValidationError("shared", (f"must be an InMemoryCheckpointer, got {type(other).__name__}",))
        self._clock = other._clock
        self._lock, self._changed = other._lock, other._changed
        self._rows, self._places, self._counters = other._rows, other._places, other._counters
        self._members_by_group = other._members_by_group
        self.queue = other.queue

    # -- helpers (lock held) ---------------------------------------------------------------------------------------

    def _row(self, thread_id: str) -> _Thread:
        row = self._rows.get(thread_id)
        if row is None:
            start = max(1, self._mark)
            row = self._rows[thread_id] = _Thread(first_seq=start, next_seq=start, floor=start)
        return row

    def _forget_if_empty(self, thread_id: str) -> None:
        row = self._rows.get(thread_id)
        if (
            row is not None
            and row.holds_nothing()
            and row.deleted_at is None
            and row.next_seq == row.first_seq <= max(1, self._mark)
            and not any(thread_id in children for children in self._places.values())
        ):
            del self._rows[thread_id]

    def _token(self) -> int:
        self._last_token += 1
        return self._last_token

    def _current(self, thread_id: str) -> int | None:
        row = self._rows.get(thread_id)
        return row.claim.token if row is not None and row.claim is not None else None

    def _check_token(self, thread_id: str, token: int) -> _Thread:
        row = self._rows.get(thread_id)
        if row is None or row.claim is None or row.claim.token != token:
            raise StaleClaim(thread_id, token, self._current(thread_id))
        return row

    def _check_fence(self, fence: tuple[str, int] | None) -> None:
        if fence is not None:
            self._check_token(*fence)

    @staticmethod
    def _latest_id(row: _Thread | None) -> str | None:
        return row.history[-1].row.id if row is not None and row.history else None

    # Decisions a subclass may override (each runs with the lock held): who may renew, who may commit, where a
    # deleted thread's next incarnation numbers from, which runs a sweep keeps.

    def _renewing(self, thread_id: str, token: int) -> _Thread:
        """The row whose claim ``renew`` extends: ``StaleClaim`` unless ``token`` is its current claim."""
        return self._check_token(thread_id, token)

    def _committing(self, thread_id: str, commit: EncodedCommit) -> tuple[_Thread | None, int | None]:
        """The row ``commit`` writes to (None for a thread never stored) and the claim token its check compares
        the commit's token with (rule 3, in :func:`threadloom.domain.rules.check_commit`)."""
        return self._rows.get(thread_id), self._current(thread_id)

    def _next_incarnation(self, row: _Thread) -> int | None:
        """Where a deleted thread's next incarnation numbers from (None: the numbering does not move)."""
        return rules.tombstone_next_seq(first_seq=row.first_seq, next_seq=row.next_seq)

    def _kept_runs(self, thread_id: str, protected: Mapping[str, frozenset[str]]) -> frozenset[str]:
        """The runs whose newest checkpoint a sweep keeps on the thread: the guard's and the open entries'."""
        return protected.get(thread_id, frozenset()) | self.queue.protected_runs(thread_id)

    # -- claims ----------------------------------------------------------------------------------------------------

    def _claim(self, thread_id: str, request: ClaimRequest) -> RunClaim:
        with self._lock:
            now = read_clock(self._clock)
            existing = self._rows.get(thread_id)
            old = existing.claim if existing is not None else None
            if old is not None and rules.claim_is_live(old.expires_at, now):
                raise ThreadBusy(
                    thread_id,
                    self._latest_id(existing),
                    rules.busy_holder(old.holder, old.tenant_id, request.tenant_id),
                )
            expires_at = now + request.ttl  # first: an overflow must not leave a row or spend a token
            row = self._row(thread_id)
            claim = _Claim(request.holder, self._token(), expires_at, request.tenant_id)
            row.claim = claim
            return RunClaim(
                thread_id=thread_id,
                holder=claim.holder,
                token=claim.token,
                expires_at=claim.expires_at,
                tenant_id=claim.tenant_id,
                taken_over_from=rules.taken_over_from(
                    old.holder if old else None, old.tenant_id if old else None, request.tenant_id
                ),
            )

    def _renew(self, thread_id: str, token: int, ttl: timedelta) -> RunClaim:
        with self._lock:
            row = self._renewing(thread_id, token)
            claim = row.claim
            assert claim is not None
            claim.expires_at = read_clock(self._clock) + ttl
            return RunClaim(
                thread_id=thread_id,
                holder=claim.holder,
                token=claim.token,
                expires_at=claim.expires_at,
                tenant_id=claim.tenant_id,
            )

    def _current_claim(self, thread_id: str) -> RunClaim | None:
        with self._lock:
            row = self._rows.get(thread_id)
            claim = row.claim if row is not None else None
            if claim is None:
                return None
            return RunClaim(thread_id=thread_id, holder=claim.holder, token=claim.token,
                            expires_at=claim.expires_at, tenant_id=claim.tenant_id)

    def _release(self, thread_id: str, token: int) -> None:
        with self._lock:
            row = self._rows.get(thread_id)
            if row is not None and row.claim is not None and row.claim.token == token:
                row.claim = None
                self._forget_if_empty(thread_id)

    # -- commits -----------------------------------------------------------------------------------------------------

    def _commit(self, thread_id: str, commit: EncodedCommit) -> list[EventRecord]:
        with self._lock:
            row, current = self._committing(thread_id, commit)
            cp = commit.checkpoint
            keep = len(row.history) if row is not None else 0
            if commit.retract_turn and cp is not None and row is not None:
                keep = 0
                for index in range(len(row.history) - 1, -1, -1):
                    if row.history[index].checkpoint.settled:
                        keep = index + 1
                        break

            # Asked only after the token check passed: a current claim means the thread has a row.
            def contains(checkpoint_id: str) -> bool:
                assert row is not None
                return checkpoint_id in row.ids

            rules.check_commit(
                thread_id,
                token=commit.token,
                current=current,
                fence=commit.fence,
                fence_current=self._current,
                checkpoint=None if cp is None else (cp.id, cp.parent),
                contains=contains,
                latest_id=lambda: self._latest_id(row),
                pending_targets=commit.pending_targets,
                retract_turn=commit.retract_turn,
            )
            assert row is not None  # a current claim means the thread has a row
            # Every check passed: apply (nothing below can fail).
            now = read_clock(self._clock)
            # Stamps never decrease along a history or a log (what max_age removes is a prefix of each), as the
            # SQL stores stamp them: a clock that stepped back stamps the thread's last stamp again.
            at = now if row.stamped_at is None else max(now, row.stamped_at)
            stamp = commit.stamp if cp is not None else self._latest_stamp(row, thread_id)
            if cp is not None or commit.events:
                row.stamped_at = at
            if cp is None and stamp is not None and row.history[-1].stamp != stamp:
                self._restamp(row, stamp)  # another schema stamped the thread: its older rows get this one too
            pending = [write.text for write in commit.pending_writes]
            if cp is not None:
                for cut in row.history[keep:]:
                    row.ids.discard(cut.row.id)
                del row.history[keep:]
                row.ids.add(cp.id)
                row.history.append(
                    _Stored(cp.text, CheckpointRow(cp.id, cp.run_id, at, row.next_seq), cp, stamp)
                )
                row.pending = pending
                row.pending_stamps = [stamp] * len(pending)
                row.updated_at = now
                if cp.origin_parent is not None:
                    places = self._places.setdefault(cp.origin_parent, {})
                    if thread_id not in places:
                        self._place_counter += 1
                        places[thread_id] = self._place_counter
            else:
                row.pending.extend(pending)
                row.pending_stamps.extend([stamp] * len(pending))
            records = []
            seq = row.next_seq
            for event in commit.events:
                row.events.append(_Event(seq, at, event.text(seq), stamp))
                records.append(event.record(seq))
                seq += 1
            row.next_seq = seq
            for effect in commit.effects:
                if effect.key not in row.effects:
                    row.effects[effect.key] = effect.text
                    row.effect_stamps[effect.key] = stamp
            if commit.metadata:
                row.metadata.update(commit.metadata)
                row.updated_at = now
            if records:
                self._changed.notify_all()
                self._waiters.notify(thread_id)
            return records

    # -- reads -------------------------------------------------------------------------------------------------------

    def _latest(self, thread_id: str) -> StoredCheckpoint | None:
        with self._lock:
            row = self._rows.get(thread_id)
            if row is None or not row.history:
                return None
            return StoredCheckpoint(
                checkpoint=codec.decode_checkpoint(row.history[-1].text, thread_id),
                pending_writes=tuple(codec.decode_pending_write(text, thread_id) for text in row.pending),
            )

    def _checkpoint(self, thread_id: str, checkpoint_id: str) -> Checkpoint | None:
        with self._lock:
            row = self._rows.get(thread_id)
            for stored in row.history if row is not None else ():
                if stored.row.id == checkpoint_id:
                    return codec.decode_checkpoint(stored.text, thread_id)
            return None

    def _history(self, thread_id: str, limit: int, before: str | None) -> list[Checkpoint]:
        with self._lock:
            row = self._rows.get(thread_id)
            history = row.history if row is not None else []
            end = _end_before(history, thread_id, before)
            page = history[max(0, end - limit) : end]
            return [codec.decode_checkpoint(stored.text, thread_id) for stored in reversed(page)]

    def _search_history(
        self, thread_id: str, metadata: dict[str, str], limit: int, before: str | None, scan: int
    ) -> CheckpointPage:
        wanted = metadata.items()
        with self._lock:
            row = self._rows.get(thread_id)
            history = row.history if row is not None else []
            end = _end_before(history, thread_id, before)
            start = max(0, end - scan)
            found: list[Checkpoint] = []
            for stored in reversed(history[start:end]):
                if wanted <= json.loads(stored.checkpoint.metadata).items():
                    found.append(codec.decode_checkpoint(stored.text, thread_id))
                    if len(found) > limit:
                        break
            return CheckpointPage.of(found, limit, history[start].row.id if start > 0 else None)

    def _children(self, parent: str, limit: int, after: str | None) -> list[str]:
        with self._lock:
            places = self._places.get(parent, {})
            start = 0
            if after is not None:
                if after not in places:
                    raise ValidationError("after", (f"{after!r} is not known as a child of {parent!r}",))
                start = places[after]
            out = []
            for child, place in sorted(places.items(), key=lambda item: item[1]):
                if place <= start:
                    continue
                row = self._rows.get(child)
                origin_parent = row.history[-1].checkpoint.origin_parent if row is not None and row.history else None
                if origin_parent == parent:
                    out.append(child)
                    if len(out) == limit:
                        break
            return out

    def _read_events(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        row = self._rows.get(thread_id)
        start = max(1, self._mark)
        first, floor = (row.first_seq, row.floor) if row is not None else (start, start)
        effective = rules.read_start(thread_id, after_seq, first_seq=first, floor=floor)
        if row is None:
            return []
        out = []
        for event in row.events:
            if event.seq > effective:
                out.append(codec.decode_event(event.text, thread_id))
                if len(out) == limit:
                    break
        return out

    def _events_after(self, thread_id: str, after_seq: int, limit: int) -> list[EventRecord]:
        with self._lock:
            return self._read_events(thread_id, after_seq, limit)

    def _await_events_after(
        self, thread_id: str, after_seq: int, limit: int, timeout: timedelta, cancel: threading.Event | None
    ) -> list[EventRecord]:
        deadline = time.monotonic() + timeout.total_seconds()
        with self._changed:
            while True:
                self._ensure_open("await_events_after")
                found = self._read_events(thread_id, after_seq, limit)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found
                if cancel is not None and cancel.is_set():
                    raise CancelledError("await_events_after")
                # Wake on every commit and delete; wake at least every 50 ms to notice ``cancel``.
                self._changed.wait(min(remaining, 0.05) if cancel is not None else remaining)
                if cancel is not None and cancel.is_set():
                    raise CancelledError("await_events_after")

    def _compact_events(self, thread_id: str, before_seq: int) -> None:
        with self._lock:
            row = self._rows.get(thread_id)
            if row is None:
                return
            row.floor = rules.compacted_floor(floor=row.floor, next_seq=row.next_seq, before_seq=before_seq)
            row.events = [event for event in row.events if event.seq >= row.floor]

    def _delete_thread(self, thread_id: str, token: int, fence: tuple[str, int] | None) -> None:
        with self._lock:
            row = self._check_token(thread_id, token)
            self._check_fence(fence)
            start = self._next_incarnation(row)
            if start is not None:
                row.first_seq = row.next_seq = row.floor = start
            row.history, row.pending, row.events = [], [], []
            row.pending_stamps = []
            row.ids = set()
            row.effects, row.metadata = {}, {}
            row.effect_stamps = {}
            row.claim = None
            row.updated_at = None
            row.deleted_at = read_clock(self._clock)
            self._changed.notify_all()
            self._waiters.notify(thread_id)

    def _effect(self, thread_id: str, key: str) -> EffectRecord | None:
        with self._lock:
            row = self._rows.get(thread_id)
            text = row.effects.get(key) if row is not None else None
            return None if text is None else codec.decode_effect(text, thread_id)

    def _lookup_run(self, thread_id: str, run_ids: frozenset[str]) -> Checkpoint | None:
        with self._lock:
            row = self._rows.get(thread_id)
            for stored in reversed(row.history if row is not None else []):
                if stored.row.run_id in run_ids:
                    return codec.decode_checkpoint(stored.text, thread_id)
            return None

    # -- retention -------------------------------------------------------------------------------------------------

    def _prune_row(self, row: _Thread, policy: RetentionPolicy, now: datetime, protected: frozenset[str]) -> bool:
        """Prunes one thread (lock held); True when anything was removed."""
        rows = [stored.row for stored in row.history]
        removed = set(rules.checkpoints_to_prune(rows, policy, now, protected))
        by_policy = rules.checkpoints_to_prune(rows, policy, now) if protected else removed
        oldest_kept_mark = None
        if by_policy:
            oldest_kept_mark = next(r.seq_mark for r in rows if r.id not in set(by_policy))
        newest_expired = None
        if policy.max_age is not None:
            expired = [event.seq for event in row.events if rules.expired(event.committed_at, policy.max_age, now)]
            newest_expired = max(expired) if expired else None
        floor = rules.pruned_floor(
            floor=row.floor,
            next_seq=row.next_seq,
            policy=policy,
            oldest_kept_mark=oldest_kept_mark,
            newest_expired_seq=newest_expired,
        )
        events_before = len(row.events)
        row.history = [stored for stored in row.history if stored.row.id not in removed]
        row.ids -= removed
        row.floor = floor
        row.events = [event for event in row.events if event.seq >= floor]
        return bool(removed) or len(row.events) != events_before

    def _prune(self, thread_id: str, policy: RetentionPolicy) -> None:
        with self._lock:
            row = self._rows.get(thread_id)
            if row is not None:
                self._prune_row(row, policy, read_clock(self._clock), self.queue.protected_runs(thread_id))

    def _sweep(self, policy: SweepPolicy, guard: SweepGuard | None, after: str | None) -> SweepPage:
        with self._lock:
            ids = sorted(thread_id for thread_id in self._rows if after is None or thread_id > after)
        page = tuple(ids[: policy.batch_size])
        protected = ask_guard(guard, page)  # outside the lock: the guard is user code
        pruned, reclaimed = [], []
        with self._lock:
            now = read_clock(self._clock)
            for thread_id in page:
                row = self._rows.get(thread_id)
                if row is None:
                    continue
                runs = self._kept_runs(thread_id, protected)
                if self._prune_row(row, policy.retention, now, runs):
                    pruned.append(thread_id)
                if (
                    policy.tombstone_age is not None
                    and row.deleted_at is not None
                    and now - row.deleted_at > policy.tombstone_age
                    and row.holds_nothing()
                    and row.next_seq == row.first_seq
                    and thread_id not in protected
                ):
                    self._mark = max(self._mark, row.first_seq)
                    del self._rows[thread_id]
                    for places in self._places.values():
                        places.pop(thread_id, None)
                    reclaimed.append(thread_id)
        more = len(ids) > policy.batch_size
        return SweepPage(
            visited=page, pruned=tuple(pruned), reclaimed=tuple(reclaimed), next=page[-1] if more and page else None
        )

    # -- registry --------------------------------------------------------------------------------------------------

    def _summaries(self, tenant_id: str | None, now: datetime) -> list[ThreadSummary]:
        out = []
        for thread_id, row in self._rows.items():
            if not row.history:
                continue
            cp = row.history[-1].checkpoint
            if cp.origin_parent is not None or cp.tenant_id != tenant_id or row.updated_at is None:
                continue
            if cp.graph_id == WALK_GRAPH_ID:  # walk threads are never listed
                continue
            live = row.claim is not None and rules.claim_is_live(row.claim.expires_at, now)
            out.append(
                ThreadSummary(
                    thread_id=thread_id,
                    tenant_id=cp.tenant_id,
                    status=rules.thread_status(CheckpointStatus(cp.status), live_claim=live, metadata=row.metadata),
                    updated_at=row.updated_at,
                    latest_checkpoint_id=cp.id,
                    latest_run_id=cp.run_id,
                    graph_id=cp.graph_id,
                    metadata=dict(row.metadata),
                )
            )
        return out

    def _threads(self, query: ThreadQuery) -> ThreadPage:
        with self._lock:
            rows = self._summaries(query.tenant_id, read_clock(self._clock))
        rows.sort(key=lambda s: (s.updated_at, s.thread_id), reverse=True)
        if query.after is not None:
            cursor = (query.after.updated_at, query.after.thread_id)
            rows = [s for s in rows if (s.updated_at, s.thread_id) < cursor]
        rows = [s for s in rows if query.matches(s)]
        return ThreadPage.of(rows[: query.limit + 1], query.limit)

    def _incomplete(self, tenant_id: str | None, limit: int, after: ThreadCursor | None) -> ThreadPage:
        from threadloom.domain.values import ThreadStatus

        with self._lock:
            rows = self._summaries(tenant_id, read_clock(self._clock))
        rows = [s for s in rows if s.status is ThreadStatus.IDLE]
        rows.sort(key=lambda s: (s.updated_at, s.thread_id))
        if after is not None:
            rows = [s for s in rows if (s.updated_at, s.thread_id) > (after.updated_at, after.thread_id)]
        return ThreadPage.of(rows[: limit + 1], limit)

    def _tenants(self, limit: int, after: str | None) -> TenantPage:
        counts: dict[str | None, int] = {}
        with self._lock:
            for row in self._rows.values():
                if not row.history or row.updated_at is None:
                    continue
                cp = row.history[-1].checkpoint
                if cp.origin_parent is None and cp.graph_id != WALK_GRAPH_ID:
                    counts[cp.tenant_id] = counts.get(cp.tenant_id, 0) + 1
        named = sorted(
            (tenant, n) for tenant, n in counts.items() if tenant is not None and (after is None or tenant > after)
        )
        rows = [TenantCount(tenant_id=tenant, threads=n) for tenant, n in named[: limit + 1]]
        return TenantPage.of(rows, counts.get(None, 0), limit)
    # -- access (README "Access schemas") ----------------------------------------------------------------------------

    def _latest_stamp(self, row: _Thread, thread_id: str) -> StampColumns | None:
        """The stamp a commit without a checkpoint writes: its latest checkpoint's (lock held), derived again by
        this store's schema when it is not of it (a checkpoint an older node committed)."""
        if not row.history:
            return None
        latest = row.history[-1]
        graph_id = latest.checkpoint.graph_id
        if graph_id == WALK_GRAPH_ID:
            return None
        schema = self._access.for_graph(graph_id)
        if latest.stamp is not None and latest.stamp[0] == schema.hash:
            return latest.stamp
        return schema.columns(codec.decode_checkpoint(latest.text, thread_id))

    def _stamp_thread(self, thread_id: str, fence: tuple[str, int] | None) -> int:
        with self._lock:
            self._check_fence(fence)
            row = self._rows.get(thread_id)
            if row is None or not row.history:
                return 0
            stamp = self._latest_stamp(row, thread_id)
            return 0 if stamp is None else self._restamp(row, stamp)

    @staticmethod
    def _restamp(row: _Thread, stamp: StampColumns) -> int:
        """Sets ``stamp`` on every row of the thread whose stamp differs (lock held); returns how many."""
        changed = 0
        for stored in row.history:
            if stored.stamp != stamp:
                stored.stamp = stamp
                changed += 1
        for index, old in enumerate(row.pending_stamps):
            if old != stamp:
                row.pending_stamps[index] = stamp
                changed += 1
        for event in row.events:
            if event.stamp != stamp:
                event.stamp = stamp
                changed += 1
        for key in row.effects:
            if row.effect_stamps.get(key) != stamp:
                row.effect_stamps[key] = stamp
                changed += 1
        return changed

    def _graph_threads(self, graph_id: str, after: str | None, limit: int) -> list[str]:
        with self._lock:
            ids = sorted(
                thread_id
                for thread_id, row in self._rows.items()
                if row.history
                and row.history[-1].checkpoint.graph_id == graph_id
                and (after is None or thread_id > after)
            )
        return ids[:limit]

    def _token_high_water(self) -> int:
        with self._lock:
            return self._last_token

    def _heartbeat(self, group: str, member: str, serves: tuple[str, ...], ttl: timedelta) -> None:
        with self._lock:
            now = read_clock(self._clock)
            members = self._members_by_group.setdefault(group, {})
            for name, (_, expires_at) in list(members.items()):
                if expires_at <= now:
                    del members[name]
            members[member] = (serves, now + ttl)

    def _members(self, group: str) -> list[Member]:
        with self._lock:
            now = read_clock(self._clock)
            members = self._members_by_group.get(group, {})
            return [
                Member(member=name, serves=serves, expires_at=expires_at)
                for name, (serves, expires_at) in sorted(members.items())
                if expires_at > now
            ]

    def _graph_of(self, row: _Thread | None) -> str | None:
        return row.history[-1].checkpoint.graph_id if row is not None and row.history else None

    def _stamped_history(self, thread_id: str, limit: int, before: str | None) -> tuple[str | None, list[Any]]:
        with self._lock:
            row = self._rows.get(thread_id)
            history = row.history if row is not None else []
            end = _end_before(history, thread_id, before)
            page = history[max(0, end - limit) : end]
            return self._graph_of(row), [
                (codec.decode_checkpoint(stored.text, thread_id), stored.stamp) for stored in reversed(page)
            ]

    def _stamped_events(self, thread_id: str, after_seq: int, limit: int) -> tuple[str | None, list[Any]]:
        with self._lock:
            records = self._read_events(thread_id, after_seq, limit)
            row = self._rows.get(thread_id)
            stamps = {event.seq: event.stamp for event in row.events} if row is not None else {}
            return self._graph_of(row), [(record, stamps.get(record.seq)) for record in records]

    def _tenant_threads(self, tenant_id: str | None, after: str | None, limit: int) -> list[str]:
        with self._lock:
            ids = sorted(
                thread_id
                for thread_id, row in self._rows.items()
                if row.history
                and row.history[-1].checkpoint.tenant_id == tenant_id
                and row.history[-1].checkpoint.graph_id != WALK_GRAPH_ID
                and (after is None or thread_id > after)
            )
        return ids[:limit]

    def _stamped_thread(self, thread_id: str) -> Any:
        with self._lock:
            row = self._rows.get(thread_id)
            if row is None:
                return None, [], [], [], []
            return (
                self._graph_of(row),
                [(codec.decode_checkpoint(stored.text, thread_id), stored.stamp) for stored in row.history],
                [
                    (codec.decode_pending_write(text, thread_id), stamp)
                    for text, stamp in zip(row.pending, row.pending_stamps, strict=False)
                ],
                [(codec.decode_event(event.text, thread_id), event.stamp) for event in row.events],
                [
                    (codec.decode_effect(row.effects[key], thread_id), row.effect_stamps.get(key))
                    for key in sorted(row.effects)
                ],
            )

    def wakeups(self) -> Wakeups:
        """The store's waiters, for waiting without a thread per waiter (README "asyncio"): a commit that
        numbers events, and a delete, set the wakes of its thread."""
        return Wakeups(self._waiters)

    def _close(self) -> None:
        with self._changed:
            self._changed.notify_all()
        self._waiters.wake_all()
