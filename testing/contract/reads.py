"""The contract suite: History, children, events and waiting for events (rules 4, 5, 11)."""

from __future__ import annotations

import concurrent.futures
import threading
from datetime import timedelta
from typing import Any

import pytest

from threadloom.domain.errors import (
    CancelledError,
    CheckpointNotFound,
    ReplayUnavailable,
    ThreadDeleted,
    ValidationError,
)
from threadloom.domain.values import (
    CheckpointOrigin,
    CheckpointPage,
    Commit,
    RetentionPolicy,
    SweepPolicy,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    PAST_SHORT,
    RESULT_TIMEOUT_S,
    WAIT,
    Writer,
    expect,
    ids_of,
    present,
    reclaimed,
    seqs,
    spawn_child,
    sweep_all,
)
from threadloom.testing.harness import StoreHarness


class ReadsContract:
    """History, children, events and waiting for events (rules 4, 5, 11).

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- history (history, checkpoint, latest) -----------------------------------------------------

    def test_history_pages_newest_first_by_position(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        base = harness.clock.now()
        for index in range(1, 8):  # producer times run backwards: order is by place, never by created_at
            writer.step(f"c{index}", created_at=base - timedelta(days=index))
        assert ids_of(store.history("t", limit=3)) == ["c7", "c6", "c5"]
        assert ids_of(store.history("t", limit=3, before="c5")) == ["c4", "c3", "c2"]
        assert ids_of(store.history("t", limit=3, before="c2")) == ["c1"]
        assert store.history("t", limit=3, before="c1") == []
        assert ids_of(store.history("t", limit=1000)) == [f"c{i}" for i in range(7, 0, -1)]
        full = store.history("t", limit=1000)
        assert full[0] == present(store.latest("t")).checkpoint
        assert all(cp.fencing_token == writer.token and cp.thread_id == "t" for cp in full)
        assert full[-1].created_at == base - timedelta(days=1)
        expect(
            CheckpointNotFound, lambda: store.history("t", limit=3, before="nope"), thread_id="t", checkpoint_id="nope"
        )
        assert store.history("unknown", limit=3) == []
        expect(
            CheckpointNotFound,
            lambda: store.history("unknown", limit=3, before="c1"),
            thread_id="unknown",
            checkpoint_id="c1",
        )
        Writer(store, harness, "claimed")  # a claim alone holds no checkpoint
        assert store.history("claimed", limit=3) == []
        expect(CheckpointNotFound, lambda: store.history("claimed", limit=3, before="c1"), thread_id="claimed")

    # -- search_history ------------------------------------------------------------------------------

    def test_search_history_matches_every_key_with_the_same_string(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        tagged = {
            "c1": {"source": "input", "step": "0"},
            "c2": {"source": "loop", "step": "1"},
            "c3": {},
            "c4": {"source": "loop", "step": "2", "user": "ana"},
            "c5": {"source": "Loop", "step": "3"},
            "c6": {"source": "loop ", "step": "1.0"},
            "c7": {"source": "loop", "step": "4", 'odd "key".$[0]': "é \u2028 \"q\""},
        }
        for cp_id, metadata in tagged.items():
            writer.tagged(cp_id, metadata)

        def found(metadata: dict[str, str], **options: Any) -> list[str]:
            page = store.search_history("t", metadata=metadata, limit=options.pop("limit", 10), **options)
            assert page.next is None
            return ids_of(page.items)

        assert found({"source": "loop"}) == ["c7", "c4", "c2"]  # exact strings: "Loop" and "loop " differ
        assert found({"source": "loop", "step": "1"}) == ["c2"]  # every key: "1.0" is not "1"
        assert found({"user": "ana"}) == ["c4"]
        assert found({"user": ""}) == [] and found({"": "ana"}) == []
        assert found({'odd "key".$[0]': "é \u2028 \"q\""}) == ["c7"]
        assert found({"source": "loop", "missing": "x"}) == []
        assert found({}) == [f"c{index}" for index in range(7, 0, -1)]  # an empty filter matches every one
        assert found({"source": "loop"}, before="c4") == ["c2"]
        assert found({"source": "loop"}, before="c2") == []
        page = store.search_history("t", metadata={"source": "loop"}, limit=2)
        assert ids_of(page.items) == ["c7", "c4"] and page.next == "c4"
        last = store.search_history("t", metadata={"source": "loop"}, limit=2, before=page.next)
        assert ids_of(last.items) == ["c2"] and last.next is None
        assert all(cp.fencing_token == writer.token and cp.thread_id == "t" for cp in page.items)
        assert page.items[0] == present(store.latest("t")).checkpoint
        assert page.items[0].metadata == tagged["c7"]
        assert store.search_history("unknown", metadata={}, limit=3) == CheckpointPage()
        expect(
            CheckpointNotFound,
            lambda: store.search_history("t", metadata={}, limit=3, before="nope"),
            thread_id="t",
            checkpoint_id="nope",
        )
        Writer(store, harness, "claimed")  # a claim alone holds no checkpoint
        assert store.search_history("claimed", metadata={"source": "loop"}, limit=3) == CheckpointPage()

    def test_search_history_examines_at_most_scan_checkpoints_per_call(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        for index in range(1, 11):
            writer.tagged(f"c{index}", {"even": "yes" if index % 2 == 0 else "no", "third": str(index % 3)})

        def page(metadata: dict[str, str], limit: int, scan: int, before: str | None = None) -> tuple[list[str], Any]:
            found = store.search_history("t", metadata=metadata, limit=limit, before=before, scan=scan)
            return ids_of(found.items), found.next

        # the window is the ``scan`` checkpoints below ``before``; next names its oldest while older ones remain
        assert page({"third": "0"}, 10, 3) == (["c9"], "c8")
        assert page({"third": "0"}, 10, 3, "c8") == (["c6"], "c5")
        assert page({"third": "0"}, 10, 3, "c5") == (["c3"], "c2")
        assert page({"third": "0"}, 10, 3, "c2") == ([], None)
        assert page({"third": "0", "even": "yes"}, 10, 4) == ([], "c7")  # nothing in the window, more below
        assert page({"even": "yes"}, 1, 4) == (["c10"], "c10")  # limit first: the next page starts below it
        assert page({"even": "yes"}, 2, 4) == (["c10", "c8"], "c7")
        assert page({}, 3, 3, "c4") == (["c3", "c2", "c1"], None)  # the window reached the first checkpoint
        assert page({}, 2, 3, "c4") == (["c3", "c2"], "c2")
        assert page({}, 5, 1000) == (["c10", "c9", "c8", "c7", "c6"], "c6")
        for metadata in ({"even": "yes"}, {"third": "1"}, {"even": "no", "third": "2"}, {"none": "x"}, {}):
            for limit, scan in ((1, 1), (2, 3), (3, 2), (10, 10), (4, 1000)):
                collected: list[str] = []
                before: str | None = None
                calls = 0
                while True:
                    items, before = page(metadata, limit, scan, before)
                    collected += items
                    calls += 1
                    if before is None:
                        break
                assert calls <= 10 // min(limit, scan) + 2
                expected = [
                    f"c{index}" for index in range(10, 0, -1)
                    if {"even": "yes" if index % 2 == 0 else "no", "third": str(index % 3)}.items() >= metadata.items()
                ]  # fmt: skip
                assert collected == expected, (metadata, limit, scan)

    def test_search_history_reads_metadata_through_a_sibling_and_after_a_reopen(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        for cp_id, value in (("c1", "a"), ("c2", "b"), ("c3", "a"), ("c4", "a")):
            writer.tagged(cp_id, {"k": value, "j": cp_id})
        store.prune("t", RetentionPolicy(max_checkpoints=3))
        assert ids_of(harness.sibling().search_history("t", metadata={"k": "a"}, limit=10).items) == ["c4", "c3"]
        if harness.reopenable:
            store = harness.reopen(store)
        page = store.search_history("t", metadata={"k": "a"}, limit=10)
        assert ids_of(page.items) == ["c4", "c3"] and page.items[1].metadata == {"k": "a", "j": "c3"}

    def test_checkpoint_and_latest_reads(self, harness: StoreHarness, store: Checkpointer) -> None:
        assert store.latest("t") is None
        writer = Writer(store, harness, "t")
        assert store.latest("t") is None  # a claim alone is no checkpoint
        writer.step("c1")
        writer.step("c2")
        assert present(store.checkpoint("t", "c1")).id == "c1"
        assert store.checkpoint("t", "c2") == present(store.latest("t")).checkpoint
        assert store.checkpoint("t", "c3") is None
        assert store.checkpoint("other", "c1") is None
        assert present(store.latest("t")).checkpoint.parent == "c1"

    # -- children -------------------------------------------------------------------------------

    def test_children_page_oldest_first_by_first_commit(self, harness: StoreHarness, store: Checkpointer) -> None:
        Writer(store, harness, "P").step("p1")
        for child in ("kid-2", "kid-1", "kid-3", "kid-0"):
            spawn_child(harness, store, child, "P")
            harness.advance(harness.tick)
        assert store.children("P", limit=10) == ["kid-2", "kid-1", "kid-3", "kid-0"]
        assert store.children("P", limit=2) == ["kid-2", "kid-1"]
        assert store.children("P", limit=2, after="kid-1") == ["kid-3", "kid-0"]
        assert store.children("P", limit=2, after="kid-0") == []
        assert store.children("childless", limit=10) == []
        assert store.children("kid-2", limit=10) == []

    def test_children_follow_the_latest_origin(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: spawn_child(harness, store, name, "P") for name in ("k1", "k2", "k3")}
        kids["k2"].step("k2-c2", origin=CheckpointOrigin(parent_thread="Q"))  # re-parented
        kids["k3"].step("k3-c2", origin=None)  # no parent any more
        assert store.children("P", limit=10) == ["k1"]
        assert store.children("Q", limit=10) == ["k2"]
        kids["k3"].step("k3-c3", origin=CheckpointOrigin(parent_thread="P"))  # back: keeps its first place
        assert store.children("P", limit=10) == ["k1", "k3"]
        assert store.children("P", limit=10, after="k1") == ["k3"]

    def test_children_limit_below_one_reads_none(self, harness: StoreHarness, store: Checkpointer) -> None:
        spawn_child(harness, store, "k1", "P")
        assert store.children("P", limit=0) == []
        assert store.children("P", limit=-3) == []

    def test_deleted_child_is_not_listed_but_keeps_its_place(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: spawn_child(harness, store, name, "P", events=1) for name in ("k1", "k2", "k3")}
        kids["k2"].delete()
        assert store.children("P", limit=10) == ["k1", "k3"]
        assert store.children("P", limit=10, after="k2") == ["k3"]
        assert store.children("P", limit=1) == ["k1"]
        assert store.children("P", limit=1, after="k1") == ["k3"]

    def test_children_refuse_an_unknown_after(self, harness: StoreHarness, store: Checkpointer) -> None:
        spawn_child(harness, store, "k1", "P")
        spawn_child(harness, store, "other", "Q")
        expect(ValidationError, lambda: store.children("P", limit=10, after="never"), field="after")
        expect(ValidationError, lambda: store.children("P", limit=10, after="other"), field="after")
        expect(ValidationError, lambda: store.children("nobody", limit=10, after="k1"), field="after")

    def test_reclaimed_child_tombstone_loses_its_place(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: spawn_child(harness, store, name, "P", events=1) for name in ("k1", "k2", "k3")}
        kids["k2"].delete()
        harness.advance(harness.tick * PAST_SHORT)
        pages = sweep_all(store, SweepPolicy(tombstone_age=harness.tick))
        assert "k2" in reclaimed(pages)
        expect(ValidationError, lambda: store.children("P", limit=10, after="k2"), field="after")
        assert store.children("P", limit=10) == ["k1", "k3"]

    # -- events (events_after, compact_events) ------------------------------------------------------

    def test_events_are_numbered_and_read_ascending(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        assert seqs(writer.step("c1", events=3)) == [1, 2, 3]
        assert seqs(writer.emit(2)) == [4, 5]
        assert seqs(store.events_after("t", 0, 100)) == [1, 2, 3, 4, 5]
        assert seqs(store.events_after("t", 2, 2)) == [3, 4]
        assert seqs(store.events_after("t", 4, 100)) == [5]
        assert store.events_after("t", 5, 100) == []
        assert store.events_after("t", 50, 100) == []
        assert store.events_after("unknown", 0, 100) == []
        assert all(record.thread_id == "t" and record.token == writer.token for record in store.events_after("t", 0, 9))

    def test_compaction_raises_the_replay_floor(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(5)
        store.compact_events("t", 3)
        expect(ReplayUnavailable, lambda: store.events_after("t", 0, 10), thread_id="t", earliest_seq=3)
        expect(ReplayUnavailable, lambda: store.events_after("t", 1, 10), earliest_seq=3)
        assert seqs(store.events_after("t", 2, 10)) == [3, 4, 5]
        store.compact_events("t", 2)  # the floor never moves back
        expect(ReplayUnavailable, lambda: store.events_after("t", 1, 10), earliest_seq=3)
        store.compact_events("t", 0)
        assert seqs(store.events_after("t", 2, 10)) == [3, 4, 5]
        store.compact_events("t", 100)  # never past the next number
        assert store.events_after("t", 5, 10) == []
        expect(ReplayUnavailable, lambda: store.events_after("t", 4, 10), earliest_seq=6)
        assert seqs(writer.emit(1)) == [6]  # numbers are never reused
        assert seqs(store.events_after("t", 5, 10)) == [6]
        store.compact_events("unknown", 5)  # nothing there: fine
        assert store.events_after("unknown", 0, 10) == []

    def test_await_errors_are_events_after_errors(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(4)
        store.compact_events("t", 3)
        expect(ReplayUnavailable, lambda: store.await_events_after("t", 0, 10, timedelta(0)), earliest_seq=3)
        writer.delete()
        expect(ThreadDeleted, lambda: store.await_events_after("t", 2, 10, timedelta(0)), thread_id="t", first_seq=6)

    # -- waiting for events (await_events_after) -------------------------------------------------

    def test_await_returns_at_once_when_events_exist(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        records = writer.emit(3)
        assert store.await_events_after("t", 0, 10, WAIT) == records
        assert store.await_events_after("t", 1, 1, WAIT) == records[1:2]

    def test_await_times_out_with_nothing(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(1)
        assert store.await_events_after("t", 1, 10, timedelta(milliseconds=150)) == []
        assert store.await_events_after("unknown", 0, 10, timedelta(milliseconds=50)) == []
        assert store.await_events_after("t", 1, 10, timedelta(0)) == []

    def _await_in_thread(
        self, on: Checkpointer, thread_id: str, after_seq: int, **kw: Any
    ) -> concurrent.futures.Future:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        future = pool.submit(on.await_events_after, thread_id, after_seq, 100, kw.pop("timeout", WAIT), **kw)
        pool.shutdown(wait=False)
        return future

    def test_await_wakes_on_a_commit_from_another_thread(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(1)
        waiting = self._await_in_thread(store, "t", 1)
        threading.Event().wait(0.1)  # let it start waiting (it returns the events either way)
        records = writer.emit(2)
        assert waiting.result(timeout=RESULT_TIMEOUT_S) == records

    def test_await_wakes_on_a_commit_through_a_sibling(self, harness: StoreHarness, store: Checkpointer) -> None:
        if not harness.shared:
            pytest.skip("the harness has no second store over the same storage")
        sibling = harness.sibling()
        writer = Writer(store, harness, "t")
        waiting = self._await_in_thread(sibling, "t", 0)
        threading.Event().wait(0.1)
        records = writer.emit(2)
        assert waiting.result(timeout=RESULT_TIMEOUT_S) == records
        back = self._await_in_thread(store, "t", 2)
        threading.Event().wait(0.1)
        more = sibling.commit("t", Commit(token=writer.token, events=writer.drafts(1)))
        assert back.result(timeout=RESULT_TIMEOUT_S) == more

    def test_await_is_cancelled_promptly_and_the_store_still_works(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        cancel = threading.Event()
        waiting = self._await_in_thread(store, "t", 0, timeout=timedelta(seconds=120), cancel=cancel)
        threading.Event().wait(0.1)
        cancel.set()
        with pytest.raises(CancelledError) as info:
            waiting.result(timeout=RESULT_TIMEOUT_S)  # far sooner than its own timeout
        assert info.value.operation == "await_events_after"
        already = threading.Event()
        already.set()
        expect(CancelledError, lambda: store.await_events_after("t", 0, 10, WAIT, cancel=already))
        records = writer.emit(1)
        assert store.events_after("t", 0, 10) == records
        assert store.await_events_after("t", 0, 10, WAIT, cancel=threading.Event()) == records

    def test_delete_wakes_a_waiter(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.emit(3)
        waiting = self._await_in_thread(store, "t", 3)
        threading.Event().wait(0.1)
        writer.delete()
        with pytest.raises(ThreadDeleted) as info:
            waiting.result(timeout=RESULT_TIMEOUT_S)
        assert (info.value.thread_id, info.value.first_seq) == ("t", 5)

