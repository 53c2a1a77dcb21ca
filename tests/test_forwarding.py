"""ForwardingCheckpointer, the base of every wrapper: the whole contract through a bare one (memory, SQLite), one
validation per call however many wrappers a call passes, the one seam, and the run queue shown through; and
ForwardingRunQueue, the same for the run queue (its contract runs through a bare one in test_queue_contract)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from threadloom.domain import validation
from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import StoreClosed, ValidationError
from threadloom.domain.values import ClaimRequest, Commit, EventDraft
from threadloom.persistence import base
from threadloom.persistence.base import OPERATIONS, Checkpointer, StoreBase
from threadloom.persistence.forwarding import ForwardingCheckpointer, ForwardingRunQueue
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.metrics.meter import InMemoryMeter
from threadloom.persistence.metrics.metered import ERRORS, MeteredCheckpointer
from threadloom.persistence.metrics.metered_queue import MeteredRunQueue
from threadloom.persistence.queue import QUEUE_OPERATIONS, QueueBase, RunQueue, queue_of
from threadloom.simulations.store import SimQueue, SimStore
from threadloom.testing.contract import CheckpointerContract, Writer, valid_call
from threadloom.testing.harness import START, AlternatingCheckpointer, MemoryHarness, wrapping_harness
from threadloom.testing.sqlite_harness import ReopeningCheckpointer, SqliteHarness

ForwardingMemory = wrapping_harness(MemoryHarness)
ForwardingSqlite = wrapping_harness(SqliteHarness)


class TestForwardingMemoryContract(CheckpointerContract):
    harness_class = ForwardingMemory


class TestForwardingSqliteContract(CheckpointerContract):
    harness_class = ForwardingSqlite


WRAPPERS = (ForwardingCheckpointer, MeteredCheckpointer, SimStore, AlternatingCheckpointer, ReopeningCheckpointer)


def test_the_harness_wraps_every_store_in_a_bare_forwarding_checkpointer():
    harness = ForwardingMemory()
    try:
        assert harness.name == "forwarding-memory" and wrapping_harness(MemoryHarness) is ForwardingMemory
        store, sibling = harness.open(), harness.sibling()
        assert type(store) is ForwardingCheckpointer and sibling is store  # memory's sibling is the store itself
        assert store.inner is harness.inner_stores[0]
    finally:
        harness.cleanup()


# -- the class structure -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda cls: cls.__name__)
def test_no_wrapper_implements_a_store_hook_and_none_overrides_attribute_lookup(wrapper: type) -> None:
    assert issubclass(wrapper, Checkpointer) and issubclass(wrapper, ForwardingCheckpointer)
    assert not issubclass(wrapper, StoreBase)
    hooks = [f"_{op}" for op in OPERATIONS] + ["_close"]
    assert [hook for hook in hooks if hasattr(wrapper, hook)] == []
    assert wrapper.__getattribute__ is object.__getattribute__


def test_stores_and_wrappers_alike_are_checkpointers():
    inner = InMemoryCheckpointer()
    wrapped = MeteredCheckpointer(ForwardingCheckpointer(inner))
    assert isinstance(inner, StoreBase) and isinstance(inner, Checkpointer)
    assert isinstance(wrapped, Checkpointer) and not isinstance(wrapped, StoreBase)
    with pytest.raises(TypeError):
        Checkpointer()  # type: ignore[abstract]  # the contract alone is abstract
    wrapped.close()
    assert inner.closed


def test_a_wrapper_refuses_what_is_not_a_store():
    with pytest.raises(ValidationError) as caught:
        ForwardingCheckpointer("memory://")  # type: ignore[arg-type]
    assert caught.value.field == "inner"


# -- validated once ----------------------------------------------------------------------------------------------


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Counts the calls of ``module.name`` (the real function still runs)."""
    calls = [0]
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def _chains(inner: InMemoryCheckpointer) -> dict[str, Checkpointer]:
    return {
        "forwarding": ForwardingCheckpointer(inner),
        "metered": MeteredCheckpointer(inner),
        "metered over forwarding": MeteredCheckpointer(ForwardingCheckpointer(inner)),
        "pair": AlternatingCheckpointer(inner, inner),
    }


def test_one_commit_through_any_chain_of_wrappers_is_checked_once(monkeypatch: pytest.MonkeyPatch):
    checks = _counting(monkeypatch, base, "check_commit")
    inner = InMemoryCheckpointer(ManualClock(START))
    for name, store in _chains(inner).items():
        thread = f"t-{name}"
        claim = store.claim(thread, ClaimRequest(holder="run-1", ttl=timedelta(seconds=30)))
        before = checks[0]
        records = store.commit(
            thread, Commit(token=claim.token, events=[EventDraft(run_id="run-1", type="e", timestamp=START)])
        )
        assert [r.seq for r in records] == [1], name
        assert checks[0] - before == 1, name


def test_a_bad_argument_is_refused_once_by_the_store_at_the_end(monkeypatch: pytest.MonkeyPatch):
    ids = _counting(monkeypatch, validation, "check_id")
    inner = InMemoryCheckpointer()
    meter = InMemoryMeter()
    outer = MeteredCheckpointer(ForwardingCheckpointer(MeteredCheckpointer(inner, meter)), meter)
    outer.latest("t")
    assert ids[0] == 1  # one thread id, checked once, by the store
    with pytest.raises(ValidationError) as caught:
        outer.latest("")
    assert caught.value.field == "thread_id"
    assert ids[0] == 2
    # both meters saw the same single error pass through them; neither raised one of its own
    assert meter.snapshot().counter(ERRORS, op="latest", error="ValidationError") == 2


# -- the seam ----------------------------------------------------------------------------------------------------


class Recording(ForwardingCheckpointer):
    """Records every call that passes through the one seam."""

    def __init__(self, inner: Checkpointer) -> None:
        super().__init__(inner)
        self.seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self.seen.append((operation, args, kwargs))
        return super()._forward(operation, *args, **kwargs)


@pytest.mark.parametrize("method", OPERATIONS)
def test_every_operation_passes_the_seam_with_the_callers_arguments(method: str):
    harness = MemoryHarness()
    try:
        inner = harness.open()
        writer = Writer(inner, harness, "a")
        writer.step("c1", events=1)
        store = Recording(inner)
        valid_call(method, harness, writer)(store)
        assert [op for op, _, _ in store.seen] == [method]
        _, args, kwargs = store.seen[0]
        if method in ("history", "children"):
            assert args == ("a",) and kwargs == {"limit": 10, "before" if method == "history" else "after": None}
        elif method == "delete_thread":
            assert args == ("a", writer.token) and kwargs == {"fence": None}
    finally:
        harness.cleanup()


def test_a_closed_wrapper_closes_its_store_and_every_call_is_refused_by_it():
    inner = InMemoryCheckpointer()
    with ForwardingCheckpointer(inner) as wrapped:
        wrapped.latest("t")
    assert wrapped.closed and inner.closed
    wrapped.close()  # twice: nothing
    with pytest.raises(StoreClosed) as caught:
        wrapped.latest("t")
    assert caught.value.operation == "latest"


# -- the run queue -----------------------------------------------------------------------------------------------


def test_the_run_queue_is_declared_on_the_contract_and_shown_through_wrappers():
    assert Checkpointer.queue is None  # a store without one says so
    inner = InMemoryCheckpointer()
    assert inner.queue is not None
    forwarding = ForwardingCheckpointer(inner)
    assert forwarding.queue is inner.queue and queue_of(forwarding) is inner.queue
    metered = MeteredCheckpointer(ForwardingCheckpointer(inner))
    assert queue_of(metered) is metered.queue and metered.queue.inner is inner.queue  # metered, same queue
    pair = AlternatingCheckpointer(inner, inner)
    assert pair.queue is None  # calls alternate between stores: there is no one queue to show
    with pytest.raises(ValidationError):
        queue_of(pair)


QUEUE_WRAPPERS = (ForwardingRunQueue, SimQueue, MeteredRunQueue)


@pytest.mark.parametrize("wrapper", QUEUE_WRAPPERS, ids=lambda cls: cls.__name__)
def test_no_queue_wrapper_implements_a_queue_hook_and_none_overrides_attribute_lookup(wrapper: type) -> None:
    assert issubclass(wrapper, RunQueue) and issubclass(wrapper, ForwardingRunQueue)
    assert not issubclass(wrapper, QueueBase)
    assert [hook for hook in (f"_{op}" for op in QUEUE_OPERATIONS) if hasattr(wrapper, hook)] == []
    assert wrapper.__getattribute__ is object.__getattribute__


def test_every_store_queue_is_a_queue_base_and_a_wrapper_refuses_what_is_not_a_queue():
    inner = InMemoryCheckpointer()
    assert isinstance(inner.queue, QueueBase)
    with pytest.raises(TypeError):
        RunQueue()  # type: ignore[abstract]  # the contract alone is abstract
    with pytest.raises(ValidationError) as caught:
        ForwardingRunQueue(inner)  # type: ignore[arg-type]  # a store, not its queue
    assert caught.value.field == "inner"


class RecordingQueue(ForwardingRunQueue):
    """Records every queue call that passes through the one seam."""

    def __init__(self, inner: RunQueue) -> None:
        super().__init__(inner)
        self.seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self.seen.append((operation, args, kwargs))
        return super()._forward(operation, *args, **kwargs)


def test_every_queue_call_passes_the_seam_once_with_the_callers_arguments_and_is_checked_once_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
):
    ids = _counting(monkeypatch, validation, "check_id")
    inner = InMemoryCheckpointer(ManualClock(START))
    assert inner.queue is not None
    queue = RecordingQueue(ForwardingRunQueue(inner.queue))
    entry = queue.enqueue("t", graph_id="g", input={"n": 1})
    assert ids[0] == 2  # thread_id and graph_id, each checked once, by the store's queue
    lease = queue.lease("worker", timedelta(seconds=30), graph_ids=["g"])
    assert lease is not None and lease.entry.entry_id == entry.entry_id
    queue.renew_lease(entry.entry_id, lease.attempt, timedelta(seconds=30))
    queue.record_run(entry.entry_id, lease.attempt, "run-1")
    assert queue.open_runs(["t"]) == {"t": frozenset({"run-1"})}
    assert queue.entry(entry.entry_id) is not None and len(queue.entries(limit=5)) == 1
    queue.finish(entry.entry_id, lease.attempt, error=None)
    queue.release_lease(entry.entry_id, lease.attempt)
    assert queue.take_lease(entry.entry_id, "op", timedelta(seconds=30)) is None  # finished
    assert queue.retry(entry.entry_id) is None  # completed, not failed
    assert queue.purge(timedelta(seconds=30), limit=5).visited == 1
    assert queue.depth().open == 0
    assert [op for op, _, _ in queue.seen] == [
        "enqueue", "lease", "renew_lease", "record_run", "open_runs", "entry", "entries", "finish", "release_lease",
        "take_lease", "retry", "purge", "depth",
    ]
    assert {op for op, _, _ in queue.seen} == set(QUEUE_OPERATIONS)
    assert queue.seen[0] == ("enqueue", ("t",), {"graph_id": "g", "input": {"n": 1}, "tenant_id": None,
                                                 "delay": timedelta(0)})
    assert queue.seen[1] == ("lease", ("worker", timedelta(seconds=30)), {"graph_ids": ["g"]})
    with pytest.raises(ValidationError) as caught:
        queue.enqueue("", graph_id="g")
    assert caught.value.field == "thread_id"
    inner.close()
    assert queue.closed
    with pytest.raises(StoreClosed) as closed:
        queue.entry(entry.entry_id)
    assert closed.value.operation == "entry"
