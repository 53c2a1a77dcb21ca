"""The whole store contract suite through MeteredCheckpointer, over memory and SQLite (seeds 000: the decorator
restates the whole contract, so every rule must hold unchanged through it)."""

from threadloom.persistence.metrics.metered import MeteredCheckpointer
from threadloom.persistence.queue import queue_of
from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.harness import MemoryHarness
from threadloom.testing.metered_harness import metered_harness
from threadloom.testing.sqlite_harness import SqliteHarness

MeteredMemory = metered_harness(MemoryHarness)
MeteredSqlite = metered_harness(SqliteHarness)


class TestMeteredMemoryContract(CheckpointerContract):
    harness_class = MeteredMemory


class TestMeteredSqliteContract(CheckpointerContract):
    harness_class = MeteredSqlite


def test_the_harness_wraps_every_store_and_meters_their_calls():
    harness = MeteredMemory()
    try:
        assert harness.name == "metered-memory" and metered_harness(MemoryHarness) is MeteredMemory
        store, sibling = harness.open(), harness.sibling()
        assert isinstance(store, MeteredCheckpointer) and isinstance(sibling, MeteredCheckpointer)
        assert harness.reopen(store) is store  # memory hands the same store back, wrapped as it was
        assert sibling.inner is store.inner is harness.inner_stores[0]
        store.latest("t")
        sibling.latest("t")
        assert harness.meter.snapshot().counter("threadloom_store_calls_total", op="latest") == 2
        queue = queue_of(store)  # the run queue shows through the wrapper, metered into the same meter
        assert queue.inner is store.inner.queue
        queue.entries(limit=1)
        assert harness.meter.snapshot().counter("threadloom_queue_calls_total", op="entries") == 1
    finally:
        harness.cleanup()


def test_a_reopened_durable_store_is_wrapped_too():
    harness = MeteredSqlite()
    try:
        store = harness.open()
        reopened = harness.reopen(store)
        assert store.closed and store.inner.closed
        assert isinstance(reopened, MeteredCheckpointer) and not reopened.closed
        assert reopened.meter is store.meter is harness.meter
    finally:
        harness.cleanup()
