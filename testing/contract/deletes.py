"""The contract suite, one rule group:
Deletes and tombstones, effects and run lookup (delete_thread, effect, lookup_run).
"""

from __future__ import annotations

from datetime import timedelta

from threadloom.domain.errors import (
    StaleClaim,
    ThreadDeleted,
)
from threadloom.domain.values import (
    ClaimRequest,
    EffectRecord,
    PendingWrite,
    RetentionPolicy,
    ThreadQuery,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    LIVE,
    Writer,
    expect,
    present,
    seqs,
    snapshot,
)
from threadloom.testing.harness import StoreHarness


class DeletesContract:
    """Deletes and tombstones, effects and run lookup (delete_thread, effect, lookup_run).

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- deletes and tombstones (delete_thread) ---------------------------------------------------

    def test_delete_is_fenced_by_the_claim(self, harness: StoreHarness, store: Checkpointer) -> None:
        expect(StaleClaim, lambda: store.delete_thread("unknown", 3), thread_id="unknown", token=3, current=None)
        writer = Writer(store, harness, "t")
        writer.step("c1", events=2)
        writer.release()
        before = snapshot(store, ["t"])
        expect(StaleClaim, lambda: store.delete_thread("t", writer.token), token=writer.token, current=None)
        assert snapshot(store, ["t"]) == before
        again = Writer(store, harness, "t", holder="run-2")
        before = snapshot(store, ["t"])
        expect(StaleClaim, lambda: store.delete_thread("t", writer.token), current=again.token)
        assert snapshot(store, ["t"]) == before

    def test_delete_fence_is_checked_after_the_own_claim(self, harness: StoreHarness, store: Checkpointer) -> None:
        root = Writer(store, harness, "root")
        root_stale = root.token
        root.release()
        root = Writer(store, harness, "root")
        child = Writer(store, harness, "child")
        child.step("c1", events=1)
        before = snapshot(store, ["child", "root"])
        expect(
            StaleClaim,
            lambda: store.delete_thread("child", child.token + 100, fence=("root", root_stale)),
            thread_id="child",
        )
        expect(
            StaleClaim,
            lambda: store.delete_thread("child", child.token, fence=("root", root_stale)),
            thread_id="root",
            token=root_stale,
            current=root.token,
        )
        expect(
            StaleClaim,
            lambda: store.delete_thread("child", child.token, fence=("nobody", 1)),
            thread_id="nobody",
            current=None,
        )
        assert snapshot(store, ["child", "root"]) == before
        store.delete_thread("child", child.token, fence=("root", root.token))
        assert store.latest("child") is None

    def test_delete_removes_everything_and_leaves_a_tombstone(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        now = harness.clock.now()
        writer.step(
            "c1",
            events=2,
            run_id="run-x",
            effects=[EffectRecord(key="k1", run_id="run-x", recorded_at=now)],
            pending=[PendingWrite(checkpoint_id="c1", task_id="t", node_id="n")],
        )
        writer.step("c2", events=1, metadata={"m": "v"})
        writer.delete()
        assert store.latest("t") is None
        assert store.history("t", limit=10) == []
        assert store.checkpoint("t", "c1") is None
        assert store.effect("t", "k1") is None
        assert store.lookup_run("t", ["run-x", "run-1"]) is None
        assert store.threads(ThreadQuery(tenant_id="acme")).items == ()
        expect(StaleClaim, lambda: store.renew("t", writer.token, harness.tick), current=None)
        expect(StaleClaim, lambda: writer.emit(1), current=None)
        # The log ended at 3: reads inside it are ThreadDeleted, the next incarnation starts at 5.
        for after_seq in (1, 2, 3):
            expect(ThreadDeleted, lambda: store.events_after("t", after_seq, 10), thread_id="t", first_seq=5)
        assert store.events_after("t", 0, 10) == []
        assert store.events_after("t", 4, 10) == []
        claim = store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick * LIVE, tenant_id="acme"))
        assert claim.taken_over_from is None and claim.token > writer.token

    def test_tombstone_skips_one_number_and_a_second_delete_does_not_move_it(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        first = Writer(store, harness, "t")
        first.emit(3)
        first.delete()
        second = Writer(store, harness, "t", holder="run-2")
        second.delete()  # nothing numbered since: the numbering stays
        third = Writer(store, harness, "t", holder="run-3")
        assert seqs(third.step("c1", events=2)) == [5, 6]
        assert seqs(store.events_after("t", 0, 10)) == [5, 6]
        assert seqs(store.events_after("t", 4, 10)) == [5, 6]
        expect(ThreadDeleted, lambda: store.events_after("t", 3, 10), first_seq=5)
        third.delete()
        fourth = Writer(store, harness, "t", holder="run-4")
        assert seqs(fourth.emit(1)) == [8]
        for after_seq in (1, 3, 5, 6):
            expect(ThreadDeleted, lambda: store.events_after("t", after_seq, 10), first_seq=8)
        assert seqs(store.events_after("t", 7, 10)) == [8]

    def test_delete_of_a_thread_without_events_keeps_numbering_from_one(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        first = Writer(store, harness, "t")
        first.step("c1")
        first.delete()
        second = Writer(store, harness, "t")
        assert seqs(second.emit(1)) == [1]

    # -- effects and run lookup (effect, lookup_run) -------------------------------------------------------

    def test_lookup_run_is_newest_by_position(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        base = harness.clock.now()
        for index, run in enumerate(["run-a", "run-b", "run-a", "run-c"], start=1):
            writer.step(f"c{index}", run_id=run, created_at=base - timedelta(days=index))  # created_at runs back
        assert present(store.lookup_run("t", ["run-a"])).id == "c3"
        assert present(store.lookup_run("t", ("run-a", "run-b"))).id == "c3"
        assert present(store.lookup_run("t", {"run-b"})).id == "c2"
        assert present(store.lookup_run("t", frozenset({"run-c", "run-a"}))).id == "c4"
        assert store.lookup_run("t", ["run-z"]) is None
        assert store.lookup_run("t", []) is None
        assert store.lookup_run("unknown", ["run-a"]) is None
        assert store.lookup_run("t", ["run-a"]) == store.checkpoint("t", "c3")
        store.prune("t", RetentionPolicy(max_checkpoints=1))
        assert store.lookup_run("t", ["run-a", "run-b"]) is None
        assert present(store.lookup_run("t", ["run-c"])).id == "c4"

