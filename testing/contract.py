"""The store contract suite: every rule of DESIGN §3 and every method paragraph of seeds 000, for any store.

A store's test module only says how to build its store::

    from threadloom.testing.contract import CheckpointerContract
    from threadloom.testing.harness import MemoryHarness

    class TestMemory(CheckpointerContract):
        harness_class = MemoryHarness

Each test gets a fresh :class:`~threadloom.testing.harness.StoreHarness` (the ``harness`` fixture), opens its
store with ``harness.open()``, reaches the same storage through ``harness.sibling()`` (tests that need a second
store skip when ``harness.shared`` is False) and moves the store's clock with ``harness.advance``. Every duration
a test's outcome depends on is a multiple of ``harness.tick``, so a store whose database decides time
(``harness.database_clock``) runs the same tests with real waits of a few ticks; the few tests that need an
exact instant (a claim at exactly its ``expires_at``) run only on a store that takes a clock.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar, cast

import attrs
import pytest

from threadloom.domain.errors import (
    CancelledError,
    CheckpointConflict,
    CheckpointNotFound,
    InvalidCommit,
    ProcessingError,
    ReplayUnavailable,
    StaleClaim,
    StoreClosed,
    ThreadBusy,
    ThreadDeleted,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.rules import DELETING_KEY
from threadloom.domain.values import (
    BusyHolder,
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    EventRecord,
    PendingWrite,
    RetentionPolicy,
    SweepPage,
    SweepPolicy,
    ThreadCursor,
    ThreadQuery,
    ThreadStatus,
)
from threadloom.persistence.base import OPERATIONS, Checkpointer
from threadloom.testing.harness import StoreHarness

__all__ = ["CheckpointerContract", "Writer", "expect", "snapshot", "sweep_all"]

LIVE = 600
"""Ticks of a claim that must stay live for the whole test."""

SHORT = 2
"""Ticks of a claim a test lets expire (it then advances :data:`PAST_SHORT` ticks)."""

PAST_SHORT = 3

WAIT = timedelta(seconds=10)
"""Timeout of an ``await_events_after`` that a commit, a delete or ``cancel`` is expected to end early."""

RESULT_TIMEOUT_S = 30.0
"""Longest a test waits for a worker thread's result before failing (a hang guard, not a speed assertion)."""

_T = TypeVar("_T")

METHODS = OPERATIONS
"""Every public method of a store but ``close``."""

RUNNING, SUSPENDED, COMPLETED, FAILED = (
    CheckpointStatus.RUNNING,
    CheckpointStatus.SUSPENDED,
    CheckpointStatus.COMPLETED,
    CheckpointStatus.FAILED,
)


# -- helpers -------------------------------------------------------------------------------------------------------


def expect(error_type: type[ThreadloomError], call: Callable[[], Any], **fields: Any) -> Any:
    """Runs ``call``, asserts it raises exactly ``error_type`` with ``fields``, and returns the error."""
    with pytest.raises(ThreadloomError) as info:
        call()
    error = info.value
    assert type(error) is error_type, f"expected {error_type.__name__}, got {type(error).__name__}: {error}"
    for name, value in fields.items():
        assert getattr(error, name) == value, f"{error_type.__name__}.{name} is {getattr(error, name)!r}, not {value!r}"
    return error


def present(value: _T | None) -> _T:
    """``value``, asserted not to be None: a read the test expects to find something."""
    assert value is not None
    return value


def outcome(call: Callable[[], Any]) -> Any:
    """The value ``call`` returns, or its threadloom error as ``(class name, fields)``, for comparisons."""
    try:
        return ("ok", call())
    except ThreadloomError as error:
        return (
            "error",
            type(error).__name__,
            attrs.asdict(cast(attrs.AttrsInstance, error), recurse=False) if attrs.has(type(error)) else str(error),
        )


def snapshot(
    store: Checkpointer,
    thread_ids: Iterable[str],
    *,
    keys: Sequence[str] = ("k1", "k2", "k-new"),
    tenants: Sequence[str | None] = (None, "acme"),
    parents: Sequence[str] = (),
) -> list[Any]:
    """Everything a reader can see of ``thread_ids`` (and the registry of ``tenants``), to compare before/after."""
    seen: list[Any] = []
    for thread_id in thread_ids:
        seen.append(("latest", thread_id, outcome(lambda: store.latest(thread_id))))
        seen.append(("history", thread_id, outcome(lambda: store.history(thread_id, limit=1000))))
        seen.append(("events", thread_id, outcome(lambda: store.events_after(thread_id, 0, 10_000))))
        for key in keys:
            seen.append(("effect", thread_id, key, outcome(lambda: store.effect(thread_id, key))))
    for tenant in tenants:
        seen.append(("threads", tenant, outcome(lambda: store.threads(ThreadQuery(tenant_id=tenant, limit=1000)))))
        seen.append(("incomplete", tenant, outcome(lambda: store.incomplete(tenant, limit=1000))))
    for parent in parents:
        seen.append(("children", parent, outcome(lambda: store.children(parent, limit=1000))))
    return seen


def sweep_all(store: Checkpointer, policy: SweepPolicy, guard: Any = None) -> list[SweepPage]:
    """One whole sweep pass: pages from the start until ``next`` is None."""
    pages: list[SweepPage] = []
    after: str | None = None
    for _ in range(100_000):
        page = store.sweep(policy, guard, after=after)
        pages.append(page)
        if page.next is None:
            return pages
        after = page.next
    raise AssertionError("the sweep never ended")


def reclaimed(pages: Sequence[SweepPage]) -> set[str]:
    return {thread_id for page in pages for thread_id in page.reclaimed}


class Writer:
    """A test's run on one thread: claims it and commits checkpoints whose parent is the latest.

    Args:
        store: the store to write through.
        harness: gives the producer's clock (``harness.clock``) and the tick.
        thread_id: the thread to claim.
        holder: the claim's RunId and the default ``run_id`` of checkpoints and events.
        tenant: the claim's tenant and the default ``tenant_id`` of checkpoints.
        ttl_ticks: the claim's ttl in ticks.
    """

    def __init__(
        self,
        store: Checkpointer,
        harness: StoreHarness,
        thread_id: str,
        *,
        holder: str = "run-1",
        tenant: str | None = None,
        ttl_ticks: int = LIVE,
    ) -> None:
        self.store = store
        self.harness = harness
        self.thread_id = thread_id
        self.holder = holder
        self.tenant = tenant
        self.claim = store.claim(thread_id, ClaimRequest(holder=holder, ttl=harness.tick * ttl_ticks, tenant_id=tenant))
        self.token = self.claim.token
        latest = store.latest(thread_id)
        self.latest: str | None = latest.checkpoint.id if latest is not None else None

    def checkpoint(
        self,
        cp_id: str,
        *,
        parent: Any = "latest",
        status: CheckpointStatus = RUNNING,
        run_id: str | None = None,
        tenant: Any = "writer",
        origin: CheckpointOrigin | None = None,
        graph_id: str = "default",
        state: Any = None,
        created_at: datetime | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Checkpoint:
        """A checkpoint of this thread (not committed), by default a child of the latest."""
        return Checkpoint(
            id=cp_id,
            parent=self.latest if parent == "latest" else parent,
            thread_id=self.thread_id,
            run_id=run_id or self.holder,
            status=status,
            created_at=created_at or self.harness.clock.now(),
            state={"step": cp_id} if state is None else state,
            graph_id=graph_id,
            tenant_id=self.tenant if tenant == "writer" else tenant,
            origin=origin,
            metadata=metadata or {},
        )

    def drafts(self, n: int, *, timestamp: datetime | None = None, type: str = "step") -> list[EventDraft]:
        """``n`` event drafts numbered in their payload."""
        ts = timestamp or self.harness.clock.now()
        return [EventDraft(run_id=self.holder, type=type, timestamp=ts, payload={"n": index}) for index in range(n)]

    def step(
        self,
        cp_id: str,
        *,
        events: int = 0,
        pending: Sequence[PendingWrite] = (),
        effects: Sequence[EffectRecord] = (),
        metadata: dict[str, str] | None = None,
        event_timestamp: datetime | None = None,
        **checkpoint: Any,
    ) -> list[EventRecord]:
        """Commits checkpoint ``cp_id`` (a child of the latest) with ``events`` drafts; returns the records."""
        cp = self.checkpoint(cp_id, **checkpoint)
        records = self.store.commit(
            self.thread_id,
            Commit(
                token=self.token,
                checkpoint=cp,
                pending_writes=pending,
                events=self.drafts(events, timestamp=event_timestamp),
                effects=effects,
                metadata=metadata,
            ),
        )
        self.latest = cp_id
        return records

    def emit(self, n: int, *, timestamp: datetime | None = None) -> list[EventRecord]:
        """Commits ``n`` events and nothing else."""
        return self.store.commit(self.thread_id, Commit(token=self.token, events=self.drafts(n, timestamp=timestamp)))

    def commit(self, **fields: Any) -> list[EventRecord]:
        """Commits ``Commit(token=self.token, **fields)``."""
        return self.store.commit(self.thread_id, Commit(token=self.token, **fields))

    def release(self) -> None:
        self.store.release(self.thread_id, self.token)

    def delete(self, fence: tuple[str, int] | None = None) -> None:
        self.store.delete_thread(self.thread_id, self.token, fence=fence)


def seqs(records: Iterable[EventRecord]) -> list[int]:
    return [record.seq for record in records]


def ids_of(checkpoints: Iterable[Checkpoint]) -> list[str]:
    return [cp.id for cp in checkpoints]


def stores_of(harness: StoreHarness, store: Checkpointer) -> list[Checkpointer]:
    """The store and, when the harness shares storage, a sibling: concurrent tests spread over both."""
    return [store, harness.sibling()] if harness.shared else [store]


def in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Runs ``work(i)`` for ``i`` in ``range(count)`` on ``count`` OS threads started together; returns results."""
    barrier = threading.Barrier(count, timeout=RESULT_TIMEOUT_S)

    def run(index: int) -> Any:
        barrier.wait()
        return work(index)

    with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(run, index) for index in range(count)]
        return [future.result(timeout=RESULT_TIMEOUT_S) for future in futures]


class RecordingGuard:
    """A sweep guard that protects fixed runs of fixed threads and records every question."""

    def __init__(self, protected: dict[str, Iterable[str]] | None = None, error: BaseException | None = None):
        self.protected_runs = {key: frozenset(value) for key, value in (protected or {}).items()}
        self.error = error
        self.calls: list[tuple[str, ...]] = []

    def protected(self, thread_ids: tuple[str, ...]) -> dict[str, frozenset[str]]:
        self.calls.append(tuple(thread_ids))
        if self.error is not None:
            raise self.error
        return {key: value for key, value in self.protected_runs.items() if key in thread_ids}


# -- the suite -------------------------------------------------------------------------------------------------------


class CheckpointerContract:
    """Every store's contract tests (DESIGN §3; seeds 000; the store paragraphs of seeds 003).

    Subclass it with ``harness_class`` set to the store's :class:`StoreHarness`; override :meth:`make_harness`
    when the harness needs arguments.
    """

    harness_class: ClassVar[type[StoreHarness]]

    def make_harness(self) -> StoreHarness:
        """A fresh harness for one test."""
        return self.harness_class()

    @pytest.fixture
    def harness(self) -> Any:
        harness = self.make_harness()
        try:
            yield harness
        finally:
            harness.cleanup()

    @pytest.fixture
    def store(self, harness: StoreHarness) -> Checkpointer:
        return harness.open()

    # -- claims (rule 1; seeds 000 claim, renew, release) ------------------------------------------------------------

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

    # -- concurrency (rules 1-4; "several stores over one storage behave as one") ------------------------------------

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

    # -- commits (rules 3-4; seeds 000 commit) -------------------------------------------------------------------------

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
        # The new checkpoint's parent must be the settled one the cut leaves as latest.
        expect(
            CheckpointConflict,
            lambda: writer.commit(checkpoint=writer.checkpoint("c4", parent="c3"), retract_turn=True),
            thread_id="t",
            expected="c3",
            actual="c1",
        )
        assert ids_of(store.history("t", limit=10)) == ["c3", "c2", "c1"]
        w4 = PendingWrite(checkpoint_id="c4", task_id="t4", node_id="n4")
        records = writer.commit(
            checkpoint=writer.checkpoint("c4", parent="c1", run_id="run-c"),
            retract_turn=True,
            pending_writes=[w4],
            events=writer.drafts(1),
        )
        assert seqs(records) == [1]
        assert ids_of(store.history("t", limit=10)) == ["c4", "c1"]
        assert store.checkpoint("t", "c2") is None and store.checkpoint("t", "c3") is None
        assert present(store.latest("t")).pending_writes == (w4,)
        assert store.lookup_run("t", ["run-b"]) is None
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
            lambda: writer.commit(checkpoint=writer.checkpoint("c3", parent="c2"), retract_turn=True),
            expected="c2",
            actual=None,
        )
        writer.commit(checkpoint=writer.checkpoint("c3", parent=None), retract_turn=True)
        assert ids_of(store.history("t", limit=10)) == ["c3"]

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

    # -- history (rule 5; seeds 000 history, checkpoint, latest) -----------------------------------------------------

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

    # -- children (seeds 000 children) -------------------------------------------------------------------------------

    def _spawn(self, harness: StoreHarness, store: Checkpointer, child: str, parent: str | None, **step: Any) -> Writer:
        writer = Writer(store, harness, child)
        origin = CheckpointOrigin(parent_thread=parent, parent_checkpoint="p1", task_id="task") if parent else None
        writer.step(f"{child}-c1", origin=origin, **step)
        return writer

    def test_children_page_oldest_first_by_first_commit(self, harness: StoreHarness, store: Checkpointer) -> None:
        Writer(store, harness, "P").step("p1")
        for child in ("kid-2", "kid-1", "kid-3", "kid-0"):
            self._spawn(harness, store, child, "P")
            harness.advance(harness.tick)
        assert store.children("P", limit=10) == ["kid-2", "kid-1", "kid-3", "kid-0"]
        assert store.children("P", limit=2) == ["kid-2", "kid-1"]
        assert store.children("P", limit=2, after="kid-1") == ["kid-3", "kid-0"]
        assert store.children("P", limit=2, after="kid-0") == []
        assert store.children("childless", limit=10) == []
        assert store.children("kid-2", limit=10) == []

    def test_children_follow_the_latest_origin(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: self._spawn(harness, store, name, "P") for name in ("k1", "k2", "k3")}
        kids["k2"].step("k2-c2", origin=CheckpointOrigin(parent_thread="Q"))  # re-parented
        kids["k3"].step("k3-c2", origin=None)  # no parent any more
        assert store.children("P", limit=10) == ["k1"]
        assert store.children("Q", limit=10) == ["k2"]
        kids["k3"].step("k3-c3", origin=CheckpointOrigin(parent_thread="P"))  # back: keeps its first place
        assert store.children("P", limit=10) == ["k1", "k3"]
        assert store.children("P", limit=10, after="k1") == ["k3"]

    def test_children_limit_below_one_reads_none(self, harness: StoreHarness, store: Checkpointer) -> None:
        self._spawn(harness, store, "k1", "P")
        assert store.children("P", limit=0) == []
        assert store.children("P", limit=-3) == []

    def test_deleted_child_is_not_listed_but_keeps_its_place(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: self._spawn(harness, store, name, "P", events=1) for name in ("k1", "k2", "k3")}
        kids["k2"].delete()
        assert store.children("P", limit=10) == ["k1", "k3"]
        assert store.children("P", limit=10, after="k2") == ["k3"]
        assert store.children("P", limit=1) == ["k1"]
        assert store.children("P", limit=1, after="k1") == ["k3"]

    def test_children_refuse_an_unknown_after(self, harness: StoreHarness, store: Checkpointer) -> None:
        self._spawn(harness, store, "k1", "P")
        self._spawn(harness, store, "other", "Q")
        expect(ValidationError, lambda: store.children("P", limit=10, after="never"), field="after")
        expect(ValidationError, lambda: store.children("P", limit=10, after="other"), field="after")
        expect(ValidationError, lambda: store.children("nobody", limit=10, after="k1"), field="after")

    def test_reclaimed_child_tombstone_loses_its_place(self, harness: StoreHarness, store: Checkpointer) -> None:
        kids = {name: self._spawn(harness, store, name, "P", events=1) for name in ("k1", "k2", "k3")}
        kids["k2"].delete()
        harness.advance(harness.tick * PAST_SHORT)
        pages = sweep_all(store, SweepPolicy(tombstone_age=harness.tick))
        assert "k2" in reclaimed(pages)
        expect(ValidationError, lambda: store.children("P", limit=10, after="k2"), field="after")
        assert store.children("P", limit=10) == ["k1", "k3"]

    # -- events (rule 4; seeds 000 eventsAfter, compactEvents) ------------------------------------------------------

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

    # -- waiting for events (rule 11; seeds 000 awaitEventsAfter) -------------------------------------------------

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

    # -- deletes and tombstones (rule 6; seeds 000 deleteThread) ---------------------------------------------------

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

    # -- effects and run lookup (seeds 000 effect, lookupRun) -------------------------------------------------------

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

    # -- prune (seeds 000 prune; rule 7) ---------------------------------------------------------------------------

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
        writer = Writer(store, harness, "t")
        future = harness.clock.now() + timedelta(days=5)
        past = harness.clock.now() - timedelta(days=5)
        writer.step("c1", events=1, created_at=future, event_timestamp=future)  # look young, are old
        writer.step("c2", events=1, created_at=future, event_timestamp=future)
        harness.advance(harness.tick * PAST_SHORT)
        writer.step("c3", events=1, created_at=past, event_timestamp=past)  # look old, are young
        writer.step("c4", events=1, created_at=past, event_timestamp=past)
        store.prune("t", RetentionPolicy(max_age=harness.tick * SHORT))
        assert ids_of(store.history("t", limit=10)) == ["c4", "c3"]
        assert seqs(store.events_after("t", 2, 10)) == [3, 4]
        expect(ReplayUnavailable, lambda: store.events_after("t", 0, 10), earliest_seq=3)

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

    # -- sweep (seeds 000 sweep; rule 6) ---------------------------------------------------------------------------

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

    # -- the registry (seeds 000 threads, incomplete) -------------------------------------------------------------

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

    # -- stores over one storage; restarts (DESIGN §3; seeds 003) --------------------------------------------------

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

    # -- bad input and closed stores (DESIGN §2, rule 12) -----------------------------------------------------------

    def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
        self, harness: StoreHarness, store: Checkpointer
    ) -> None:
        writer = Writer(store, harness, "a", tenant="acme")
        writer.step("c1", events=2, effects=[EffectRecord(key="k1", run_id="run-1", recorded_at=harness.clock.now())])
        self._spawn(harness, store, "kid", "a")
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


# -- call tables -------------------------------------------------------------------------------------------------------


def valid_call(method: str, harness: StoreHarness, writer: Writer) -> Callable[[Checkpointer], Any]:
    """A call of ``method`` with valid arguments, on thread ``writer.thread_id`` (for the closed-store test)."""
    tid, token, now = writer.thread_id, writer.token, harness.clock.now()
    calls: dict[str, Callable[[Checkpointer], Any]] = {
        "claim": lambda s: s.claim("other", ClaimRequest(holder="r", ttl=harness.tick)),
        "renew": lambda s: s.renew(tid, token, harness.tick),
        "release": lambda s: s.release(tid, token),
        "commit": lambda s: s.commit(
            tid, Commit(token=token, events=[EventDraft(run_id="r", type="e", timestamp=now)])
        ),
        "latest": lambda s: s.latest(tid),
        "checkpoint": lambda s: s.checkpoint(tid, "c1"),
        "history": lambda s: s.history(tid, limit=10),
        "children": lambda s: s.children(tid, limit=10),
        "events_after": lambda s: s.events_after(tid, 0, 10),
        "await_events_after": lambda s: s.await_events_after(tid, 0, 10, timedelta(milliseconds=10)),
        "compact_events": lambda s: s.compact_events(tid, 1),
        "delete_thread": lambda s: s.delete_thread(tid, token),
        "effect": lambda s: s.effect(tid, "k"),
        "lookup_run": lambda s: s.lookup_run(tid, ["r"]),
        "prune": lambda s: s.prune(tid, RetentionPolicy(max_checkpoints=1)),
        "sweep": lambda s: s.sweep(SweepPolicy(), None),
        "threads": lambda s: s.threads(ThreadQuery(tenant_id=None)),
        "incomplete": lambda s: s.incomplete(None, limit=10),
    }
    return calls[method]


def bad_input_cases(harness: StoreHarness, writer: Writer) -> list[tuple[str, Callable[[Checkpointer], Any], str]]:
    """``(name, call, field)``: each call passes one bad argument to a store method on thread ``a``."""
    tid, token, now, tick = writer.thread_id, writer.token, harness.clock.now(), harness.tick
    req = ClaimRequest(holder="r", ttl=tick)
    good_cp = writer.checkpoint("c2")
    bad_ids: list[tuple[str, Any]] = [
        ("empty", ""),
        ("too-long", "x" * 256),
        ("nul", "a\x00b"),
        ("surrogate", "a\ud800"),
        ("not-str", 7),
        ("none", None),
        ("bytes", b"a"),
    ]
    # The calls pass ill-typed values on purpose, so their store is typed Any (and lambdas bind loop values).
    cases: list[tuple[str, Callable[..., Any], str]] = []
    for label, bad in bad_ids:
        cases += [
            (f"claim thread_id {label}", lambda s, b=bad: s.claim(b, req), "thread_id"),
            (f"latest thread_id {label}", lambda s, b=bad: s.latest(b), "thread_id"),
            (f"commit thread_id {label}", lambda s, b=bad: s.commit(b, Commit(token=token)), "thread_id"),
            (f"checkpoint id {label}", lambda s, b=bad: s.checkpoint(tid, b), "checkpoint_id"),
            (f"children parent {label}", lambda s, b=bad: s.children(b, limit=1), "parent"),
            (f"effect key {label}", lambda s, b=bad: s.effect(tid, b), "key"),
            (f"delete_thread thread_id {label}", lambda s, b=bad: s.delete_thread(b, token), "thread_id"),
            (f"events_after thread_id {label}", lambda s, b=bad: s.events_after(b, 0, 1), "thread_id"),
            (f"prune thread_id {label}", lambda s, b=bad: s.prune(b, RetentionPolicy(max_checkpoints=1)), "thread_id"),
        ]
        if bad is not None:
            cases += [
                (f"history before {label}", lambda s, b=bad: s.history(tid, limit=1, before=b), "before"),
                (f"children after {label}", lambda s, b=bad: s.children(tid, limit=1, after=b), "after"),
                (f"sweep after {label}", lambda s, b=bad: s.sweep(SweepPolicy(), None, after=b), "after"),
                (f"incomplete tenant {label}", lambda s, b=bad: s.incomplete(b, limit=1), "tenant_id"),
                (f"lookup_run item {label}", lambda s, b=bad: s.lookup_run(tid, ["ok", b]), "run_ids item"),
            ]
    bad_tokens = [("zero", 0), ("negative", -1), ("bool", True), ("str", "1"), ("float", 1.0), ("none", None)]
    for label, bad in bad_tokens:
        cases += [
            (f"renew token {label}", lambda s, b=bad: s.renew(tid, b, tick), "token"),
            (f"release token {label}", lambda s, b=bad: s.release(tid, b), "token"),
            (f"delete_thread token {label}", lambda s, b=bad: s.delete_thread(tid, b), "token"),
        ]
    for label, bad in [("zero", timedelta(0)), ("negative", -tick), ("seconds", 5), ("none", None)]:
        cases.append((f"renew ttl {label}", lambda s, b=bad: s.renew(tid, token, b), "ttl"))
    for label, bad in [("zero", 0), ("too-many", 1001), ("str", "3"), ("none", None), ("bool", True)]:
        cases += [
            (f"history limit {label}", lambda s, b=bad: s.history(tid, limit=b), "limit"),
            (f"incomplete limit {label}", lambda s, b=bad: s.incomplete("acme", limit=b), "limit"),
        ]
    for label, bad in [("too-many", 1001), ("str", "3"), ("none", None), ("float", 2.0)]:
        cases.append((f"children limit {label}", lambda s, b=bad: s.children(tid, limit=b), "limit"))
    for label, bad in [("zero", 0), ("too-many", 10_001), ("str", "3")]:
        cases += [
            (f"events_after limit {label}", lambda s, b=bad: s.events_after(tid, 0, b), "limit"),
            (f"await limit {label}", lambda s, b=bad: s.await_events_after(tid, 0, b, timedelta(0)), "limit"),
        ]
    for label, bad in [("negative", -1), ("str", "0"), ("none", None), ("float", 0.0)]:
        cases += [
            (f"events_after after_seq {label}", lambda s, b=bad: s.events_after(tid, b, 1), "after_seq"),
            (f"await after_seq {label}", lambda s, b=bad: s.await_events_after(tid, b, 1, timedelta(0)), "after_seq"),
            (f"compact before_seq {label}", lambda s, b=bad: s.compact_events(tid, b), "before_seq"),
        ]
    cases += [
        ("claim request not a request", lambda s: s.claim(tid, {"holder": "r"}), "request"),
        ("claim request none", lambda s: s.claim(tid, None), "request"),
        ("await timeout negative", lambda s: s.await_events_after(tid, 0, 1, -tick), "timeout"),
        ("await timeout seconds", lambda s: s.await_events_after(tid, 0, 1, 1.0), "timeout"),
        ("await cancel not an event", lambda s: s.await_events_after(tid, 0, 1, timedelta(0), cancel="x"), "cancel"),
        ("commit not a commit", lambda s: s.commit(tid, {"token": token}), "commit"),
        ("commit none", lambda s: s.commit(tid, None), "commit"),
        (
            "commit checkpoint of another thread",
            lambda s: s.commit(tid, Commit(token=token, checkpoint=attrs.evolve(good_cp, thread_id="zzz"))),
            "commit.checkpoint.thread_id",
        ),
        (
            "commit checkpoint with another token",
            lambda s: s.commit(tid, Commit(token=token, checkpoint=attrs.evolve(good_cp, fencing_token=token + 1))),
            "commit.checkpoint.fencing_token",
        ),
        (
            "commit checkpoint its own parent",
            lambda s: s.commit(tid, Commit(token=token, checkpoint=attrs.evolve(good_cp, parent="c2"))),
            "commit.checkpoint.parent",
        ),
        (
            "commit fenced by its own thread",
            lambda s: s.commit(tid, Commit(token=token, fence=(tid, token))),
            "commit.fence",
        ),
        (
            "commit duplicate effect keys",
            lambda s: s.commit(
                tid,
                Commit(
                    token=token,
                    effects=[
                        EffectRecord(key="k9", run_id="r", recorded_at=now),
                        EffectRecord(key="k9", run_id="r", recorded_at=now),
                    ],
                ),
            ),
            "commit.effects",
        ),
        ("delete fence not a pair", lambda s: s.delete_thread(tid, token, fence=("b",)), "fence"),
        ("delete fence a list", lambda s: s.delete_thread(tid, token, fence=["b", 1]), "fence"),
        ("delete fence itself", lambda s: s.delete_thread(tid, token, fence=(tid, token)), "fence"),
        ("delete fence thread empty", lambda s: s.delete_thread(tid, token, fence=("", 1)), "fence thread_id"),
        ("delete fence token zero", lambda s: s.delete_thread(tid, token, fence=("b", 0)), "fence token"),
        ("lookup_run a str", lambda s: s.lookup_run(tid, "run-1"), "run_ids"),
        ("lookup_run none", lambda s: s.lookup_run(tid, None), "run_ids"),
        ("lookup_run an int", lambda s: s.lookup_run(tid, 5), "run_ids"),
        ("prune policy none", lambda s: s.prune(tid, None), "policy"),
        ("prune policy a sweep policy", lambda s: s.prune(tid, SweepPolicy()), "policy"),
        ("sweep policy a retention policy", lambda s: s.sweep(RetentionPolicy(), None), "policy"),
        ("sweep guard without protected", lambda s: s.sweep(SweepPolicy(), object()), "guard"),
        ("threads query not a query", lambda s: s.threads({"tenant_id": None}), "query"),
        ("threads query none", lambda s: s.threads(None), "query"),
        ("incomplete after not a cursor", lambda s: s.incomplete("acme", limit=1, after="x"), "after"),
        # Values no store can keep (found by hostile testing): refused before anything is read or written.
        (
            "claim ttl beyond 100 years",
            lambda s: s.claim("huge", _unchecked(ClaimRequest(holder="r", ttl=tick), ttl=timedelta.max)),
            "request.ttl",
        ),
        ("renew ttl beyond 100 years", lambda s: s.renew(tid, token, timedelta.max), "ttl"),
        ("renew token beyond 64 bits", lambda s: s.renew(tid, 2**63, tick), "token"),
        ("release token beyond 64 bits", lambda s: s.release(tid, 2**70), "token"),
        ("delete token beyond 64 bits", lambda s: s.delete_thread(tid, 2**63), "token"),
        ("compact before_seq beyond 64 bits", lambda s: s.compact_events(tid, 2**63), "before_seq"),
        ("events_after after_seq beyond 64 bits", lambda s: s.events_after(tid, 2**64, 1), "after_seq"),
        ("await timeout beyond 100 years", lambda s: s.await_events_after(tid, 0, 1, timedelta.max), "timeout"),
        (
            "commit event payload with a 5000-digit integer",
            lambda s: s.commit(tid, Commit(token=token, checkpoint=good_cp, events=[
                _unchecked(writer.drafts(1)[0], payload={"x": 10**5000})])),
            "event.payload",
        ),
        (
            "commit pending write with a 5000-digit integer",
            lambda s: s.commit(tid, Commit(token=token, checkpoint=good_cp, pending_writes=[
                _unchecked(PendingWrite(checkpoint_id="c2", task_id="t", node_id="n"), payload=-(10**5000))])),
            "pending_write.payload",
        ),
        (
            "sweep guard answering a str of runs",
            lambda s: s.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=1)), _StrGuard()),
            "guard",
        ),
    ]
    return cases


class _StrGuard:
    """A guard whose answer names its runs as one ``str`` — not a collection of run ids."""

    def protected(self, thread_ids: tuple[str, ...]) -> dict[str, str]:
        return {thread_id: "run-1" for thread_id in thread_ids}


def _unchecked(value: Any, **fields: Any) -> Any:
    """``value`` with ``fields`` set, bypassing its validators: how a caller's later mutation reaches a store."""
    changed = attrs.evolve(value)
    for name, item in fields.items():
        object.__setattr__(changed, name, item)
    return changed
