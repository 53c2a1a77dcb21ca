"""The contract suite: The registry and data-only storage (threads, incomplete)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from threadloom.domain.errors import (
    ValidationError,
)
from threadloom.domain.rules import DELETING_KEY
from threadloom.domain.values import (
    CheckpointOrigin,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    TenantCount,
    TenantPage,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    COMPLETED,
    FAILED,
    PAST_SHORT,
    RUNNING,
    SHORT,
    SUSPENDED,
    Writer,
    expect,
    present,
)
from threadloom.testing.harness import StoreHarness


class RegistryContract:
    """The registry and data-only storage (threads, incomplete).

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- the registry (threads, incomplete) -------------------------------------------------------------

    def _roots(
        self,
        harness: StoreHarness,
        store: Checkpointer,
        names: Sequence[str],
        *,
        tenant: str | None = "acme",
        step: bool = True,
        **kw: Any,
    ) -> dict[str, Writer]:
        writers = {}
        for name in names:
            if step and not harness.database_clock:
                harness.advance(harness.tick)
            writer = Writer(store, harness, name, tenant=tenant)
            writer.step(f"{name}-c1", **kw)
            writers[name] = writer
        return writers

    def test_threads_page_newest_first_with_cursors(self, harness: StoreHarness, store: Checkpointer) -> None:
        self._roots(harness, store, ["t-a", "t-b", "t-c", "t-d"])
        first = store.threads(ThreadQuery(tenant_id="acme", limit=2))
        assert [s.thread_id for s in first.items] == ["t-d", "t-c"]
        assert first.next == ThreadCursor(updated_at=first.items[-1].updated_at, thread_id="t-c")
        second = store.threads(ThreadQuery(tenant_id="acme", limit=2, after=first.next))
        assert [s.thread_id for s in second.items] == ["t-b", "t-a"]
        assert second.next is None
        assert first.items[0].updated_at > first.items[1].updated_at > second.items[0].updated_at
        everything = store.threads(ThreadQuery(tenant_id="acme", limit=3))
        assert [s.thread_id for s in everything.items] == ["t-d", "t-c", "t-b"] and everything.next is not None

    def test_threads_changed_while_paging_move_to_the_front(self, harness: StoreHarness, store: Checkpointer) -> None:
        writers = self._roots(harness, store, ["t-a", "t-b", "t-c"])
        first = store.threads(ThreadQuery(tenant_id="acme", limit=1))
        assert [s.thread_id for s in first.items] == ["t-c"]
        harness.advance(harness.tick)
        writers["t-a"].step("t-a-c2")
        rest = store.threads(ThreadQuery(tenant_id="acme", limit=10, after=first.next))
        assert [s.thread_id for s in rest.items] == ["t-b"]
        again = store.threads(ThreadQuery(tenant_id="acme", limit=10))
        assert [s.thread_id for s in again.items] == ["t-a", "t-c", "t-b"]

    def test_threads_and_incomplete_break_ties_by_id(self, harness: StoreHarness, store: Checkpointer) -> None:
        if harness.database_clock:
            pytest.skip("needs a store clock that stops, to commit several threads at one instant")
        writers = self._roots(harness, store, ["t-b", "t-c", "t-a"], step=False)
        page = store.threads(ThreadQuery(tenant_id="acme", limit=2))
        assert [s.thread_id for s in page.items] == ["t-c", "t-b"]
        assert [s.thread_id for s in store.threads(ThreadQuery(tenant_id="acme", after=page.next)).items] == ["t-a"]
        for writer in writers.values():
            writer.release()
        page = store.incomplete("acme", limit=2)
        assert [s.thread_id for s in page.items] == ["t-a", "t-b"]
        assert [s.thread_id for s in store.incomplete("acme", limit=2, after=page.next).items] == ["t-c"]

    def test_threads_filters(self, harness: StoreHarness, store: Checkpointer) -> None:
        writers = self._roots(harness, store, ["t-a", "t-b", "t-c", "t-d"])
        writers["t-b"].step("t-b-c2", status=COMPLETED, graph_id="billing")
        writers["t-c"].step("t-c-c2", status=FAILED)
        writers["t-c"].release()
        writers["t-d"].step("t-d-c2", status=SUSPENDED, graph_id="billing")
        writers["t-d"].release()
        writers["t-a"].release()
        every = {s.thread_id: s for s in store.threads(ThreadQuery(tenant_id="acme")).items}
        assert {tid: s.status for tid, s in every.items()} == {
            "t-a": ThreadStatus.IDLE,
            "t-b": ThreadStatus.RUNNING,
            "t-c": ThreadStatus.FAILED,
            "t-d": ThreadStatus.SUSPENDED,
        }

        def listed(**query: Any) -> list[str]:
            return [s.thread_id for s in store.threads(ThreadQuery(tenant_id="acme", **query)).items]

        assert listed(statuses={ThreadStatus.FAILED, ThreadStatus.IDLE}) == [s for s in listed() if s in ("t-c", "t-a")]
        assert listed(statuses=set()) == []
        assert sorted(listed(graph_id="billing")) == ["t-b", "t-d"]
        assert listed(graph_id="nothing") == []
        since = every["t-c"].updated_at
        assert sorted(listed(updated_since=since)) == sorted(t for t, s in every.items() if s.updated_at >= since)
        assert "t-c" in listed(updated_since=since)
        assert listed(updated_since=max(s.updated_at for s in every.values()) + timedelta(microseconds=1)) == []
        paged = store.threads(ThreadQuery(tenant_id="acme", limit=1, graph_id="billing"))
        assert len(paged.items) == 1 and paged.next is not None
        rest = store.threads(ThreadQuery(tenant_id="acme", limit=1, graph_id="billing", after=paged.next))
        assert len(rest.items) == 1 and rest.next is None
        assert {paged.items[0].thread_id, rest.items[0].thread_id} == {"t-b", "t-d"}

    def test_threads_summary_fields(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme", holder="run-7")
        writer.commit(checkpoint=writer.checkpoint("c1", graph_id="chat", metadata={"on": "checkpoint"}))
        writer.commit(metadata={"label": "x"})  # the summary's metadata is the thread's, not the checkpoint's
        [summary] = store.threads(ThreadQuery(tenant_id="acme")).items
        assert (
            summary.thread_id,
            summary.tenant_id,
            summary.latest_checkpoint_id,
            summary.latest_run_id,
            summary.graph_id,
            summary.metadata,
            summary.status,
        ) == ("t", "acme", "c1", "run-7", "chat", {"label": "x"}, ThreadStatus.RUNNING)
        if not harness.database_clock:
            assert summary.updated_at == harness.clock.now()

    def test_threads_are_tenant_scoped_and_list_roots_only(self, harness: StoreHarness, store: Checkpointer) -> None:
        self._roots(harness, store, ["mine"], tenant="acme")
        self._roots(harness, store, ["theirs"], tenant="other")
        self._roots(harness, store, ["nobodys"], tenant=None)
        child = Writer(store, harness, "kid", tenant="acme")
        child.step("k1", origin=CheckpointOrigin(parent_thread="mine"))
        Writer(store, harness, "claimed-only", tenant="acme")

        def listed(tenant: str | None) -> list[str]:
            return [s.thread_id for s in store.threads(ThreadQuery(tenant_id=tenant)).items]

        assert listed("acme") == ["mine"]
        assert listed("other") == ["theirs"]
        assert listed(None) == ["nobodys"]
        assert listed("unknown") == []
        assert [s.thread_id for s in store.incomplete("other", limit=10).items] == []
        child.step("k2", origin=None)  # no longer a child: a root now
        assert sorted(listed("acme")) == ["kid", "mine"]
        # The tenant is the latest checkpoint's.
        child.step("k3", tenant="other")
        assert listed("acme") == ["mine"] and sorted(listed("other")) == ["kid", "theirs"]

    def test_tenants_count_root_threads_per_tenant_the_tenantless_last(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        assert store.tenants() == TenantPage()
        self._roots(harness, store, ["a1", "a2", "a3"], tenant="acme")
        self._roots(harness, store, ["b1"], tenant="beta")
        self._roots(harness, store, ["n1", "n2"], tenant=None)
        self._roots(harness, store, ["z1"], tenant="Zeta")  # code point order: upper case first
        Writer(store, harness, "kid", tenant="beta").step("k1", origin=CheckpointOrigin(parent_thread="b1"))
        Writer(store, harness, "claimed-only", tenant="gamma")  # no checkpoint: not a root thread yet
        counts = [(row.tenant_id, row.threads) for row in store.tenants().items]
        assert counts == [("Zeta", 1), ("acme", 3), ("beta", 1), (None, 2)]
        assert store.tenants().next is None
        # Each count is what ``threads`` lists for that tenant.
        for row in store.tenants().items:
            assert len(store.threads(ThreadQuery(tenant_id=row.tenant_id, limit=1000)).items) == row.threads

    def test_tenants_page_by_tenant_id_and_end_with_the_tenantless(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        for tenant in ("t-c", "t-a", "t-b"):
            self._roots(harness, store, [f"{tenant}-1"], tenant=tenant)
        self._roots(harness, store, ["none-1"], tenant=None)
        pages, after = [], None
        for _ in range(10):
            page = store.tenants(limit=2, after=after)
            pages.append([row.tenant_id for row in page.items])
            after = page.next
            if after is None:
                break
        assert pages == [["t-a", "t-b"], ["t-c", None]]
        first = store.tenants(limit=3)
        assert [row.tenant_id for row in first.items] == ["t-a", "t-b", "t-c"] and first.next == "t-c"
        assert [(row.tenant_id, row.threads) for row in store.tenants(after="t-c").items] == [(None, 1)]
        assert store.tenants(after="t-c").next is None
        assert [row.tenant_id for row in store.tenants(after="t-aa").items] == ["t-b", "t-c", None]
        assert store.tenants(limit=1, after="zzz") == TenantPage(items=(TenantCount(tenant_id=None, threads=1),))

    def test_tenants_follow_the_latest_checkpoint_and_deletes(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writers = self._roots(harness, store, ["t1", "t2"], tenant="acme")
        writers["t1"].step("t1-c2", tenant="other")
        assert [(r.tenant_id, r.threads) for r in store.tenants().items] == [("acme", 1), ("other", 1)]
        writers["t2"].commit(metadata={DELETING_KEY: "true"})  # listed DELETED by threads: still counted
        assert [(r.tenant_id, r.threads) for r in store.tenants().items] == [("acme", 1), ("other", 1)]
        writers["t2"].delete()
        assert [(r.tenant_id, r.threads) for r in store.tenants().items] == [("other", 1)]

    def test_tenants_refuse_a_bad_limit_or_cursor(self, harness: StoreHarness, store: Checkpointer) -> None:
        loose: Any = store  # ill-typed values on purpose
        bad_limits: list[Any] = [0, TenantPage.MAX_LIMIT + 1, "3", None, True]
        for bad in bad_limits:
            expect(ValidationError, functools.partial(loose.tenants, limit=bad), field="limit")
        bad_afters: list[Any] = ["", "a\x00b", "x" * 256, 5]
        for bad in bad_afters:
            expect(ValidationError, functools.partial(loose.tenants, after=bad), field="after")

    def test_thread_status_follows_claims_and_the_deleting_mark(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        def status() -> ThreadStatus:
            [summary] = store.threads(ThreadQuery(tenant_id="acme")).items
            return summary.status

        writer = Writer(store, harness, "t", tenant="acme", ttl_ticks=SHORT)
        writer.step("c1", status=COMPLETED)
        assert status() is ThreadStatus.RUNNING  # a live claim holds it
        harness.advance(harness.tick * PAST_SHORT)
        assert status() is ThreadStatus.COMPLETED
        writer = Writer(store, harness, "t", tenant="acme", ttl_ticks=SHORT)
        writer.step("c2", status=RUNNING)
        assert status() is ThreadStatus.RUNNING
        harness.advance(harness.tick * PAST_SHORT)
        assert status() is ThreadStatus.IDLE  # expired without a release
        writer = Writer(store, harness, "t", tenant="acme")
        writer.commit(metadata={DELETING_KEY: "true"})
        assert status() is ThreadStatus.DELETED  # even while claimed
        writer.release()
        assert status() is ThreadStatus.DELETED
        assert store.incomplete("acme", limit=10).items == ()
        assert [
            s.thread_id for s in store.threads(ThreadQuery(tenant_id="acme", statuses={ThreadStatus.DELETED})).items
        ] == ["t"]
        writer = Writer(store, harness, "t", tenant="acme")
        writer.delete()
        assert store.threads(ThreadQuery(tenant_id="acme")).items == ()

    def test_incomplete_lists_idle_roots_oldest_first(self, harness: StoreHarness, store: Checkpointer) -> None:
        writers = self._roots(harness, store, ["i-1", "i-2", "i-3", "i-4", "i-5", "i-6"])
        writers["i-1"].release()  # idle
        writers["i-2"].step("i-2-c2", status=COMPLETED)
        writers["i-2"].release()  # settled: not incomplete
        # i-3 stays claimed (live): not listed
        writers["i-4"].commit(metadata={DELETING_KEY: "true"})
        writers["i-4"].release()  # a cascade delete has begun: not listed
        writers["i-5"].release()
        writers["i-6"].step("i-6-c2", status=SUSPENDED)
        writers["i-6"].release()
        expiring = Writer(store, harness, "i-7", tenant="acme", ttl_ticks=SHORT)
        expiring.step("i-7-c1")
        harness.advance(harness.tick * PAST_SHORT)  # an expired claim: listed
        other = Writer(store, harness, "i-8", tenant="other")
        other.step("i-8-c1")
        other.release()
        kid = Writer(store, harness, "i-9", tenant="acme")
        kid.step("i-9-c1", origin=CheckpointOrigin(parent_thread="i-1"))
        kid.release()
        page = store.incomplete("acme", limit=10)
        assert [s.thread_id for s in page.items] == ["i-1", "i-5", "i-7"]
        assert all(s.status is ThreadStatus.IDLE for s in page.items) and page.next is None
        first = store.incomplete("acme", limit=2)
        assert [s.thread_id for s in first.items] == ["i-1", "i-5"]
        assert first.next == first.items[-1].cursor
        rest = store.incomplete("acme", limit=2, after=first.next)
        assert [s.thread_id for s in rest.items] == ["i-7"] and rest.next is None
        assert [s.thread_id for s in store.incomplete("other", limit=10).items] == ["i-8"]
        assert store.incomplete(None, limit=10).items == ()
        expect(ValidationError, lambda: store.incomplete("acme", limit=0), field="limit")
        expect(ValidationError, lambda: store.incomplete("acme", limit=ThreadQuery.MAX_LIMIT + 1), field="limit")
        assert store.incomplete("acme", limit=ThreadQuery.MAX_LIMIT).items == page.items

    # -- data only; nothing aliases (rule 10) ---------------------------------------------------------------------

    def test_nothing_returned_aliases_stored_state(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t", tenant="acme")
        state: dict[str, Any] = {"items": [1, 2], "nested": {"k": "v"}}
        payload = {"p": [1]}
        cp = writer.checkpoint("c1", state=state)
        draft = EventDraft(run_id="run-1", type="e", timestamp=harness.clock.now(), payload=payload)
        effect = EffectRecord(key="k1", run_id="run-1", recorded_at=harness.clock.now(), result={"r": [1]})
        write = PendingWrite(checkpoint_id="c1", task_id="t", node_id="n", payload={"w": [1]})
        records = store.commit(
            "t",
            Commit(
                token=writer.token,
                checkpoint=cp,
                events=[draft],
                effects=[effect],
                pending_writes=[write],
                metadata={"m": "1"},
            ),
        )
        writer.latest = "c1"
        # Mutate what went in and what came out.
        state["items"].append(3)
        payload["p"].append(2)
        effect.result["r"].append(2)
        write.payload["w"].append(2)
        records[0].payload["p"].append(3)
        stored = present(store.latest("t"))
        stored.checkpoint.state["items"].append(4)
        stored.checkpoint.state["nested"]["k"] = "changed"
        stored.pending_writes[0].payload["w"].append(3)
        store.history("t", limit=1)[0].state["items"].append(5)
        present(store.checkpoint("t", "c1")).state["items"].append(6)
        present(store.lookup_run("t", ["run-1"])).state["items"].append(7)
        store.events_after("t", 0, 10)[0].payload["p"].append(4)
        present(store.effect("t", "k1")).result["r"].append(3)
        store.threads(ThreadQuery(tenant_id="acme")).items[0].metadata["m"] = "changed"
        # Every read still sees what was committed.
        fresh = present(store.latest("t"))
        assert fresh.checkpoint.state == {"items": [1, 2], "nested": {"k": "v"}}
        assert fresh.pending_writes[0].payload == {"w": [1]}
        assert store.events_after("t", 0, 10)[0].payload == {"p": [1]}
        assert present(store.effect("t", "k1")).result == {"r": [1]}
        assert store.threads(ThreadQuery(tenant_id="acme")).items[0].metadata == {"m": "1"}
        assert store.history("t", limit=1)[0].state["items"] == [1, 2]

