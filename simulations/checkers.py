"""The oracle of a simulation: what every store call really did, the invariants checked at once, the probes.

Every :class:`~threadloom.simulations.store.SimStore` call reports its true outcome here — including a write
whose caller was told ``OutcomeUnknown`` — and the oracle checks the simulation's invariants against its own
record of each thread:

* **one live claim**: a claim is granted only once the previous one was released, superseded or expired by
  the granting store's clock;
* **tokens strictly increase** on every thread;
* **no stale write applies**: a renew, commit or delete applies only with the thread's current token, and a
  refused commit leaves nothing behind (no checkpoint, no effect record);
* **gap-free logs**: events are numbered contiguously within an incarnation and no number is ever reused;
* **effects**: an effect's function runs only once its intent is committed, never again once its record is
  committed (a step that never committed may run it again: counted in the ``effect_rerun_uncommitted`` probe),
  and every execution of one effect gets the same idempotency key;
* **retention** never removes a thread's latest checkpoint, nor the newest checkpoint of a run its guard or an
  open queue entry protects;
* **children**: a child thread is deleted only by the holder of its parent's live claim (a cascade from the root,
  or the child retention of the run that holds the parent), never while another run holds the parent and may
  take the child up again;
* **subscriptions** deliver each event once, in order, skipping none;
* **liveness** (checked by the runner once faults heal): every queued run finishes, and every access walk of the
  seed's last schema completes;
* **access walks and stamp-checked reads**: see :mod:`threadloom.simulations.walk_checks`.

The oracle reads the real store directly (never through a node) to check what a refused call left behind.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from threadloom.actors.graph import INTENT_SUFFIX
from threadloom.domain.errors import StaleClaim, ThreadBusy, ThreadloomError
from threadloom.domain.values import Commit, EventRecord, RunClaim, SweepGuard, SweepPage
from threadloom.simulations.walk_checks import WALK_CHECKS, WalkChecks, is_walk_thread
from threadloom.simulations.world import EPOCH, World

RUN_RECOVERED = "threadloom.run_recovered"

CHECKS: tuple[str, ...] = (
    "at most one live claim",
    "tokens strictly increase",
    "no stale-token write applied",
    "commits apply whole",
    "events stored as committed",
    "gap-free event log",
    "event numbers never reused",
    "tombstone numbering",
    "effects recorded only by fenced commits",
    "effects run only after their intent",
    "effects never run again once recorded",
    "re-executions share one idempotency key",
    "retention keeps the latest checkpoint",
    "retention keeps the latest checkpoint's events",
    "retention keeps protected checkpoints",
    "no child a live run may take up is deleted",
    "subscriptions deliver once in order",
    "at most one live lease",
    "lease attempts strictly increase",
    "no stale lease write applied",
    "clean shutdown",
    "every queued run completes",
    *WALK_CHECKS,
    "every walk completes",
    "progress",
    "tasks end cleanly",
)
"""The names of the invariants the oracle and the runner check (``threadloom simulate`` lists them)."""


class Violation(Exception):
    """An invariant failed: ``invariant`` names it, ``detail`` says how."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class _Thread:
    __slots__ = (
        "current",
        "effects",
        "clock",
        "expires_at",
        "gone",
        "holder",
        "incarnation",
        "expect_first",
        "incarnation_seq",
        "latest_from",
        "last_seq",
        "latest",
        "max_token",
        "parent",
        "release_tried",
        "released",
        "run_newest",
        "seq_incarnation",
        "seqs",
        "version",
    )

    def __init__(self) -> None:
        self.max_token = 0
        self.current: int | None = None
        self.expires_at: datetime | None = None
        self.clock: Any = None  # the clock of the store that set expires_at (it decides that claim's expiry)
        self.holder: str | None = None
        self.released = False
        self.release_tried: int | None = None  # a token whose release was asked for but lost (a store fault)
        self.gone = False
        self.incarnation = 0  # bumped by every delete
        self.last_seq = 0  # the highest number ever applied on this thread id
        self.incarnation_seq: int | None = None  # the last number applied in this incarnation
        self.seqs: dict[int, tuple[str, str, str]] = {}  # every number ever applied -> (run_id, type, payload)
        self.seq_incarnation: dict[int, int] = {}  # every number ever applied -> the incarnation it numbered
        self.effects: dict[str, str] = {}  # this incarnation's effect records: key -> run_id
        self.latest: str | None = None
        self.parent: str | None = None  # the parent thread the latest checkpoint's origin names
        self.latest_from = 1  # the first number the commit of the latest checkpoint gave (or would have given)
        self.expect_first: int | None = None  # where the incarnation after a delete must number from
        self.run_newest: dict[str, str] = {}  # run_id -> its newest checkpoint id (this incarnation)
        self.version = 0


def _us(world: World) -> int:
    return (world.now - EPOCH) // timedelta(microseconds=1)


class Oracle:
    """The record of what the store really did, checked call by call (see the module docstring).

    Args:
        world: the simulated world (its time stamps the trace).
        inner: the real store, read directly to check what refused calls left behind.
    """

    def __init__(self, world: World, inner: Any) -> None:
        self.world = world
        self.inner = inner
        self.threads: dict[str, _Thread] = {}
        self.trace: list[str] = []
        self.probes: Counter[str] = Counter()
        self.violation: Violation | None = None
        self.violation_at: int | None = None  # the trace length when it was found
        self.executions: Counter[tuple[str, int, str]] = Counter()
        self.idempotency: dict[tuple[str, int, str], str] = {}  # an effect's first execution's idempotency key
        self.leases: dict[int, _Lease] = {}
        self.max_token = 0  # the highest token granted on any thread
        self.ops = 0  # store calls noted so far (orders what happened to a thread around a walk)
        self.walks = WalkChecks(self)

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _thread(self, thread_id: str) -> _Thread:
        found = self.threads.get(thread_id)
        if found is None:
            found = self.threads[thread_id] = _Thread()
        return found

    def version(self, thread_id: str) -> int:
        """Bumped by every write applied to the thread (a simulated store's ``await_events_after`` wakes on it)."""
        found = self.threads.get(thread_id)
        return found.version if found is not None else 0

    def probe(self, name: str, amount: int = 1) -> None:
        """Counts an interesting situation (the probe histogram)."""
        if amount:
            self.probes[name] += amount

    def log(self, who: str, text: str) -> None:
        """Adds a line to the trace: virtual microseconds, who, what."""
        self.trace.append(f"{_us(self.world):>11} {who:<6} {text}")

    def fail(self, invariant: str, detail: str) -> None:
        """Records the first violation (the runner stops the seed after the step that found it)."""
        self.log("CHECK", f"VIOLATION {invariant}: {detail}")
        if self.violation is None:
            self.violation = Violation(invariant, detail)
            self.violation_at = len(self.trace)

    # -- store calls --------------------------------------------------------------------------------------------

    def note(
        self, store: Any, op: str, thread_id: str | None, args: tuple[Any, ...], *, result: Any = None,
        error: BaseException | None = None,
    ) -> None:
        """Records and checks one store call's true outcome (``error`` when it did not apply)."""
        who = store.node.name
        self.ops += 1
        if error is not None:
            self.log(who, f"{op} {thread_id or '-'} {_args(op, args)} -> {type(error).__name__}")
            if isinstance(error, StaleClaim):
                # a fence's refusal names the fencing thread (a child's admission fenced by its parent's claim)
                self.probe(f"{'stale_token' if error.thread_id == thread_id else 'fence'}_refused.{op}")
            elif isinstance(error, ThreadBusy):
                self.probe(f"busy.{op}")
            if op == "commit":
                self._check_refused_commit(thread_id, args[1])
            if op == "release" and thread_id is not None:
                self._thread(thread_id).release_tried = args[1]  # lost on the way: the runtime did its part
            return
        self.log(who, f"{op} {thread_id or '-'} {_args(op, args)} -> {_result(op, result)}")
        if op in ("tenant_history", "tenant_events_after", "export_tenant"):
            self.walks.tenant_read(store, op, args, result)
            return
        if op == "stamp_thread" and thread_id is not None:
            self.walks.stamp_applied(store, thread_id, args[1] if len(args) > 1 else None)
            return
        if thread_id is None:
            return
        handler = getattr(self, f"_on_{op}", None)
        if handler is not None:
            handler(store, thread_id, args, result)

    def _on_claim(self, store: Any, thread_id: str, _args: tuple[Any, ...], claim: RunClaim) -> None:
        st = self._thread(thread_id)
        if claim.token <= st.max_token:
            self.fail("tokens strictly increase", f"{thread_id}: granted token {claim.token} after {st.max_token}")
        elif claim.token <= self.max_token:
            self.fail(
                "tokens strictly increase",
                f"{thread_id}: granted token {claim.token} after token {self.max_token} of another thread "
                "(one counter for the whole storage)",
            )
        self.max_token = max(self.max_token, claim.token)
        if st.current is not None and not st.released and not st.gone and st.expires_at is not None:
            now = store.store_clock.now()
            if st.expires_at > now:
                walk = is_walk_thread(thread_id)
                self.fail(
                    "at most one live walk lease per graph kind" if walk else "at most one live claim",
                    f"{thread_id}: token {claim.token} granted while token {st.current} was live until "
                    f"{st.expires_at.isoformat()} (store clock {now.isoformat()})",
                )
        taken = "takeover" if claim.taken_over_from is not None else "claim_granted"
        self.probe(f"walk_lease_{taken}" if is_walk_thread(thread_id) else taken)
        st.max_token = max(st.max_token, claim.token)
        st.current, st.expires_at, st.released, st.gone = claim.token, claim.expires_at, False, False
        st.holder, st.clock = claim.holder, store.store_clock

    def _fenced(self, st: _Thread, thread_id: str, op: str, token: int) -> None:
        if token != st.current or st.released or st.gone:
            state = "released" if st.released else "gone with its thread" if st.gone else f"current is {st.current}"
            self.fail("no stale-token write applied", f"{thread_id}: {op} with token {token} applied ({state})")

    def _check_fence(self, thread_id: str, op: str, fence: tuple[str, int] | None) -> None:
        """A fenced write applies only while the fence's thread is held by the fence's token."""
        if fence is None:
            return
        self.probe(f"fenced.{op}")
        fenced_thread, token = fence
        st = self._thread(fenced_thread)
        if token != st.current or st.released or st.gone:
            self.fail(
                "no stale-token write applied",
                f"{thread_id}: {op} fenced by {fenced_thread}'s token {token} applied (current is {st.current})",
            )

    def _on_renew(self, store: Any, thread_id: str, args: tuple[Any, ...], claim: RunClaim) -> None:
        st = self._thread(thread_id)
        self._fenced(st, thread_id, "renew", args[1])
        if args[1] == st.current:
            st.expires_at, st.clock = claim.expires_at, store.store_clock

    def _on_release(self, _store: Any, thread_id: str, args: tuple[Any, ...], _result: Any) -> None:
        st = self._thread(thread_id)
        if args[1] == st.current:
            st.released = True

    def _on_commit(self, store: Any, thread_id: str, args: tuple[Any, ...], records: list[EventRecord]) -> None:
        st = self._thread(thread_id)
        commit: Commit = args[1]
        self._fenced(st, thread_id, "commit", commit.token)
        self._check_fence(thread_id, "commit", commit.fence)
        self.walks.committed(store, thread_id, commit)
        if len(records) != len(commit.events):
            self.fail(
                "commits apply whole", f"{thread_id}: {len(commit.events)} events committed, {len(records)} numbered"
            )
        for record, draft in zip(records, commit.events, strict=False):  # a length mismatch is reported above
            if (record.run_id, record.type, record.checkpoint_id, _json(record.payload)) != (
                draft.run_id, draft.type, draft.checkpoint_id, _json(draft.payload)
            ):
                self.fail("events stored as committed", f"{thread_id}: seq {record.seq} differs from its draft")
        expected = st.incarnation_seq + 1 if st.incarnation_seq is not None else None
        if expected is None and records and st.expect_first is not None and records[0].seq != st.expect_first:
            self.fail(
                "tombstone numbering",
                f"{thread_id}: the incarnation after a delete numbers from {records[0].seq}, not "
                f"{st.expect_first} (one number past the deleted log)",
            )
        first_seq = records[0].seq if records else (st.incarnation_seq + 1 if st.incarnation_seq else None)
        for record in records:
            if record.seq in st.seqs:
                self.fail("event numbers never reused", f"{thread_id}: seq {record.seq} numbered twice")
            elif expected is not None and record.seq != expected:
                self.fail("gap-free event log", f"{thread_id}: seq {record.seq} follows {expected - 1}")
            elif expected is None and record.seq <= st.last_seq:
                self.fail("event numbers never reused", f"{thread_id}: seq {record.seq} after {st.last_seq}")
            st.seqs[record.seq] = (record.run_id, record.type, _json(record.payload))
            st.seq_incarnation[record.seq] = st.incarnation
            st.last_seq = max(st.last_seq, record.seq)
            st.incarnation_seq = record.seq
            expected = record.seq + 1
            if record.type == RUN_RECOVERED:
                self.probe("run_recovered")
        for effect in commit.effects:
            if effect.key in st.effects:
                self.probe("effect_record_kept_first")
            else:
                st.effects[effect.key] = effect.run_id
                self.probe("effect_intent_recorded" if effect.key.endswith(INTENT_SUFFIX) else "effect_recorded")
        cp = commit.checkpoint
        if cp is not None:
            st.latest = cp.id
            st.latest_from = first_seq if first_seq is not None else st.last_seq + 1
            st.run_newest[cp.run_id] = cp.id
            st.parent = cp.origin.parent_thread if cp.origin is not None else None
            if cp.origin is not None:
                self.probe("child_checkpoint")
        st.version += 1

    def _check_refused_commit(self, thread_id: str | None, commit: Commit) -> None:
        """A refused (or lost) commit must have left nothing: no checkpoint, no effect record of its own."""
        assert thread_id is not None
        cp = commit.checkpoint
        try:
            if cp is not None and self.inner.checkpoint(thread_id, cp.id) is not None:
                self.fail("no stale-token write applied", f"{thread_id}: refused commit left checkpoint {cp.id}")
            for effect in commit.effects:
                found = self.inner.effect(thread_id, effect.key)
                if found is not None and found.checkpoint_id == effect.checkpoint_id and found.run_id == effect.run_id:
                    if self._thread(thread_id).effects.get(effect.key) != effect.run_id:
                        self.fail(
                            "effects recorded only by fenced commits",
                            f"{thread_id}: refused commit of run {effect.run_id} left effect record {effect.key!r}",
                        )
        except ThreadloomError:
            return

    def _on_delete_thread(self, store: Any, thread_id: str, args: tuple[Any, ...], _result: Any) -> None:
        st = self._thread(thread_id)
        self._fenced(st, thread_id, "delete_thread", args[1])
        fence = args[2] if len(args) > 2 else None
        self._check_fence(thread_id, "delete_thread", fence)
        self._check_child_delete(store, thread_id, st, fence)
        if st.incarnation_seq is not None:
            st.expect_first = st.incarnation_seq + 2  # a delete skips one number
        st.gone, st.latest, st.incarnation_seq, st.parent = True, None, None, None
        st.incarnation += 1
        st.effects, st.run_newest = {}, {}
        st.version += 1
        self.probe("thread_deleted")

    def _check_child_delete(self, store: Any, thread_id: str, st: _Thread, fence: tuple[str, int] | None) -> None:
        """A child's delete applies only while no run but the deleter's holds the parent's live claim."""
        if st.parent is None:
            return
        self.probe("child_deleted")
        if fence is not None and fence[0] == st.parent:
            self.probe("child_deleted_fenced_by_parent")
        parent = self.threads.get(st.parent)
        if parent is None or parent.current is None or parent.released or parent.gone or parent.expires_at is None:
            return
        clock = parent.clock if parent.clock is not None else store.store_clock
        if parent.expires_at > clock.now() and parent.holder != st.holder:
            self.fail(
                "no child a live run may take up is deleted",
                f"{thread_id}: deleted by {st.holder} while {parent.holder} holds its parent {st.parent} "
                f"(token {parent.current}, live until {parent.expires_at.isoformat()})",
            )

    def _on_compact_events(self, _store: Any, thread_id: str, _args: tuple[Any, ...], _result: Any) -> None:
        self._thread(thread_id).version += 1

    def note_queue(self, store: Any, op: str, args: tuple[Any, ...], *, result: Any = None,
                   error: BaseException | None = None) -> None:
        """Records one run-queue call (the trace and the probes)."""
        if op == "lease" and result is None and error is None:
            return  # an empty poll: not worth a trace line
        outcome = type(error).__name__ if error is not None else _queue_result(op, result)
        self.log(store.node.name, f"queue.{op} {_args(op, args)} -> {outcome}")
        if error is not None:
            self.probe(f"queue_refused.{op}")
            return
        if op == "lease":
            self._on_lease(store, result)
        elif op in ("renew_lease", "record_run", "finish", "release_lease"):
            entry_id, attempt = args[0], args[1]
            lease = self.leases.get(entry_id)
            if op == "release_lease" and (lease is None or lease.attempt != attempt):
                return  # a stale attempt's release changes nothing (like a claim's release)
            finished_again = op == "finish" and lease is not None and lease.finished == attempt
            if lease is None or lease.attempt != attempt or (lease.ended and not finished_again):
                state = "none" if lease is None else f"attempt {lease.attempt}" + (" ended" if lease.ended else "")
                self.fail("no stale lease write applied", f"entry {entry_id}: {op} by attempt {attempt} ({state})")
                return
            if op == "renew_lease":
                lease.expires_at, lease.clock = result.expires_at, store.store_clock
            elif op in ("finish", "release_lease"):
                lease.ended = True
                if op == "finish":
                    lease.finished = attempt  # finishing again by this attempt is a safe retry

    def _on_lease(self, store: Any, lease: Any) -> None:
        entry_id = lease.entry.entry_id
        previous = self.leases.get(entry_id)
        if previous is not None:
            if lease.attempt <= previous.attempt:
                self.fail("lease attempts strictly increase", f"entry {entry_id}: attempt {lease.attempt} after "
                          f"{previous.attempt}")
            now = store.store_clock.now()
            if not previous.ended and previous.expires_at > now:
                self.fail(
                    "at most one live lease",
                    f"entry {entry_id}: attempt {lease.attempt} leased while attempt {previous.attempt} was live "
                    f"until {previous.expires_at.isoformat()}",
                )
        if lease.taken_over_from is not None:
            self.probe("lease_taken_over")
        self.leases[entry_id] = _Lease(lease.attempt, lease.expires_at, store.store_clock)

    # -- sweeps -------------------------------------------------------------------------------------------------

    def guard_for(self, store: Any, guard: SweepGuard | None) -> SweepGuard:
        """A guard that answers as ``guard`` and notes, for each run it (or an open queue entry) protects, the
        newest checkpoint that exists at that moment: the sweep must leave it."""
        return _CheckingGuard(self, store, guard)

    def after_sweep(self, store: Any, page: SweepPage, guard: _CheckingGuard) -> None:
        """Checks a sweep page: the latest checkpoints and the protected ones are still there."""
        self.probe("sweep_page")
        self.probe("thread_pruned", len(page.pruned))
        self.probe("tombstone_reclaimed", len(page.reclaimed))
        for thread_id in page.reclaimed:
            st = self.threads.get(thread_id)
            if st is not None:
                st.expect_first = None  # a reclaimed thread numbers on from the store's mark
        for thread_id in page.visited:
            st = self.threads.get(thread_id)
            if st is None or st.gone or st.latest is None:
                continue
            if self.inner.checkpoint(thread_id, st.latest) is None:
                self.fail("retention keeps the latest checkpoint", f"{thread_id}: latest {st.latest} was removed")
            if st.incarnation_seq is not None and st.incarnation_seq >= st.latest_from:
                try:
                    kept = self.inner.events_after(thread_id, st.latest_from - 1, 1)
                except ThreadloomError as error:
                    kept = []
                    self.fail(
                        "retention keeps the latest checkpoint's events",
                        f"{thread_id}: reading from seq {st.latest_from} raised {type(error).__name__}",
                    )
                if kept and kept[0].seq != st.latest_from:
                    self.fail(
                        "retention keeps the latest checkpoint's events",
                        f"{thread_id}: seq {st.latest_from} (the latest checkpoint's commit) was removed",
                    )
        for thread_id, kept in sorted(guard.kept.items()):
            for run_id, cp_id in sorted(kept.items()):
                if self.inner.checkpoint(thread_id, cp_id) is None:
                    self.fail(
                        "retention keeps protected checkpoints",
                        f"{thread_id}: checkpoint {cp_id} of protected run {run_id} was removed",
                    )

    # -- effects and subscriptions (reported by the workload) -------------------------------------------------

    def effect_ran(self, who: str, thread_id: str, key: str, run_id: str, idempotency_key: str) -> None:
        """An effect's function ran (``key`` is its record key): its intent must be committed, its record not,
        on this incarnation of the thread, and every execution must get the first one's idempotency key."""
        st = self._thread(thread_id)
        self.log(who, f"effect {thread_id} {key} ran for {run_id}")
        if key in st.effects:
            self.fail(
                "effects never run again once recorded",
                f"{thread_id}: effect {key!r} ran again for {run_id} after run {st.effects[key]} recorded it",
            )
        if key + INTENT_SUFFIX not in st.effects:
            self.fail("effects run only after their intent", f"{thread_id}: effect {key!r} ran for {run_id}")
        place = (thread_id, st.incarnation, key)
        first = self.idempotency.setdefault(place, idempotency_key)
        if first != idempotency_key:
            self.fail(
                "re-executions share one idempotency key",
                f"{thread_id}: effect {key!r} ran for {run_id} with {idempotency_key!r}, first with {first!r}",
            )
        self.executions[place] += 1
        if self.executions[place] > 1:
            self.probe("effect_rerun_uncommitted")

    def delivered(self, who: str, thread_id: str, last: int, event: EventRecord) -> None:
        """A subscription delivered ``event`` after the event numbered ``last``: in order, once, none skipped."""
        st = self._thread(thread_id)
        self.probe("subscription_event")
        if event.seq <= last:
            self.fail("subscriptions deliver once in order", f"{thread_id}: seq {event.seq} delivered after {last}")
            return
        incarnation = st.seq_incarnation.get(event.seq)
        if last and incarnation is not None and st.seq_incarnation.get(last, incarnation) != incarnation:
            self.fail(
                "subscriptions deliver once in order",
                f"{thread_id}: delivered seq {event.seq} of a new incarnation after seq {last} of a deleted one "
                "(the read must raise ThreadDeleted)",
            )
        skipped = [seq for seq in range(last + 1, event.seq) if st.seq_incarnation.get(seq, -1) == incarnation]
        if skipped:
            self.fail("subscriptions deliver once in order", f"{thread_id}: skipped seq {skipped[0]} ({who})")
        if st.seqs.get(event.seq) not in (None, (event.run_id, event.type, _json(event.payload))):
            self.fail("subscriptions deliver once in order", f"{thread_id}: seq {event.seq} is not the event applied")

    def check_released(self, nodes: set[str]) -> None:
        """After ``nodes`` closed their runtimes: no claim is held by a run of theirs that never asked to release
        it (a release lost to a store fault leaves the claim until it expires: the runtime did its part)."""
        for thread_id in sorted(self.threads):
            st = self.threads[thread_id]
            if st.current is None or st.released or st.gone or st.holder is None:
                continue
            if st.release_tried == st.current:
                continue
            if st.expires_at is not None and st.clock is not None and st.expires_at <= st.clock.now():
                continue  # e.g. a claim granted whose reply was lost: its run never knew its token
            if st.holder.partition(":")[0].partition("/")[0] in nodes:  # a run's, or a walker's lease
                self.fail("clean shutdown", f"{thread_id}: token {st.current} of run {st.holder} not released")

    # -- the end ----------------------------------------------------------------------------------------------

    def final_check(self) -> None:
        """Reads every thread's log from the store: contiguous within the incarnation, and what was applied."""
        for thread_id in sorted(self.threads):
            st = self.threads[thread_id]
            if st.gone:
                continue
            try:
                events = self.inner.events_after(thread_id, 0, 1000)
            except ThreadloomError:
                continue
            for before, after in itertools.pairwise(events):
                if after.seq != before.seq + 1:
                    self.fail("gap-free event log", f"{thread_id}: the log jumps from {before.seq} to {after.seq}")
            for event in events:
                if st.seqs.get(event.seq) != (event.run_id, event.type, _json(event.payload)):
                    self.fail("gap-free event log", f"{thread_id}: stored seq {event.seq} is not the event applied")


class _Lease:
    __slots__ = ("attempt", "clock", "ended", "expires_at", "finished")

    def __init__(self, attempt: int, expires_at: datetime, clock: Any) -> None:
        self.attempt = attempt
        self.expires_at = expires_at
        self.clock = clock
        self.ended = False  # finished or handed back
        self.finished: int | None = None  # the attempt that finished the entry


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class _CheckingGuard:
    def __init__(self, oracle: Oracle, store: Any, guard: SweepGuard | None) -> None:
        self._oracle = oracle
        self._store = store
        self._guard = guard
        self.kept: dict[str, dict[str, str]] = {}

    def protected(self, thread_ids: tuple[str, ...]) -> Any:
        answer = dict(self._guard.protected(thread_ids)) if self._guard is not None else {}
        queue = getattr(self._store.inner, "queue", None)
        opened = queue.open_runs(thread_ids) if queue is not None else {}
        inner = self._oracle.inner
        for thread_id in sorted(set(answer) | set(opened)):
            st = self._oracle.threads.get(thread_id)
            if st is None or st.gone:
                continue
            runs = set(answer.get(thread_id, ())) | set(opened.get(thread_id, ()))
            for run_id in sorted(runs):
                cp_id = st.run_newest.get(run_id)
                if cp_id is not None and inner.checkpoint(thread_id, cp_id) is not None:
                    self.kept.setdefault(thread_id, {})[run_id] = cp_id
        return answer


def _args(op: str, args: tuple[Any, ...]) -> str:
    if op == "claim":
        request = args[1]
        return f"holder={request.holder}"
    if op in ("renew", "release"):
        return f"token={args[1]}"
    if op == "delete_thread":
        return f"token={args[1]}{_fence_text(args[2] if len(args) > 2 else None)}"
    if op == "commit":
        commit: Commit = args[1]
        cp = commit.checkpoint
        cp_text = f" cp={cp.id}:{cp.status.value}" if cp is not None else ""
        effects = f" effects={','.join(e.key for e in commit.effects)}" if commit.effects else ""
        return f"token={commit.token}{_fence_text(commit.fence)}{cp_text} events={len(commit.events)}{effects}"
    if op in ("events_after",):
        return f"after={args[1]}"
    if op == "stamp_thread":
        return _fence_text(args[1] if len(args) > 1 else None).strip()
    if op in ("tenant_history", "tenant_events_after"):
        return f"tenant={args[1]}"
    if op == "export_tenant":
        return f"tenant={args[0]}"
    if op == "graph_threads":
        return str(args[0])
    if op == "sweep":
        return f"after={args[2] if len(args) > 2 else None}"
    if op in ("renew_lease", "record_run", "finish", "release_lease"):
        return f"entry={args[0]} attempt={args[1]}" + (f" run={args[2]}" if op == "record_run" else "")
    if op == "lease":
        return f"holder={args[0]}"
    if op == "enqueue":
        return f"thread={args[0]}"
    return ""


def _fence_text(fence: tuple[str, int] | None) -> str:
    return f" fence={fence[0]}:{fence[1]}" if fence is not None else ""


def _result(op: str, result: Any) -> str:
    if op in ("claim", "renew"):
        taken = f" taken_over_from={result.taken_over_from}" if getattr(result, "taken_over_from", None) else ""
        return f"token={result.token}{taken}"
    if op == "commit":
        return f"seqs={result[0].seq}..{result[-1].seq}" if result else "ok"
    if op == "latest":
        return "none" if result is None else f"{result.checkpoint.id}:{result.checkpoint.status.value}"
    if op in ("events_after", "tenant_events_after"):
        return f"{len(result)} events"
    if op == "tenant_history":
        return f"{len(result)} checkpoints"
    if op == "export_tenant":
        return f"{len(result.threads)} threads"
    if op == "stamp_thread":
        return f"rows={result}"
    if op == "graph_threads":
        return ",".join(result) or "none"
    if op == "sweep":
        return f"visited={len(result.visited)} pruned={len(result.pruned)} reclaimed={len(result.reclaimed)}"
    if op in ("effect", "checkpoint", "lookup_run"):
        return "none" if result is None else "found"
    return "ok"


def _queue_result(op: str, result: Any) -> str:
    if op == "lease":
        return f"entry={result.entry.entry_id} attempt={result.attempt}"
    if op == "enqueue":
        return f"entry={result.entry_id}"
    return "ok"
