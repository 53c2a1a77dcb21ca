"""The contract suite: Stores over one storage, restarts, bad input and closed stores (rule 12)."""

from __future__ import annotations

import pytest

from threadloom.domain.errors import (
    StoreClosed,
    ThreadBusy,
    ThreadDeleted,
    ValidationError,
)
from threadloom.domain.values import (
    BusyHolder,
    ClaimRequest,
    Commit,
    EffectRecord,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    LIVE,
    METHODS,
    Writer,
    bad_input_cases,
    expect,
    seqs,
    snapshot,
    spawn_child,
    valid_call,
)
from threadloom.testing.harness import StoreHarness


class StorageContract:
    """Stores over one storage, restarts, bad input and closed stores (rule 12).

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- stores over one storage; restarts --------------------------------------------------

    def test_sibling_store_sees_and_respects_the_same_threads(self, harness: StoreHarness, store: Checkpointer) -> None:
        if not harness.shared:
            pytest.skip("the harness has no second store over the same storage")
        sibling = harness.sibling()
        writer = Writer(store, harness, "t", tenant="acme")
        writer.step("c1", events=2)
        expect(
            ThreadBusy,
            lambda: sibling.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick, tenant_id="acme")),
            latest_checkpoint="c1",
            holder=BusyHolder.Run("run-1"),
        )
        records = sibling.commit(
            "t", Commit(token=writer.token, checkpoint=writer.checkpoint("c2"), events=writer.drafts(1))
        )
        assert seqs(records) == [3]
        assert store.events_after("t", 0, 10) == sibling.events_after("t", 0, 10)
        assert snapshot(store, ["t"]) == snapshot(sibling, ["t"])
        sibling.release("t", writer.token)
        assert store.claim("t", ClaimRequest(holder="run-3", ttl=harness.tick * LIVE)).taken_over_from is None

    def test_a_claim_outlives_the_store_that_granted_it(self, harness: StoreHarness, store: Checkpointer) -> None:
        sibling = harness.sibling() if harness.shared else None
        if sibling is None or sibling is store:
            pytest.skip("the harness has no second, separate store over the same storage")
        writer = Writer(store, harness, "t")
        writer.step("c1", events=1)
        store.close()
        expect(
            ThreadBusy,
            lambda: sibling.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)),
            holder=BusyHolder.Run("run-1"),
        )
        assert seqs(sibling.commit("t", Commit(token=writer.token, events=writer.drafts(1)))) == [2]
        sibling.release("t", writer.token)
        assert sibling.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)).token > writer.token

    def test_reopened_store_keeps_everything(self, harness: StoreHarness, store: Checkpointer) -> None:
        if not harness.reopenable:
            pytest.skip("the store keeps nothing across a reopen")
        writer = Writer(store, harness, "t", tenant="acme")
        writer.step("c1", events=2, effects=[EffectRecord(key="k1", run_id="run-1", recorded_at=harness.clock.now())])
        gone = Writer(store, harness, "gone")
        gone.emit(2)
        gone.delete()
        before = snapshot(store, ["t", "gone"])
        store = harness.reopen(store)
        assert snapshot(store, ["t", "gone"]) == before
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick, tenant_id="acme")))
        assert seqs(store.commit("t", Commit(token=writer.token, events=writer.drafts(1)))) == [3]
        assert store.claim("x", ClaimRequest(holder="r", ttl=harness.tick)).token > gone.token
        expect(ThreadDeleted, lambda: store.events_after("gone", 1, 10), first_seq=4)

    # -- bad input and closed stores -----------------------------------------------------------

    def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "a", tenant="acme")
        writer.step("c1", events=2, effects=[EffectRecord(key="k1", run_id="run-1", recorded_at=harness.clock.now())])
        spawn_child(harness, store, "kid", "a")
        before = snapshot(store, ["a", "kid"], parents=["a"])
        failures = []
        for name, call, field in bad_input_cases(harness, writer):
            try:
                call(store)
            except ValidationError as error:
                if error.field != field:
                    failures.append(f"{name}: field {error.field!r}, expected {field!r}")
                elif not error.problems or not all(isinstance(p, str) and p for p in error.problems):
                    failures.append(f"{name}: no problems given")
            except Exception as error:  # noqa: BLE001 - reported below
                failures.append(f"{name}: {type(error).__name__}: {error}")
            else:
                failures.append(f"{name}: accepted")
        assert not failures, "\n".join(failures)
        assert snapshot(store, ["a", "kid"], parents=["a"]) == before
        assert seqs(writer.emit(1)) == [3]

    @pytest.mark.parametrize("method", METHODS)
    def test_closed_store_refuses_every_call(self, harness: StoreHarness, method: str) -> None:
        store = harness.open()
        writer = Writer(store, harness, "a")
        writer.step("c1", events=1)
        store.close()
        store.close()  # twice: nothing
        assert store.closed
        with pytest.raises(StoreClosed) as info:  # a ProcessingError, not retryable on this store
            valid_call(method, harness, writer)(store)
        assert "closed" in str(info.value).lower()
        assert info.value.operation == method

    def test_close_is_a_context_manager(self, harness: StoreHarness) -> None:
        with harness.open() as store:
            store.claim("t", ClaimRequest(holder="r", ttl=harness.tick))
        assert store.closed
        expect(StoreClosed, lambda: store.latest("t"))
        store.close()


