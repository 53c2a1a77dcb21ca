"""The contract suite: Commits (commit)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs

from threadloom.domain.errors import (
    CheckpointConflict,
    InvalidCommit,
    StaleClaim,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import (
    Checkpoint,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    EventRecord,
    PendingWrite,
    ThreadQuery,
)
from threadloom.persistence.base import DEFAULT_MAX_JSON_SIZE, Checkpointer
from threadloom.persistence.encoded import encode_checkpoint, encode_effect, encode_event, encode_pending_write
from threadloom.testing.contract._support import (
    COMPLETED,
    FAILED,
    LIVE,
    RUNNING,
    SUSPENDED,
    Writer,
    expect,
    ids_of,
    present,
    seqs,
    snapshot,
)
from threadloom.testing.harness import StoreHarness


class CommitsContract:
    """Commits.

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- commits -------------------------------------------------------------------------

    def test_commit_returns_what_a_later_read_returns(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        when = harness.clock.now() - timedelta(days=3)
        drafts = [
            EventDraft(
                run_id="run-1",
                type="started",
                timestamp=when,
                payload={"a": [1, 2.5, None, True]},
                checkpoint_id="c1",
                task_id="task-1",
                node_id="node-1",
            ),
            EventDraft(run_id="run-1", type="text", timestamp=when + timedelta(microseconds=7), payload="héllo ☃"),
            EventDraft(run_id="run-1", type="empty", timestamp=when),
        ]
        cp = writer.checkpoint(
            "c1",
            state={"messages": [{"role": "user", "content": "hi"}], "n": 1},
            origin=None,
            graph_id="chat",
            metadata={"source": "test"},
        )
        pending = [PendingWrite(checkpoint_id="c1", task_id="task-1", node_id="node-1", payload={"out": 1})]
        effect = EffectRecord(
            key="k1", run_id="run-1", recorded_at=when, result={"charged": 3}, checkpoint_id="c1", task_id="task-1"
        )
        records = store.commit(
            "t", Commit(token=writer.token, checkpoint=cp, pending_writes=pending, events=drafts, effects=[effect])
        )
        assert seqs(records) == [1, 2, 3]
        for record, draft in zip(records, drafts, strict=True):
            assert record == EventRecord.of(draft, thread_id="t", seq=record.seq, token=writer.token)
        assert store.events_after("t", 0, 100) == records
        stored = store.latest("t")
        assert stored is not None
        assert stored.checkpoint == attrs.evolve(cp, fencing_token=writer.token)
        assert stored.pending_writes == tuple(pending)
        assert store.checkpoint("t", "c1") == stored.checkpoint
        assert store.history("t", limit=5) == [stored.checkpoint]
        assert store.effect("t", "k1") == effect

    def test_commit_stamps_the_token_on_the_checkpoint(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1")
        explicit = writer.checkpoint("c2")
        writer.commit(checkpoint=attrs.evolve(explicit, fencing_token=writer.token))
        assert present(store.checkpoint("t", "c1")).fencing_token == writer.token
        assert present(store.latest("t")).checkpoint.fencing_token == writer.token

    def test_empty_commit_changes_nothing(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1", events=1)
        before = snapshot(store, ["t"])
        assert writer.commit() == []
        assert snapshot(store, ["t"]) == before

    def test_commit_without_a_claim_is_stale(self, harness: StoreHarness, store: Checkpointer) -> None:
        cp = Checkpoint(id="c1", parent=None, thread_id="t", run_id="r", status=RUNNING, created_at=harness.clock.now())
        expect(
            StaleClaim, lambda: store.commit("t", Commit(token=5, checkpoint=cp)), thread_id="t", token=5, current=None
        )
        assert store.latest("t") is None
        other = store.claim("other", ClaimRequest(holder="r", ttl=harness.tick * LIVE))
        expect(StaleClaim, lambda: store.commit("t", Commit(token=other.token, checkpoint=cp)), current=None)
        assert store.latest("t") is None

    def test_commit_checks_in_order_and_writes_nothing_on_failure(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        first = store.claim("a", ClaimRequest(holder="run-0", ttl=harness.tick * LIVE))
        store.release("a", first.token)
        writer = Writer(store, harness, "a")
        writer.step(
            "c1", events=1, effects=[EffectRecord(key="k1", run_id="run-1", recorded_at=harness.clock.now(), result=1)]
        )
        writer.step("c2", events=1, pending=[PendingWrite(checkpoint_id="c2", task_id="t1", node_id="n1", payload=1)])
        fence_first = store.claim("f", ClaimRequest(holder="run-f", ttl=harness.tick * LIVE))
        store.release("f", fence_first.token)
        fence = store.claim("f", ClaimRequest(holder="run-f", ttl=harness.tick * LIVE))
        stale_own, stale_fence = first.token, fence_first.token
        now = harness.clock.now()
        extras: dict[str, Any] = dict(
            events=[EventDraft(run_id="run-1", type="x", timestamp=now)],
            effects=[EffectRecord(key="k-new", run_id="run-1", recorded_at=now, result="no")],
            metadata={"must": "not-land"},
        )
        misdirected = [PendingWrite(checkpoint_id="c1", task_id="t9", node_id="n9")]
        before = snapshot(store, ["a", "f"])

        def cp(cp_id: str, parent: str | None) -> Checkpoint:
            return writer.checkpoint(cp_id, parent=parent)

        cases: list[tuple[type[ThreadloomError], Commit, dict[str, Any]]] = [
            # own token first, whatever else is wrong
            (
                StaleClaim,
                Commit(
                    token=stale_own,
                    checkpoint=cp("c1", "c1x"),
                    fence=("f", stale_fence),
                    pending_writes=misdirected,
                    **extras,
                ),
                dict(thread_id="a", token=stale_own, current=writer.token),
            ),
            # then the fence
            (
                StaleClaim,
                Commit(
                    token=writer.token,
                    checkpoint=cp("c1", "c1x"),
                    fence=("f", stale_fence),
                    pending_writes=misdirected,
                    **extras,
                ),
                dict(thread_id="f", token=stale_fence, current=fence.token),
            ),
            (
                StaleClaim,
                Commit(token=writer.token, fence=("nobody", 3), **extras),
                dict(thread_id="nobody", token=3, current=None),
            ),
            # then the parent
            (
                CheckpointConflict,
                Commit(
                    token=writer.token,
                    checkpoint=cp("c1", "c1x"),
                    fence=("f", fence.token),
                    pending_writes=misdirected,
                    **extras,
                ),
                dict(thread_id="a", expected="c1x", actual="c2"),
            ),
            (
                CheckpointConflict,
                Commit(token=writer.token, checkpoint=cp("c3", None), **extras),
                dict(thread_id="a", expected=None, actual="c2"),
            ),
            # then a duplicate id
            (
                InvalidCommit,
                Commit(token=writer.token, checkpoint=cp("c1", "c2"), pending_writes=misdirected, **extras),
                dict(thread_id="a"),
            ),
            # then a pending write not naming the resulting latest
            (
                InvalidCommit,
                Commit(
                    token=writer.token,
                    checkpoint=cp("c3", "c2"),
                    pending_writes=[PendingWrite(checkpoint_id="c2", task_id="t", node_id="n")],
                    **extras,
                ),
                dict(thread_id="a"),
            ),
            (
                InvalidCommit,
                Commit(token=writer.token, pending_writes=misdirected, retract_turn=True, **extras),
                dict(thread_id="a"),
            ),
            # then retract_turn without a checkpoint
            (
                InvalidCommit,
                Commit(
                    token=writer.token,
                    retract_turn=True,
                    pending_writes=[PendingWrite(checkpoint_id="c2", task_id="t", node_id="n")],
                    **extras,
                ),
                dict(thread_id="a"),
            ),
        ]
        for error_type, commit, fields in cases:
            expect(error_type, lambda: store.commit("a", commit), **fields)
            assert snapshot(store, ["a", "f"]) == before, (error_type, commit)
        # A refused commit spends no number, and the thread's own claim still works.
        assert seqs(writer.emit(2)) == [3, 4]
        assert store.effect("a", "k-new") is None

    def test_fence_passes_with_the_other_threads_current_token(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        parent = Writer(store, harness, "parent")
        child = Writer(store, harness, "child")
        records = store.commit(
            "child",
            Commit(
                token=child.token,
                checkpoint=child.checkpoint("c1"),
                fence=("parent", parent.token),
                events=child.drafts(1),
            ),
        )
        assert seqs(records) == [1]
        assert present(store.latest("child")).checkpoint.id == "c1"
        parent.release()
        expect(
            StaleClaim,
            lambda: store.commit("child", Commit(token=child.token, fence=("parent", parent.token))),
            thread_id="parent",
            token=parent.token,
            current=None,
        )

    def test_pending_writes_are_replaced_by_a_checkpoint_and_appended_otherwise(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        w1 = PendingWrite(checkpoint_id="c1", task_id="t1", node_id="n1", payload=1)
        w2 = PendingWrite(checkpoint_id="c1", task_id="t2", node_id="n2", payload=[2])
        w3 = PendingWrite(checkpoint_id="c1", task_id="t3", node_id="n3", payload=None)
        writer.step("c1", pending=[w1])
        writer.commit(pending_writes=[w2, w3])
        assert present(store.latest("t")).pending_writes == (w1, w2, w3)
        w4 = PendingWrite(checkpoint_id="c2", task_id="t4", node_id="n4", payload={"x": 4})
        writer.step("c2", pending=[w4])
        assert present(store.latest("t")).pending_writes == (w4,)
        writer.step("c3")
        assert present(store.latest("t")).pending_writes == ()

    def test_pending_write_on_a_thread_without_checkpoint_is_invalid(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        expect(
            InvalidCommit,
            lambda: writer.commit(pending_writes=[PendingWrite(checkpoint_id="c1", task_id="t", node_id="n")]),
            thread_id="t",
        )
        assert store.latest("t") is None

    def test_duplicate_checkpoint_id_is_invalid(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1")
        writer.step("c2")
        expect(InvalidCommit, lambda: writer.commit(checkpoint=writer.checkpoint("c1")), thread_id="t")
        assert ids_of(store.history("t", limit=10)) == ["c2", "c1"]

    def test_retract_turn_cuts_back_to_the_newest_settled_checkpoint(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1", status=COMPLETED, run_id="run-a")
        writer.step("c2", status=RUNNING, run_id="run-b", pending=[])
        writer.step(
            "c3", status=SUSPENDED, run_id="run-b", pending=[PendingWrite(checkpoint_id="c3", task_id="t", node_id="n")]
        )
        # The new checkpoint's parent is checked against the latest before the cut, like every commit's.
        for stale in ("c1", "c2"):
            stale_cp = writer.checkpoint("c4", parent=stale)
            expect(
                CheckpointConflict,
                functools.partial(writer.commit, checkpoint=stale_cp, retract_turn=True),
                thread_id="t",
                expected=stale,
                actual="c3",
            )
        assert ids_of(store.history("t", limit=10)) == ["c3", "c2", "c1"]
        assert [w.task_id for w in present(store.latest("t")).pending_writes] == ["t"]
        w4 = PendingWrite(checkpoint_id="c4", task_id="t4", node_id="n4")
        retracting = Commit(
            token=writer.token,
            checkpoint=writer.checkpoint("c4", parent="c3", run_id="run-c"),
            retract_turn=True,
            pending_writes=[w4],
            events=writer.drafts(1),
        )
        records = store.commit("t", retracting)
        assert seqs(records) == [1]
        assert ids_of(store.history("t", limit=10)) == ["c4", "c1"]
        assert present(store.checkpoint("t", "c4")).parent == "c3"  # it names what it followed, now cut
        assert store.checkpoint("t", "c2") is None and store.checkpoint("t", "c3") is None
        assert present(store.latest("t")).pending_writes == (w4,)
        assert store.lookup_run("t", ["run-b"]) is None
        # The same commit again (a retry after OutcomeUnknown) is refused: its parent is no longer the latest.
        expect(CheckpointConflict, lambda: store.commit("t", retracting), expected="c3", actual="c4")
        assert ids_of(store.history("t", limit=10)) == ["c4", "c1"]
        # When the latest is settled nothing is cut.
        writer.latest = "c4"
        writer.step("c5", status=FAILED)
        writer.commit(checkpoint=writer.checkpoint("c6", parent="c5"), retract_turn=True)
        assert ids_of(store.history("t", limit=10)) == ["c6", "c5", "c4", "c1"]

    def test_retract_turn_without_a_settled_checkpoint_empties_the_history(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1")
        writer.step("c2", status=SUSPENDED)
        expect(
            CheckpointConflict,
            lambda: writer.commit(checkpoint=writer.checkpoint("c3", parent=None), retract_turn=True),
            expected=None,
            actual="c2",
        )
        # A checkpoint id the cut would remove is still in the history when the commit is checked.
        expect(
            InvalidCommit,
            lambda: writer.commit(checkpoint=writer.checkpoint("c1", parent="c2"), retract_turn=True),
            thread_id="t",
        )
        assert ids_of(store.history("t", limit=10)) == ["c2", "c1"]
        writer.commit(checkpoint=writer.checkpoint("c3", parent="c2"), retract_turn=True)
        assert ids_of(store.history("t", limit=10)) == ["c3"]

    def test_a_record_over_the_size_limit_is_refused_naming_the_part_and_nothing_is_written(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        """Harnesses open their stores with the default ``max_json_size`` (16 MiB characters per record)."""
        limit = DEFAULT_MAX_JSON_SIZE
        writer = Writer(store, harness, "t")
        writer.step("c1", events=1)
        before = snapshot(store, ["t"])
        now = harness.clock.now()

        def padded(build: Callable[[str], Any], length: Callable[[Any], int], size: int) -> Any:
            bare = length(build(""))
            return build("a" * (size - bare))

        def cp_of(pad: str) -> Checkpoint:
            return writer.checkpoint("c2", state={"x": pad})

        def pw_of(pad: str) -> PendingWrite:
            return PendingWrite(checkpoint_id="c1", task_id="task", node_id="n", payload=[pad])

        def ev_of(pad: str) -> EventDraft:
            return EventDraft(run_id="run-1", type="e", timestamp=now, payload={"p": pad})

        def fx_of(pad: str) -> EffectRecord:
            return EffectRecord(key="k1", run_id="run-1", recorded_at=now, result=pad)

        cp_len = lambda cp: len(encode_checkpoint(cp, writer.token).text)  # noqa: E731
        ev_len = lambda ev: len(encode_event(ev, "t", writer.token).text(0)) - len('{"seq":0,')  # noqa: E731
        cases: list[tuple[str, Commit]] = [
            ("commit.checkpoint.state", Commit(token=writer.token, checkpoint=padded(cp_of, cp_len, limit + 1))),
            (
                "commit.pending_writes[1].payload",
                Commit(
                    token=writer.token,
                    pending_writes=[
                        pw_of(""),
                        padded(pw_of, lambda pw: len(encode_pending_write(pw).text), limit + 1),
                    ],
                ),
            ),
            (
                "commit.events[0].payload",
                Commit(token=writer.token, events=[padded(ev_of, ev_len, limit + 1)], effects=[fx_of("")]),
            ),
            (
                "commit.effects[0].result",
                Commit(token=writer.token, effects=[padded(fx_of, lambda fx: len(encode_effect(fx).text), limit + 1)]),
            ),
        ]
        for field, commit in cases:
            error = expect(ValidationError, functools.partial(store.commit, "t", commit), field=field)
            assert f"{limit + 1:,} characters" in str(error.problems) and f"{limit:,}" in str(error.problems)
            assert snapshot(store, ["t"]) == before, field
        # A record of exactly the limit is written whole.
        at_limit = padded(cp_of, cp_len, limit)
        writer.commit(checkpoint=at_limit, events=[padded(ev_of, ev_len, limit)])
        stored = present(store.latest("t")).checkpoint
        assert stored.id == "c2" and stored.state == at_limit.state
        assert [len(e.payload["p"]) for e in store.events_after("t", 1, 10)] == [limit - ev_len(ev_of(""))]

    def test_effects_are_first_wins(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        now = harness.clock.now()
        first = EffectRecord(key="k1", run_id="run-1", recorded_at=now, result={"v": 1})
        writer.step("c1", effects=[first])
        writer.step(
            "c2",
            effects=[
                EffectRecord(key="k1", run_id="run-1", recorded_at=now, result={"v": 2}),
                EffectRecord(key="k2", run_id="run-1", recorded_at=now, result=None),
            ],
        )
        writer.commit(effects=[EffectRecord(key="k1", run_id="run-9", recorded_at=now, result="again")])
        assert store.effect("t", "k1") == first
        assert present(store.effect("t", "k2")).result is None
        assert store.effect("t", "missing") is None
        assert store.effect("unknown", "k1") is None

    def test_an_effects_only_commit_is_fenced_and_changes_nothing_else(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        """What the runtime's effect intents rely on: a commit of effect records alone, before the effect is
        called, is refused with a superseded token (nothing written) and otherwise adds only its records."""
        writer = Writer(store, harness, "t")
        writer.step("c1", events=1)
        now = harness.clock.now()
        intent = EffectRecord(key="pay@1/intent", run_id="run-1", recorded_at=now, result={"key": "pay"})
        assert writer.commit(effects=[intent]) == []
        assert store.effect("t", "pay@1/intent") == intent
        assert present(store.latest("t")).checkpoint.id == "c1"
        assert seqs(store.events_after("t", 0, 10)) == [1]
        writer.release()
        successor = Writer(store, harness, "t", holder="run-2")
        late = EffectRecord(key="pay@2/intent", run_id="run-1", recorded_at=now, result={"key": "pay"})
        expect(StaleClaim, lambda: writer.commit(effects=[late]), thread_id="t", token=writer.token)
        assert store.effect("t", "pay@2/intent") is None
        again = EffectRecord(key="pay@1/intent", run_id="run-2", recorded_at=now, result={"key": "again"})
        assert successor.commit(effects=[again]) == []
        assert store.effect("t", "pay@1/intent") == intent  # first wins: the intent names the first run
        assert seqs(successor.emit(1)) == [2]

    def test_metadata_commit_merges_and_moves_updated_at(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        writer.step("c1")

        def summary() -> Any:
            [item] = store.threads(ThreadQuery(tenant_id="acme")).items
            return item

        first = summary()
        assert first.metadata == {}
        if not harness.database_clock:
            assert first.updated_at == harness.clock.now()
        harness.advance(harness.tick)
        writer.emit(2)  # events alone do not move it
        assert summary().updated_at == first.updated_at
        harness.advance(harness.tick)
        writer.commit(metadata={"owner": "ana"})
        second = summary()
        assert second.updated_at > first.updated_at
        assert second.metadata == {"owner": "ana"}
        harness.advance(harness.tick)
        writer.commit(metadata={"owner": "bo", "team": "x"})
        third = summary()
        assert third.metadata == {"owner": "bo", "team": "x"}
        assert third.updated_at > second.updated_at
        assert third.latest_checkpoint_id == "c1"

