"""The contract suite: access stamps, stamp-checked reads, walk threads and membership (README "Access schemas").

Each test's ``store`` stamps with no declared schema (every graph kind tenant-only: "v1"); :func:`v2` opens a
store over the same storage whose schema of graph kind ``chat`` adds ``region`` (a metadata key) and ``plan``
(a JSON pointer into the state): a node of the next release. Stamps are observed through behaviour: how many rows
``stamp_thread`` changes, and what the tenant-scoped reads return.
"""

from __future__ import annotations

import threading

import pytest

from threadloom.domain.access import (
    WALK_GRAPH_ID,
    AccessAttribute,
    AccessSchema,
    AccessSchemas,
    WalkRecord,
    walk_thread_id,
)
from threadloom.domain.errors import CheckpointNotFound, StaleClaim, StoreUnavailable, ValidationError
from threadloom.domain.values import (
    ClaimRequest,
    Commit,
    EffectRecord,
    PendingWrite,
    ThreadQuery,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    LIVE,
    PAST_SHORT,
    RESULT_TIMEOUT_S,
    SHORT,
    Writer,
    expect,
    ids_of,
    seqs,
)
from threadloom.testing.harness import StoreHarness

REGION = AccessAttribute(name="region", source="metadata", key="region")
PLAN = AccessAttribute(name="plan", source="state", key="/account/plan")
V2 = AccessSchemas([AccessSchema("chat", (REGION, PLAN))])
"""The next release's declarations: graph kind ``chat`` stamps ``region`` and ``plan`` too."""


def v2(harness: StoreHarness) -> Checkpointer:
    """A store of the next release over the test's storage (open the test's ``store`` first)."""
    return harness.node(V2)


def chat_step(
    writer: Writer, cp_id: str, *, region: str = "eu", plan: str = "gold", events: int = 1, pending: int = 1,
    effects: int = 1, tenant: str | None = "writer",
) -> None:
    """Commits checkpoint ``cp_id`` of graph kind ``chat`` with ``events``, ``pending`` writes and ``effects``;
    ``region`` goes in its metadata, ``plan`` in its state, ``tenant`` is its tenant (``"writer"``: the writer's)."""
    now = writer.harness.clock.now()
    writer.store.commit(
        writer.thread_id,
        Commit(
            token=writer.token,
            checkpoint=writer.checkpoint(
                cp_id, graph_id="chat", tenant=tenant, metadata={"region": region},
                state={"account": {"plan": plan}, "step": cp_id},
            ),
            pending_writes=[
                PendingWrite(checkpoint_id=cp_id, task_id=f"task-{i}", node_id="n", payload=i) for i in range(pending)
            ],
            events=writer.drafts(events),
            effects=[
                EffectRecord(key=f"{cp_id}-e{i}", run_id=writer.holder, recorded_at=now, result=i)
                for i in range(effects)
            ],
        ),
    )
    writer.latest = cp_id


class AccessContract:
    """Access stamps, stamp-checked reads, walk threads and membership.

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- stamping on commit ---------------------------------------------------------------------------------------

    def test_a_commit_stamps_every_row_it_writes(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        chat_step(writer, "c1", events=2, pending=2, effects=1)  # 1 checkpoint, 2 writes, 2 events, 1 effect
        assert store.stamp_thread("t") == 0  # stamped at commit with this store's schema
        new = v2(harness)
        assert new.stamp_thread("t") == 6  # every row kind carries a stamp of the old schema
        assert new.stamp_thread("t") == 0
        assert store.stamp_thread("t") == 6  # and back: the stamp names its schema
        # a commit through the new node stamps with the new schema
        chat_step(_writer(new, harness, "u2"), "d1")
        assert new.stamp_thread("u2") == 0 and store.stamp_thread("u2") == 4

    def test_a_commit_without_a_checkpoint_stamps_the_whole_thread_by_its_latest_checkpoint(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        chat_step(writer, "c1", events=1, pending=1, effects=1)  # the old node's: a checkpoint and three rows
        new = v2(harness)
        writer.store = new
        writer.emit(2)
        # the new node's rows carry its schema's stamp, derived from the latest checkpoint, and in the same
        # transaction every older row of the thread gets it too: nothing is left for stamp_thread
        assert new.stamp_thread("t") == 0
        assert store.stamp_thread("t") == 6  # every row carried the new schema's stamp: back to the old one
        writer.commit(
            pending_writes=[PendingWrite(checkpoint_id="c1", task_id="x", node_id="n")], metadata={"k": "v"},
            effects=[EffectRecord(key="x", run_id=writer.holder, recorded_at=harness.clock.now(), result=1)],
        )
        assert new.stamp_thread("t") == 0
        assert store.stamp_thread("t") == 8
        writer.emit(1)
        assert new.stamp_thread("t") == 0 and store.stamp_thread("t") == 9
        writer.store = store  # the other way round: the old node stamps with its schema, the whole thread too
        assert new.stamp_thread("t") == 9
        writer.emit(1)
        assert store.stamp_thread("t") == 0 and new.stamp_thread("t") == 10
        assert seqs(new.tenant_events_after("t", "acme", 0, 10)) == [1, 2, 3, 4, 5]

    def test_a_changed_attribute_leaves_older_rows_to_restamp(self, harness: StoreHarness, store: Checkpointer) -> None:
        new = v2(harness)
        writer = _writer(new, harness, "t")
        chat_step(writer, "c1", region="eu", events=1, pending=1, effects=1)
        chat_step(writer, "c2", region="us", events=1, pending=1, effects=0)
        assert new.stamp_thread("t") == 3  # c1, its event and its effect carried region eu
        writer.commit(checkpoint=writer.checkpoint("c3", graph_id="chat", tenant="acme", state={}))
        writer.latest = "c3"
        # c3 has no region and no plan: both null; every older row differs now
        assert new.stamp_thread("t") == 5  # c1, c2, two events, one effect (c2's write went with it)
        assert new.stamp_thread("t") == 0

    def test_walk_threads_are_never_stamped_listed_or_walked(self, harness: StoreHarness, store: Checkpointer) -> None:
        walk = walk_thread_id("grp", "chat")
        claim = store.claim(walk, ClaimRequest(holder="walker", ttl=harness.tick * LIVE))
        record = WalkRecord(graph_id="chat", schema=V2.for_graph("chat").hash, heads=claim.token, cursor="t-1", count=1)
        checkpoint = record.checkpoint(walk, id="w1", parent=None, run_id="walker", created_at=harness.clock.now())
        store.commit(walk, Commit(token=claim.token, checkpoint=checkpoint))
        latest = store.latest(walk)
        assert latest is not None and WalkRecord.from_state(walk, latest.checkpoint.state) == record
        store.release(walk, claim.token)
        assert store.threads(ThreadQuery(tenant_id=None)).items == ()
        assert store.incomplete(None, limit=10).items == ()
        assert store.graph_threads("chat", limit=10) == []
        assert store.stamp_thread(walk) == 0
        assert store.tenant_history(walk, None, limit=10) == []
        assert store.export_tenant(None, limit=10).threads == ()
        with pytest.raises(ValidationError) as caught:
            store.graph_threads(WALK_GRAPH_ID, limit=10)
        assert caught.value.field == "graph_id"

    # -- stamp_thread ---------------------------------------------------------------------------------------------

    def test_stamp_thread_of_an_unknown_thread_or_one_without_a_checkpoint_changes_nothing(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        assert store.stamp_thread("nobody") == 0
        writer = Writer(store, harness, "t")
        writer.emit(2)
        assert v2(harness).stamp_thread("t") == 0

    def test_stamp_thread_is_fenced_by_the_walk_lease(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        chat_step(writer, "c1")
        new = v2(harness)
        walk = walk_thread_id("grp", "chat")
        lease = new.claim(walk, ClaimRequest(holder="walker-1", ttl=harness.tick * SHORT))
        harness.advance(harness.tick * PAST_SHORT)
        successor = new.claim(walk, ClaimRequest(holder="walker-2", ttl=harness.tick * LIVE))
        expect(StaleClaim, lambda: new.stamp_thread("t", fence=(walk, lease.token)), thread_id=walk,
               token=lease.token, current=successor.token)
        assert new.stamp_thread("t", fence=(walk, successor.token)) == 4  # the refused call wrote nothing
        expect(StaleClaim, lambda: new.stamp_thread("t", fence=("unclaimed", 1)), thread_id="unclaimed")
        with pytest.raises(ValidationError) as caught:
            new.stamp_thread("t", fence=("t", successor.token))
        assert caught.value.field == "fence"

    def test_a_racing_commit_never_loses_its_newer_stamp(self, harness: StoreHarness, store: Checkpointer) -> None:
        stores = [v2(harness), v2(harness)]
        writer = _writer(stores[0], harness, "t")
        chat_step(writer, "c0", tenant="a")
        done = threading.Event()
        failures: list[BaseException] = []
        stamped = [0]

        def stamp() -> None:
            try:
                while not done.is_set():
                    try:
                        stores[1].stamp_thread("t")
                        stamped[0] += 1
                    except StoreUnavailable:
                        # the documented answer when commits keep moving the thread through every attempt (seen
                        # on a loaded machine): nothing was written, and a retry is safe
                        continue
            except BaseException as error:  # reported by the main thread
                failures.append(error)

        stamper = threading.Thread(target=stamp, daemon=True)
        stamper.start()
        try:
            for step in range(1, 16):
                tenant = "a" if step % 2 == 0 else "b"
                chat_step(writer, f"c{step}", tenant=tenant, region=f"r{step}", events=1, pending=0, effects=0)
                # the newest checkpoint carries its own tenant whatever the stamper did meanwhile
                assert ids_of(stores[0].tenant_history("t", tenant, limit=1)) == [f"c{step}"]
                assert [e.payload for e in stores[0].tenant_events_after("t", tenant, step, 10)][-1:] == [{"n": 0}]
        finally:
            done.set()
            stamper.join(RESULT_TIMEOUT_S)
        assert not failures, failures
        assert stamped[0] > 0, "the stamper never stamped: nothing raced"

    # -- graph_threads, token_high_water, membership -------------------------------------------------------------

    def test_graph_threads_pages_a_graph_kind_by_thread_id(self, harness: StoreHarness, store: Checkpointer) -> None:
        writers = {thread_id: _writer(store, harness, thread_id) for thread_id in ("t3", "t1", "t2", "t5")}
        for thread_id, writer in writers.items():
            chat_step(writer, f"{thread_id}-c1", pending=0, effects=0, events=0)
        other = Writer(store, harness, "t4")
        other.step("x1")
        writers["t5"].delete()
        assert store.graph_threads("chat", limit=2) == ["t1", "t2"]
        assert store.graph_threads("chat", after="t2", limit=2) == ["t3"]
        assert store.graph_threads("chat", after="t3", limit=2) == []
        assert store.graph_threads("default", limit=10) == ["t4"]
        assert store.graph_threads("none", limit=10) == []
        for bad in (0, 1001):
            with pytest.raises(ValidationError):
                store.graph_threads("chat", limit=bad)

    def test_token_high_water_is_the_largest_token_issued(self, harness: StoreHarness, store: Checkpointer) -> None:
        assert store.token_high_water() == 0
        writer = Writer(store, harness, "t")
        writer.release()
        second = Writer(v2(harness), harness, "u")
        assert store.token_high_water() == second.token > writer.token
        assert v2(harness).token_high_water() == second.token

    def test_members_are_the_unexpired_heartbeats_of_a_group(self, harness: StoreHarness, store: Checkpointer) -> None:
        other = v2(harness)
        store.heartbeat("g#access", "node-1", ["chat@a1x", "chat@a1x", "b@a1y"], harness.tick * SHORT)
        other.heartbeat("g#access", "node-2", ["chat@a1z"], harness.tick * LIVE)
        other.heartbeat("h#access", "node-3", [], harness.tick * LIVE)
        members = store.members("g#access")
        assert [(m.member, m.serves) for m in members] == [("node-1", ("b@a1y", "chat@a1x")), ("node-2", ("chat@a1z",))]
        assert members[0].expires_at < members[1].expires_at
        harness.advance(harness.tick * PAST_SHORT)
        assert [m.member for m in other.members("g#access")] == ["node-2"]
        store.heartbeat("g#access", "node-2", ["chat@a1w"], harness.tick * LIVE)
        assert [(m.member, m.serves) for m in store.members("g#access")] == [("node-2", ("chat@a1w",))]
        assert store.members("nobody") == []
        with pytest.raises(ValidationError) as caught:
            store.heartbeat("g", "m", "chat@a1", harness.tick)
        assert caught.value.field == "serves"

    # -- tenant-scoped reads --------------------------------------------------------------------------------------

    def test_tenant_reads_return_only_the_tenants_rows(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        chat_step(writer, "c1", events=2)
        chat_step(writer, "c2", events=1)
        assert ids_of(store.tenant_history("t", "acme", limit=10)) == ["c2", "c1"]
        assert ids_of(store.tenant_history("t", "acme", limit=10, before="c2")) == ["c1"]
        assert seqs(store.tenant_events_after("t", "acme", 1, 10)) == [2, 3]
        for tenant in ("other", None):
            assert store.tenant_history("t", tenant, limit=10) == []
            assert store.tenant_events_after("t", tenant, 0, 10) == []
        assert store.tenant_history("nobody", "acme", limit=10) == []
        expect(CheckpointNotFound, lambda: store.tenant_history("t", "acme", limit=10, before="zz"))

    def test_the_follower_stamps_an_old_nodes_thread_before_a_tenant_read(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        chat_step(writer, "c1", events=2)
        new = v2(harness)
        assert ids_of(new.tenant_history("t", "acme", limit=10)) == ["c1"]  # stamped first, then shown
        assert new.stamp_thread("t") == 0
        writer.step("c2", graph_id="chat", events=1)  # the old node commits again: its rows are of its schema
        assert seqs(new.tenant_events_after("t", "acme", 0, 10)) == [1, 2, 3]
        assert new.tenant_history("t", "other", limit=10) == []
        assert new.stamp_thread("t") == 0

    def test_a_restamp_never_shows_a_checkpoint_committed_for_another_tenant(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        # The store takes a checkpoint naming another tenant than the thread's earlier ones (the runtime refuses
        # such a run with TenantMismatch; a direct writer is not refused). A restamp derives the thread's stamp
        # from its latest checkpoint: the older tenant's checkpoints must still never reach the newer tenant.
        writer = Writer(store, harness, "t", tenant=None)
        chat_step(writer, "c1", tenant="acme", events=0, pending=0, effects=0)
        chat_step(writer, "c2", tenant="other", events=0, pending=0, effects=0)
        new = v2(harness)
        for reader in (store, new):
            assert ids_of(reader.tenant_history("t", "other", limit=10)) == ["c2"]
            (thread,) = reader.export_tenant("other", limit=10).threads
            assert ids_of(thread.checkpoints) == ["c2"]
            # c1 is acme's: shown to acme while its stamp names acme, hidden once a restamp names "other"
            assert ids_of(reader.tenant_history("t", "acme", limit=10)) in (["c1"], [])

    def test_export_tenant_pages_the_tenants_threads_with_every_row(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        for thread_id in ("t2", "t1", "t3"):
            chat_step(_writer(store, harness, thread_id, tenant="acme"), "c1", events=1, pending=1, effects=1)
        chat_step(_writer(store, harness, "t0", tenant="other"), "c1")
        new = v2(harness)
        page = new.export_tenant("acme", limit=2)
        assert [t.thread_id for t in page.threads] == ["t1", "t2"] and page.next == "t2"
        first = page.threads[0]
        assert ids_of(first.checkpoints) == ["c1"] and seqs(first.events) == [1]
        assert [w.task_id for w in first.pending_writes] == ["task-0"] and [e.key for e in first.effects] == ["c1-e0"]
        rest = new.export_tenant("acme", after=page.next, limit=2)
        assert [t.thread_id for t in rest.threads] == ["t3"] and rest.next is None
        assert [t.thread_id for t in new.export_tenant("other", limit=10).threads] == ["t0"]
        assert new.export_tenant("nobody", limit=10).threads == ()
        for bad in (0, 101):
            with pytest.raises(ValidationError):
                new.export_tenant("acme", limit=bad)


def _writer(store: Checkpointer, harness: StoreHarness, thread_id: str, tenant: str | None = "acme") -> Writer:
    return Writer(store, harness, thread_id, tenant=tenant)


__all__ = ["V2", "AccessContract", "chat_step", "v2"]
