"""The contract suite: Prune and sweep."""

from __future__ import annotations

from datetime import timedelta

import pytest

from threadloom.domain.errors import (
    ProcessingError,
    ReplayUnavailable,
    ThreadBusy,
    ThreadDeleted,
)
from threadloom.domain.values import (
    ClaimRequest,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    LIVE,
    PAST_SHORT,
    SHORT,
    RecordingGuard,
    Writer,
    expect,
    ids_of,
    present,
    reclaimed,
    seqs,
    snapshot,
    sweep_all,
)
from threadloom.testing.harness import StoreHarness


class RetentionContract:
    """Prune and sweep.

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- prune ---------------------------------------------------------------------------

    def test_prune_by_count_keeps_the_newest_and_raises_the_floor(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        for index in range(1, 6):
            writer.step(f"c{index}", events=2)  # c1: 1-2, c2: 3-4, c3: 5-6, c4: 7-8, c5: 9-10
        writer.commit(pending_writes=[PendingWrite(checkpoint_id="c5", task_id="t", node_id="n")])
        writer.release()  # prune needs no claim
        store.prune("t", RetentionPolicy(max_checkpoints=2))
        assert ids_of(store.history("t", limit=10)) == ["c5", "c4"]
        assert len(present(store.latest("t")).pending_writes) == 1
        assert seqs(store.events_after("t", 6, 100)) == [7, 8, 9, 10]
        expect(ReplayUnavailable, lambda: store.events_after("t", 5, 10), thread_id="t", earliest_seq=7)
        expect(ReplayUnavailable, lambda: store.events_after("t", 0, 10), earliest_seq=7)
        store.prune("t", RetentionPolicy(max_checkpoints=1))
        assert ids_of(store.history("t", limit=10)) == ["c5"]
        expect(ReplayUnavailable, lambda: store.events_after("t", 7, 10), earliest_seq=9)
        writer = Writer(store, harness, "t", holder="run-2")
        assert seqs(writer.emit(1)) == [11]

    def test_prune_by_age_uses_the_store_clock_not_producer_times(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        # On a store with a real clock, a loaded machine may take longer than max_age between c3's commit and the
        # prune; that try proves nothing and is made again on a new thread with a wider margin.
        for attempt in range(1, 4):
            thread, margin = f"t{attempt}", attempt * SHORT
            writer = Writer(store, harness, thread)
            future = harness.clock.now() + timedelta(days=5)
            past = harness.clock.now() - timedelta(days=5)
            writer.step("c1", events=1, created_at=future, event_timestamp=future)  # look young, are old
            writer.step("c2", events=1, created_at=future, event_timestamp=future)
            harness.advance(harness.tick * (margin + 1))
            young_from = harness.clock.now()
            writer.step("c3", events=1, created_at=past, event_timestamp=past)  # look old, are young
            writer.step("c4", events=1, created_at=past, event_timestamp=past)
            store.prune(thread, RetentionPolicy(max_age=harness.tick * margin))
            if harness.clock.now() - young_from < harness.tick * margin:
                break
        assert ids_of(store.history(thread, limit=10)) == ["c4", "c3"]
        assert seqs(store.events_after(thread, 2, 10)) == [3, 4]
        expect(ReplayUnavailable, lambda: store.events_after(thread, 0, 10), earliest_seq=3)

    def test_prune_by_age_keeps_the_latest_but_may_drop_its_events(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1", events=1)
        writer.step("c2", events=2, pending=[PendingWrite(checkpoint_id="c2", task_id="t", node_id="n")])
        harness.advance(harness.tick * PAST_SHORT)
        store.prune("t", RetentionPolicy(max_age=harness.tick))
        assert ids_of(store.history("t", limit=10)) == ["c2"]
        assert len(present(store.latest("t")).pending_writes) == 1
        assert store.events_after("t", 3, 10) == []
        expect(ReplayUnavailable, lambda: store.events_after("t", 0, 10), earliest_seq=4)
        assert seqs(writer.emit(1)) == [4]

    def test_prune_by_event_count(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1", events=6)
        store.prune("t", RetentionPolicy(max_events=2))
        assert seqs(store.events_after("t", 4, 10)) == [5, 6]
        expect(ReplayUnavailable, lambda: store.events_after("t", 3, 10), earliest_seq=5)
        store.prune("t", RetentionPolicy(max_events=5))  # the floor never moves back
        expect(ReplayUnavailable, lambda: store.events_after("t", 3, 10), earliest_seq=5)
        store.prune("t", RetentionPolicy(max_events=0))
        assert store.events_after("t", 6, 10) == []
        expect(ReplayUnavailable, lambda: store.events_after("t", 5, 10), earliest_seq=7)
        assert ids_of(store.history("t", limit=10)) == ["c1"]
        assert seqs(writer.emit(1)) == [7]

    def test_prune_that_keeps_everything_changes_nothing(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1", events=2)
        writer.step("c2", events=2)
        harness.advance(harness.tick * PAST_SHORT)
        before = snapshot(store, ["t"])
        store.prune("t", RetentionPolicy())
        store.prune("t", RetentionPolicy(max_checkpoints=5, max_events=10, max_age=harness.tick * LIVE))
        store.prune("unknown", RetentionPolicy(max_checkpoints=1, max_events=0))
        assert snapshot(store, ["t"]) == before
        assert store.latest("unknown") is None

    def test_the_largest_valid_policies_and_durations_work(self, harness: StoreHarness, store: Checkpointer) -> None:
        # Found by hostile testing: valid values at the edges of their ranges are kept, not refused by a driver.
        writer = Writer(store, harness, "t")
        writer.step("c1", events=2)
        writer.step("c2", events=2)
        before = snapshot(store, ["t"])
        huge = RetentionPolicy(max_checkpoints=2**62, max_events=2**62, max_age=timedelta(days=36_500))
        store.prune("t", huge)
        sweep_all(store, SweepPolicy(retention=huge, tombstone_age=timedelta(days=36_500)))
        assert snapshot(store, ["t"]) == before
        store.renew("t", writer.token, timedelta(days=36_500))
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="r", ttl=timedelta(days=36_500))))
        store.release("t", writer.token)
        claim = store.claim("t", ClaimRequest(holder="r", ttl=timedelta(days=36_500)))
        store.release("t", claim.token)
        store.compact_events("t", 2**63 - 1)
        assert store.events_after("t", 2**63 - 1, 1) == []

    # -- sweep ---------------------------------------------------------------------------

    def test_sweep_pages_every_thread_including_tombstones(self, harness: StoreHarness, store: Checkpointer) -> None:
        for name in ("s0", "s1", "s2", "s3", "s4"):
            Writer(store, harness, name).step(f"{name}-c1")
        gone = Writer(store, harness, "s5")
        gone.emit(2)
        gone.delete()
        guard = RecordingGuard()
        pages = sweep_all(store, SweepPolicy(batch_size=2), guard)
        visited = [thread_id for page in pages for thread_id in page.visited]
        assert visited == ["s0", "s1", "s2", "s3", "s4", "s5"]
        for page in pages[:-1]:
            assert len(page.visited) == 2 and page.next == page.visited[-1]
        assert pages[-1].next is None
        assert all(not page.pruned and not page.reclaimed for page in pages)
        assert guard.calls == [page.visited for page in pages if page.visited]
        later = store.sweep(SweepPolicy(batch_size=10), None, after="s2-gone")  # after an id the store lacks
        assert later.visited == ("s3", "s4", "s5") and later.next is None
        assert store.sweep(SweepPolicy(batch_size=10), None, after="s5").visited == ()

    def test_sweep_prunes_by_retention_like_prune(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "a")
        for index in range(1, 5):
            writer.step(f"c{index}", events=1)
        Writer(store, harness, "b").step("b1", events=1)
        pages = sweep_all(store, SweepPolicy(retention=RetentionPolicy(max_checkpoints=2)))
        assert {t for page in pages for t in page.pruned} == {"a"}
        assert ids_of(store.history("a", limit=10)) == ["c4", "c3"]
        expect(ReplayUnavailable, lambda: store.events_after("a", 0, 10), earliest_seq=3)
        assert ids_of(store.history("b", limit=10)) == ["b1"]

    def test_sweep_guard_keeps_the_newest_checkpoint_of_protected_runs(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        for name in ("g", "h"):
            writer = Writer(store, harness, name)
            for index, run in enumerate(["run-a", "run-b", "run-a", "run-c"], start=1):
                writer.step(f"{name}{index}", run_id=run, events=1)  # events 1, 2, 3, 4
        guard = RecordingGuard({"g": {"run-b"}, "h": {"run-a"}})
        sweep_all(store, SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), guard)
        assert ids_of(store.history("g", limit=10)) == ["g4", "g2"]
        assert ids_of(store.history("h", limit=10)) == ["h4", "h3"]
        # The floor follows the policy alone: the events before the newest kept by policy go.
        expect(ReplayUnavailable, lambda: store.events_after("g", 1, 10), earliest_seq=4)
        assert seqs(store.events_after("g", 3, 10)) == [4]
        assert present(store.lookup_run("g", ["run-b"])).id == "g2"
        assert store.lookup_run("g", ["run-a"]) is None

    @pytest.mark.parametrize(
        "error",
        [RuntimeError("guard down"), ProcessingError("guard", "unreachable")],
        ids=["foreign-error", "threadloom-error"],
    )
    def test_sweep_guard_failure_changes_nothing(
        self, harness: StoreHarness, store: Checkpointer, error: BaseException
    ) -> None:
        writer = Writer(store, harness, "a")
        for index in range(1, 4):
            writer.step(f"c{index}", events=1)
        gone = Writer(store, harness, "b")
        gone.emit(1)
        gone.delete()
        harness.advance(harness.tick * PAST_SHORT)
        before = snapshot(store, ["a", "b"])
        policy = SweepPolicy(retention=RetentionPolicy(max_checkpoints=1, max_events=0), tombstone_age=harness.tick)
        with pytest.raises(ProcessingError) as info:
            store.sweep(policy, RecordingGuard(error=error))
        if isinstance(error, ProcessingError):
            assert info.value is error or (info.value.operation, info.value.message) == ("guard", "unreachable")
        else:
            assert info.value.operation == "sweep"
        assert snapshot(store, ["a", "b"]) == before
        expect(ThreadDeleted, lambda: store.events_after("b", 1, 10), first_seq=3)  # the tombstone is still there
        pages = sweep_all(store, policy)
        assert reclaimed(pages) == {"b"}

    def test_sweep_reclaims_tombstones_strictly_older_than_tombstone_age(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(3)
        writer.delete()
        if harness.database_clock:
            assert reclaimed(sweep_all(store, SweepPolicy(tombstone_age=harness.tick * LIVE))) == set()
            harness.advance(harness.tick * 2)
        else:
            harness.advance(harness.tick * 2)
            assert reclaimed(sweep_all(store, SweepPolicy(tombstone_age=harness.tick * 2))) == set()  # exactly: kept
            harness.advance(timedelta(microseconds=1))
        assert reclaimed(sweep_all(store, SweepPolicy())) == set()  # no tombstone_age: kept
        pages = sweep_all(
            store, SweepPolicy(tombstone_age=harness.tick if harness.database_clock else harness.tick * 2)
        )
        assert reclaimed(pages) == {"t"}
        assert "t" not in [thread_id for page in sweep_all(store, SweepPolicy()) for thread_id in page.visited]

    def test_sweep_keeps_protected_and_reused_tombstones(self, harness: StoreHarness, store: Checkpointer) -> None:
        for name in ("p", "q"):
            writer = Writer(store, harness, name)
            writer.emit(1)
            writer.delete()
        Writer(store, harness, "q").step("q1")  # stored under the id since
        harness.advance(harness.tick * PAST_SHORT)
        policy = SweepPolicy(tombstone_age=harness.tick)
        assert reclaimed(sweep_all(store, policy, RecordingGuard({"p": set()}))) == set()
        assert present(store.latest("q")).checkpoint.id == "q1"
        assert reclaimed(sweep_all(store, policy)) == {"p"}

    def test_reclamation_mark_numbers_new_threads_past_the_reclaimed_log(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "r")
        writer.emit(3)
        writer.delete()  # the log ended at 3: its tombstone's first number is 5
        harness.advance(harness.tick * PAST_SHORT)
        assert reclaimed(sweep_all(store, SweepPolicy(tombstone_age=harness.tick))) == {"r"}
        for after_seq in (1, 2, 3):
            expect(ThreadDeleted, lambda: store.events_after("r", after_seq, 10), thread_id="r", first_seq=5)
        assert store.events_after("r", 0, 10) == []
        again = Writer(store, harness, "r", holder="run-2")
        assert seqs(again.emit(2)) == [5, 6]
        fresh = Writer(store, harness, "brand-new")
        assert seqs(fresh.emit(1)) == [5]
        expect(ThreadDeleted, lambda: store.events_after("r", 2, 10), first_seq=5)
        assert seqs(store.events_after("r", 4, 10)) == [5, 6]

