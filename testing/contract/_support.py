"""What the contract suite's rule groups share: constants, helpers, the recording writer and call tables."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

import attrs
import pytest

from threadloom.domain.errors import (
    ThreadloomError,
)
from threadloom.domain.values import (
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
    ThreadQuery,
)
from threadloom.persistence.base import OPERATIONS, Checkpointer
from threadloom.testing.harness import StoreHarness

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

    def tagged(self, cp_id: str, metadata: dict[str, str]) -> None:
        """Commits checkpoint ``cp_id`` (a child of the latest) whose own ``metadata`` is ``metadata``."""
        cp = self.checkpoint(cp_id, metadata=metadata)
        self.store.commit(self.thread_id, Commit(token=self.token, checkpoint=cp))
        self.latest = cp_id

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


def spawn_child(harness: StoreHarness, store: Checkpointer, child: str, parent: str | None, **step: Any) -> Writer:
    """A child thread ``child`` of ``parent`` (None: a root) with one committed step; its writer."""
    writer = Writer(store, harness, child)
    origin = CheckpointOrigin(parent_thread=parent, parent_checkpoint="p1", task_id="task") if parent else None
    writer.step(f"{child}-c1", origin=origin, **step)
    return writer


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



# -- call tables -------------------------------------------------------------------------------------------------------


def valid_call(method: str, harness: StoreHarness, writer: Writer) -> Callable[[Checkpointer], Any]:
    """A call of ``method`` with valid arguments, on thread ``writer.thread_id`` (for the closed-store test)."""
    tid, token, now = writer.thread_id, writer.token, harness.clock.now()
    calls: dict[str, Callable[[Checkpointer], Any]] = {
        "claim": lambda s: s.claim("other", ClaimRequest(holder="r", ttl=harness.tick)),
        "renew": lambda s: s.renew(tid, token, harness.tick),
        "release": lambda s: s.release(tid, token),
        "current_claim": lambda s: s.current_claim(tid),
        "commit": lambda s: s.commit(
            tid, Commit(token=token, events=[EventDraft(run_id="r", type="e", timestamp=now)])
        ),
        "latest": lambda s: s.latest(tid),
        "checkpoint": lambda s: s.checkpoint(tid, "c1"),
        "history": lambda s: s.history(tid, limit=10),
        "search_history": lambda s: s.search_history(tid, metadata={"k": "v"}, limit=10),
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
        "tenants": lambda s: s.tenants(limit=10),
        "stamp_thread": lambda s: s.stamp_thread(tid),
        "graph_threads": lambda s: s.graph_threads("default", limit=10),
        "token_high_water": lambda s: s.token_high_water(),
        "heartbeat": lambda s: s.heartbeat("g#access", "m", ["default@a1"], harness.tick),
        "members": lambda s: s.members("g#access"),
        "tenant_history": lambda s: s.tenant_history(tid, None, limit=10),
        "tenant_events_after": lambda s: s.tenant_events_after(tid, None, 0, 10),
        "export_tenant": lambda s: s.export_tenant(None, limit=10),
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
                (
                    f"search before {label}",
                    lambda s, b=bad: s.search_history(tid, metadata={}, limit=1, before=b),
                    "before",
                ),
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
            (f"search limit {label}", lambda s, b=bad: s.search_history(tid, metadata={}, limit=b), "limit"),
            (f"search scan {label}", lambda s, b=bad: s.search_history(tid, metadata={}, limit=1, scan=b), "scan"),
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
        ("search metadata not a mapping", lambda s: s.search_history(tid, metadata=[("k", "v")], limit=1), "metadata"),
        ("search metadata none", lambda s: s.search_history(tid, metadata=None, limit=1), "metadata"),
        ("search metadata int value", lambda s: s.search_history(tid, metadata={"k": 1}, limit=1), "metadata['k']"),
        ("search metadata none value", lambda s: s.search_history(tid, metadata={"k": None}, limit=1), "metadata['k']"),
        ("search metadata int key", lambda s: s.search_history(tid, metadata={1: "v"}, limit=1), "metadata key"),
        ("search metadata nul key", lambda s: s.search_history(tid, metadata={"a\x00": "v"}, limit=1), "metadata key"),
        (
            "search metadata surrogate value",
            lambda s: s.search_history(tid, metadata={"k": "\ud800"}, limit=1),
            "metadata['k']",
        ),
        (
            "search metadata too many keys",
            lambda s: s.search_history(tid, metadata={f"k{i}": "v" for i in range(65)}, limit=1),
            "metadata",
        ),
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

