"""The contract suite: Claims, tokens and concurrency (claim, renew, release)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest

from threadloom.domain.errors import (
    StaleClaim,
    ThreadBusy,
)
from threadloom.domain.values import (
    BusyHolder,
    Checkpoint,
    ClaimRequest,
    Commit,
    EventDraft,
)
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import (
    LIVE,
    PAST_SHORT,
    RUNNING,
    SHORT,
    Writer,
    expect,
    ids_of,
    in_threads,
    seqs,
    stores_of,
)
from threadloom.testing.harness import StoreHarness


class ClaimsContract:
    """Claims, tokens and concurrency (claim, renew, release).

    Mixed into :class:`~threadloom.testing.contract.CheckpointerContract`.
    """

    # -- claims (claim, renew, release) ------------------------------------------------------------

    def test_claim_of_a_new_thread_needs_no_checkpoint(self, harness: StoreHarness, store: Checkpointer) -> None:
        ttl = harness.tick * LIVE
        before = harness.clock.now()
        claim = store.claim("t-new", ClaimRequest(holder="run-1", ttl=ttl, tenant_id="acme"))
        assert claim.thread_id == "t-new"
        assert claim.holder == "run-1"
        assert claim.tenant_id == "acme"
        assert claim.taken_over_from is None
        assert isinstance(claim.token, int) and claim.token >= 1
        assert claim.expires_at.tzinfo is not None
        if not harness.database_clock:
            assert claim.expires_at == before + ttl
        assert store.latest("t-new") is None
        assert store.history("t-new", limit=10) == []

    def test_live_claim_refuses_every_claim_including_its_holder(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE))
        expect(
            ThreadBusy,
            lambda: store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE)),
            thread_id="t",
            latest_checkpoint=None,
            holder=BusyHolder.Run("run-1"),
        )
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)), thread_id="t")

    def test_thread_busy_names_the_latest_checkpoint(self, harness: StoreHarness, store: Checkpointer) -> None:
        writer = Writer(store, harness, "t")
        writer.step("c1")
        writer.step("c2")
        expect(
            ThreadBusy,
            lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)),
            thread_id="t",
            latest_checkpoint="c2",
            holder=BusyHolder.Run("run-1"),
        )

    @pytest.mark.parametrize(
        ("claim_tenant", "request_tenant", "named"),
        [
            ("acme", "acme", True),
            ("acme", "other", False),
            ("acme", None, False),
            (None, "acme", False),
            (None, None, True),
        ],
        ids=["same-tenant", "other-tenant", "tenant-vs-none", "none-vs-tenant", "none-vs-none"],
    )
    def test_busy_holder_is_named_only_to_the_same_tenant(
        self,
        harness: StoreHarness,
        store: Checkpointer,
        claim_tenant: str | None,
        request_tenant: str | None,
        named: bool,
    ) -> None:
        store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE, tenant_id=claim_tenant))
        error = expect(
            ThreadBusy,
            lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick, tenant_id=request_tenant)),
        )
        assert error.holder == (BusyHolder.Run("run-1") if named else BusyHolder.UNNAMED)
        assert error.holder != BusyHolder.LAPSED

    @pytest.mark.parametrize(
        ("old_tenant", "new_tenant", "named"),
        [
            ("acme", "acme", True),
            ("acme", "other", False),
            ("acme", None, False),
            (None, "acme", False),
            (None, None, True),
        ],
        ids=["same-tenant", "other-tenant", "tenant-vs-none", "none-vs-tenant", "none-vs-none"],
    )
    def test_takeover_names_the_old_holder_only_to_the_same_tenant(
        self,
        harness: StoreHarness,
        store: Checkpointer,
        old_tenant: str | None,
        new_tenant: str | None,
        named: bool,
    ) -> None:
        store.claim("t", ClaimRequest(holder="old", ttl=harness.tick * SHORT, tenant_id=old_tenant))
        harness.advance(harness.tick * PAST_SHORT)
        claim = store.claim("t", ClaimRequest(holder="new", ttl=harness.tick * LIVE, tenant_id=new_tenant))
        assert claim.taken_over_from == ("old" if named else None)
        assert claim.holder == "new" and claim.tenant_id == new_tenant

    def test_claim_expires_at_exactly_expires_at(self, harness: StoreHarness, store: Checkpointer) -> None:
        if harness.database_clock:
            pytest.skip("needs a store clock that stops at an exact instant")
        first = store.claim("t", ClaimRequest(holder="old", ttl=harness.tick * 2))
        harness.advance(harness.tick * 2 - timedelta(microseconds=1))
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="new", ttl=harness.tick)))
        harness.advance(timedelta(microseconds=1))
        assert harness.clock.now() == first.expires_at
        claim = store.claim("t", ClaimRequest(holder="new", ttl=harness.tick))
        assert claim.taken_over_from == "old"
        assert claim.token > first.token

    def test_released_claim_is_not_taken_over(self, harness: StoreHarness, store: Checkpointer) -> None:
        first = store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE))
        store.release("t", first.token)
        second = store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick * LIVE))
        assert second.taken_over_from is None
        assert second.token > first.token

    def test_current_claim_reads_the_claim_live_or_expired_until_released_replaced_or_deleted(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        assert store.current_claim("t") is None  # never claimed
        claim = store.claim("t", ClaimRequest(holder="old", ttl=harness.tick * SHORT, tenant_id="acme"))
        for reader in stores_of(harness, store):  # every store over the storage reads the same claim
            read = reader.current_claim("t")
            assert read == claim  # holder, token, expiry (the store's clock), tenant; taken_over_from None
        harness.advance(harness.tick * PAST_SHORT)
        assert store.current_claim("t") == claim  # expired but neither released nor replaced: still there
        newer = store.claim("t", ClaimRequest(holder="new", ttl=harness.tick * LIVE))
        read = store.current_claim("t")
        assert read is not None and (read.holder, read.token, read.tenant_id) == ("new", newer.token, None)
        assert read.expires_at == newer.expires_at and read.taken_over_from is None
        store.release("t", claim.token)  # a stale release changes nothing
        assert store.current_claim("t") == read
        store.release("t", newer.token)
        assert store.current_claim("t") is None
        writer = Writer(store, harness, "t2", holder="w", ttl_ticks=LIVE)
        writer.step("c1", events=1)
        held = store.current_claim("t2")
        assert held is not None and held.token == writer.token
        store.delete_thread("t2", writer.token)
        assert store.current_claim("t2") is None  # a delete ends the claim

    def test_takeover_fences_the_old_holder(self, harness: StoreHarness, store: Checkpointer) -> None:
        old = Writer(store, harness, "t", holder="old", ttl_ticks=SHORT)
        old.step("c1", events=1)
        harness.advance(harness.tick * PAST_SHORT)
        new = Writer(store, harness, "t", holder="new")
        assert new.claim.taken_over_from == "old"
        expect(StaleClaim, lambda: old.step("c2", events=1), thread_id="t", token=old.token, current=new.token)
        expect(StaleClaim, lambda: store.renew("t", old.token, harness.tick * LIVE), thread_id="t", current=new.token)
        store.release("t", old.token)  # changes nothing
        expect(
            ThreadBusy,
            lambda: store.claim("t", ClaimRequest(holder="x", ttl=harness.tick)),
            holder=BusyHolder.Run("new"),
        )
        assert seqs(new.step("c2", events=1)) == [2]
        assert ids_of(store.history("t", limit=10)) == ["c2", "c1"]

    def test_holder_commits_and_renews_after_expiry_until_replaced(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "t", ttl_ticks=SHORT)
        writer.step("c1")
        harness.advance(harness.tick * PAST_SHORT)
        assert seqs(writer.step("c2", events=2)) == [1, 2]
        renewed = store.renew("t", writer.token, harness.tick * LIVE)
        assert renewed.token == writer.token and renewed.holder == "run-1" and renewed.thread_id == "t"
        if not harness.database_clock:
            assert renewed.expires_at == harness.clock.now() + harness.tick * LIVE
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)))

    def test_renew_extends_the_claim(self, harness: StoreHarness, store: Checkpointer) -> None:
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * 3))
        harness.advance(harness.tick * 2)
        renewed = store.renew("t", claim.token, harness.tick * 4)
        assert renewed.expires_at > claim.expires_at
        harness.advance(harness.tick * 2)  # past the first expiry, inside the renewed one
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)))

    def test_renew_refuses_a_token_that_is_not_current(self, harness: StoreHarness, store: Checkpointer) -> None:
        expect(StaleClaim, lambda: store.renew("nobody", 7, harness.tick), thread_id="nobody", token=7, current=None)
        first = store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE))
        store.release("t", first.token)
        expect(StaleClaim, lambda: store.renew("t", first.token, harness.tick), token=first.token, current=None)
        second = store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick * LIVE))
        expect(StaleClaim, lambda: store.renew("t", first.token, harness.tick), current=second.token)
        store.delete_thread("t", second.token)
        expect(StaleClaim, lambda: store.renew("t", second.token, harness.tick), current=None)

    def test_release_frees_the_thread_at_once_and_ignores_other_tokens(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        store.release("unknown", 1)  # nothing to release: fine
        claim = store.claim("t", ClaimRequest(holder="run-1", ttl=harness.tick * LIVE))
        store.release("t", claim.token + 1000)
        store.release("other", claim.token)
        expect(ThreadBusy, lambda: store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick)))
        store.release("t", claim.token)
        store.release("t", claim.token)  # twice: nothing more
        again = store.claim("t", ClaimRequest(holder="run-2", ttl=harness.tick * LIVE))
        assert again.token > claim.token
        store.release("t", claim.token)  # the old token no longer releases anything
        expect(
            ThreadBusy,
            lambda: store.claim("t", ClaimRequest(holder="run-3", ttl=harness.tick)),
            holder=BusyHolder.Run("run-2"),
        )

    # -- tokens (rule 2) -----------------------------------------------------------------------------------------------

    def test_tokens_strictly_increase_across_everything(self, harness: StoreHarness, store: Checkpointer) -> None:
        tokens: list[int] = []

        def claim(on: Checkpointer, thread_id: str, ttl_ticks: int = LIVE) -> int:
            token = on.claim(thread_id, ClaimRequest(holder=f"run-{len(tokens)}", ttl=harness.tick * ttl_ticks)).token
            tokens.append(token)
            return token

        first = claim(store, "a")
        store.release("a", first)
        claim(store, "a")  # after a release
        claim(store, "b", SHORT)
        harness.advance(harness.tick * PAST_SHORT)
        taken = claim(store, "b")  # a takeover
        writer_token = claim(store, "c")
        store.commit(
            "c", Commit(token=writer_token, events=[EventDraft(run_id="r", type="e", timestamp=harness.clock.now())])
        )
        store.delete_thread("c", writer_token)
        claim(store, "c")  # after a delete
        store.delete_thread("b", taken)
        claim(store, "b")
        if harness.shared:
            sibling = harness.sibling()
            claim(sibling, "d")  # another store over the storage
            claim(store, "e")
            claim(sibling, "f")
        if harness.reopenable:
            store = harness.reopen(store)
            claim(store, "g")  # after a restart
        assert all(later > earlier for earlier, later in itertools.pairwise(tokens)), tokens

    # -- concurrency ("several stores over one storage behave as one") ------------------------------------

    def test_concurrent_claims_have_exactly_one_winner(self, harness: StoreHarness, store: Checkpointer) -> None:
        setup = Writer(store, harness, "race", holder="setup", tenant="acme")
        setup.step("c1")
        setup.release()
        stores = stores_of(harness, store)

        def attempt(index: int) -> Any:
            try:
                return stores[index % len(stores)].claim(
                    "race", ClaimRequest(holder=f"run-{index}", ttl=harness.tick * LIVE, tenant_id="acme")
                )
            except ThreadBusy as error:
                return error

        results = in_threads(16, attempt)
        winners = [result for result in results if not isinstance(result, ThreadBusy)]
        assert len(winners) == 1, results
        winner = winners[0]
        assert winner.taken_over_from is None
        for result in results:
            if isinstance(result, ThreadBusy):
                assert (result.thread_id, result.latest_checkpoint, result.holder) == (
                    "race",
                    "c1",
                    BusyHolder.Run(winner.holder),
                )

    def test_concurrent_takeovers_have_exactly_one_winner(self, harness: StoreHarness, store: Checkpointer) -> None:
        old = Writer(store, harness, "race", holder="old", tenant="acme", ttl_ticks=SHORT)
        old.step("c1", events=1)
        harness.advance(harness.tick * PAST_SHORT)
        stores = stores_of(harness, store)

        def attempt(index: int) -> Any:
            try:
                return stores[index % len(stores)].claim(
                    "race", ClaimRequest(holder=f"run-{index}", ttl=harness.tick * LIVE, tenant_id="acme")
                )
            except ThreadBusy as error:
                return error

        results = in_threads(16, attempt)
        winners = [result for result in results if not isinstance(result, ThreadBusy)]
        assert len(winners) == 1, results
        winner = winners[0]
        assert winner.taken_over_from == "old"
        assert winner.token > old.token
        for result in results:
            if isinstance(result, ThreadBusy):
                assert result.holder == BusyHolder.Run(winner.holder)
                assert result.latest_checkpoint == "c1"
        expect(StaleClaim, lambda: old.step("c2"), thread_id="race", token=old.token, current=winner.token)
        expect(StaleClaim, lambda: old.emit(1), current=winner.token)
        expect(StaleClaim, lambda: store.renew("race", old.token, harness.tick * LIVE), current=winner.token)
        store.release("race", old.token)
        expect(
            ThreadBusy,
            lambda: store.claim("race", ClaimRequest(holder="x", ttl=harness.tick, tenant_id="acme")),
            holder=BusyHolder.Run(winner.holder),
        )
        records = store.commit(
            "race",
            Commit(
                token=winner.token, events=[EventDraft(run_id=winner.holder, type="e", timestamp=harness.clock.now())]
            ),
        )
        assert seqs(records) == [2]

    def test_concurrent_commits_number_events_contiguously(self, harness: StoreHarness, store: Checkpointer) -> None:
        stores = stores_of(harness, store)
        threads, commits = 8, 25

        def work(index: int) -> tuple[int, list[list[int]]]:
            on = stores[index % len(stores)]
            thread_id = f"conc-{index}"
            claim = on.claim(thread_id, ClaimRequest(holder=f"run-{index}", ttl=harness.tick * LIVE))
            parent = None
            numbered = []
            for step in range(commits):
                cp_id = f"{thread_id}-c{step}"
                drafts = [
                    EventDraft(run_id=f"run-{index}", type="e", timestamp=harness.clock.now(), payload=[step, k])
                    for k in range(1 + step % 3)
                ]
                cp = Checkpoint(
                    id=cp_id,
                    parent=parent,
                    thread_id=thread_id,
                    run_id=f"run-{index}",
                    status=RUNNING,
                    created_at=harness.clock.now(),
                    state={"step": step},
                )
                records = on.commit(thread_id, Commit(token=claim.token, checkpoint=cp, events=drafts))
                assert [record.token for record in records] == [claim.token] * len(drafts)
                assert [record.payload for record in records] == [[step, k] for k in range(len(drafts))]
                numbered.append(seqs(records))
                parent = cp_id
            return claim.token, numbered

        results = in_threads(threads, work)
        tokens = [token for token, _ in results]
        assert len(set(tokens)) == threads
        for index, (token, numbered) in enumerate(results):
            flat = [seq for batch in numbered for seq in batch]
            assert flat == list(range(1, len(flat) + 1)), (index, numbered)
            for batch in numbered:
                assert batch == list(range(batch[0], batch[0] + len(batch)))
            read = store.events_after(f"conc-{index}", 0, 10_000)
            assert seqs(read) == flat
            assert {record.token for record in read} == {token}
            history = store.history(f"conc-{index}", limit=1000)
            assert ids_of(history) == [f"conc-{index}-c{step}" for step in reversed(range(commits))]

