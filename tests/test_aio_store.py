"""The async store API beyond the contract suite: task cancellation of waits, wakes without a thread per waiter,
the SQLite ``data_version`` watcher (async and blocking waits), ``open_async_store``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from threadloom.domain.errors import StoreClosed, ThreadBusy, ValidationError
from threadloom.persistence.aio import AsyncStore, open_async_store
from threadloom.persistence.base import Checkpointer
from threadloom.testing.contract._support import Writer
from threadloom.testing.harness import MemoryHarness, StoreHarness
from threadloom.testing.postgres_harness import PgHarness
from threadloom.testing.sqlite_harness import SqliteHarness

LONG = timedelta(seconds=60)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    made: StoreHarness = {"memory": MemoryHarness, "sqlite": SqliteHarness, "postgres": PgHarness}[request.param]()
    try:
        yield made
    finally:
        made.cleanup()


def _waiters(store: Checkpointer) -> int:
    return store.wakeups().waiters.count()  # type: ignore[attr-defined]


def test_cancelling_a_wait_ends_it_gives_back_its_wake_and_the_store_still_works(harness: StoreHarness) -> None:
    store = harness.open()
    writer = Writer(store, harness, "t")

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False)
        waiting = asyncio.create_task(aio.await_events_after("t", 0, 10, LONG))
        while _waiters(store) == 0:
            await asyncio.sleep(0.005)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)  # promptly: far inside the wait's 60 s
        assert _waiters(store) == 0
        again = asyncio.create_task(aio.await_events_after("t", 0, 10, LONG))
        while _waiters(store) == 0:
            await asyncio.sleep(0.005)
        records = await asyncio.to_thread(writer.emit, 2)
        assert await asyncio.wait_for(again, 10) == records
        assert _waiters(store) == 0
        await aio.close()

    asyncio.run(scenario())
    assert not store.closed


def test_many_waiters_hold_no_thread_each_and_one_commit_wakes_them_all(harness: StoreHarness) -> None:
    store = harness.open()
    writers = [Writer(store, harness, f"t{i}") for i in range(5)]

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=4)
        tasks = [asyncio.create_task(aio.await_events_after(f"t{i % 5}", 0, 10, LONG)) for i in range(200)]
        while _waiters(store) < 200:
            await asyncio.sleep(0.01)
        threads = threading.active_count()
        assert threads < 30  # 200 parked waits: the pool (4), a watcher at most, the harness's own
        await asyncio.to_thread(writers[3].emit, 1)
        woken = [task for task in tasks[3::5]]
        results = await asyncio.wait_for(asyncio.gather(*woken), 10)
        assert all(len(records) == 1 and records[0].seq == 1 for records in results)
        assert not any(task.done() for index, task in enumerate(tasks) if index % 5 != 3)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert _waiters(store) == 0
        await aio.close()

    asyncio.run(scenario())


def test_errors_are_the_stores_own(harness: StoreHarness) -> None:
    store = harness.open()
    Writer(store, harness, "t")

    async def scenario() -> None:
        aio = AsyncStore(store)
        with pytest.raises(ValidationError) as bad:
            await aio.events_after("", 0, 10)
        assert bad.value.field == "thread_id"
        with pytest.raises(ValidationError):
            await aio.await_events_after("t", 0, 10, LONG, cancel="soon")  # type: ignore[arg-type]
        from threadloom.domain.values import ClaimRequest

        with pytest.raises(ThreadBusy):
            await aio.claim("t", ClaimRequest(holder="other", ttl=timedelta(seconds=30)))
        await aio.close()
        with pytest.raises(StoreClosed):
            await aio.latest("t")
        with pytest.raises(StoreClosed):
            await aio.await_events_after("t", 0, 10, LONG)

    asyncio.run(scenario())
    assert store.closed


def test_sqlite_waits_wake_on_a_commit_from_another_store_over_the_file() -> None:
    harness = SqliteHarness()
    try:
        store, other = harness.open(), harness.sibling()
        writer = Writer(other, harness, "t")

        async def scenario() -> None:
            aio = AsyncStore(store, own_store=False)
            waiting = asyncio.create_task(aio.await_events_after("t", 0, 10, LONG))
            while _waiters(store) == 0:
                await asyncio.sleep(0.005)
            records = await asyncio.to_thread(writer.emit, 3)
            assert await asyncio.wait_for(waiting, 10) == records
            await aio.close()

        asyncio.run(scenario())
        # The blocking wait uses the same watcher: woken by the other store's commit, not by its timeout.
        found: list[object] = []
        waiting_thread = threading.Thread(target=lambda: found.extend(store.await_events_after("t", 3, 10, LONG)))
        waiting_thread.start()
        while not store.wakeups().listening():  # type: ignore[attr-defined]
            threading.Event().wait(0.005)
        records = writer.emit(1)
        waiting_thread.join(10)
        assert not waiting_thread.is_alive() and found == records
        # Nobody waits: the watcher's thread ends (the next waiter starts it again).
        deadline = time.monotonic() + 10
        while any(t.name.startswith("threadloom-sqlite-watcher") for t in threading.enumerate()):
            assert time.monotonic() < deadline
            threading.Event().wait(0.005)
        assert not store.wakeups().listening()  # type: ignore[attr-defined]
    finally:
        harness.cleanup()


def test_open_async_store_opens_by_url_and_refuses_bad_input(tmp_path: os.PathLike[str]) -> None:
    async def scenario() -> None:
        path = os.path.join(str(tmp_path), "s.db")
        async with await open_async_store(f"sqlite:///{path}", max_workers=2) as aio:
            assert aio.max_workers == 2 and aio.queue is not None
            assert await aio.latest("t") is None
        assert aio.closed
        with pytest.raises(ValidationError) as bad:
            await open_async_store("nosuch://x")
        assert bad.value.field == "url"
        with pytest.raises(ValidationError) as bad:
            await open_async_store("memory://", max_workers=0)
        assert bad.value.field == "max_workers"
        with pytest.raises(ValidationError) as bad:
            AsyncStore("memory://")  # type: ignore[arg-type]
        assert bad.value.field == "store"

    asyncio.run(scenario())


def test_a_metered_store_keeps_its_inner_stores_wake_ups() -> None:
    from threadloom import InMemoryMeter, MeteredCheckpointer

    harness = MemoryHarness()
    inner = harness.open()
    store = MeteredCheckpointer(inner, InMemoryMeter())
    writer = Writer(store, harness, "t")

    async def scenario() -> None:
        aio = AsyncStore(store)
        waiting = asyncio.create_task(aio.await_events_after("t", 0, 10, LONG))
        while _waiters(inner) == 0:  # registered with the memory store under the wrapper: no polling
            await asyncio.sleep(0.005)
        records = await asyncio.to_thread(writer.emit, 1)
        assert await asyncio.wait_for(waiting, 10) == records
        await aio.close()

    asyncio.run(scenario())
    assert store.closed and inner.closed


def test_every_contract_method_has_an_awaitable_form_with_the_same_parameters() -> None:
    import inspect

    from threadloom.persistence.aio import AsyncStore
    from threadloom.persistence.base import OPERATIONS, Checkpointer

    for name in OPERATIONS:
        method = getattr(AsyncStore, name, None)
        assert method is not None and inspect.iscoroutinefunction(method), name
        assert list(inspect.signature(method).parameters) == list(
            inspect.signature(getattr(Checkpointer, name)).parameters
        ), name
