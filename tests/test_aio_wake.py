"""One commit waking many async waiters of one thread (README "asyncio"): the waiters of one position share one
read of the events, each gets exactly the events after its own position, a cancelled waiter leaves the shared
read to the others, and an error of that read reaches every waiter; async subscriptions at different positions
each get exactly their events. Over SQLite and PostgreSQL (and memory for the store-level cases)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta

import attrs
import pytest

from threadloom import Graph, GraphRuntime, InMemoryMeter, MeteredCheckpointer, Step, ThreadDeleted
from threadloom.domain.values import EventRecord
from threadloom.persistence.aio import AsyncStore
from threadloom.persistence.base import Checkpointer
from threadloom.testing.aio_harness import wait_until
from threadloom.testing.contract._support import Writer
from threadloom.testing.harness import MemoryHarness, StoreHarness
from threadloom.testing.postgres_harness import PgHarness
from threadloom.testing.sqlite_harness import SqliteHarness

LONG = timedelta(seconds=60)
WAIT = 20  # seconds: a bound for the test, far above what any step needs
READS = "threadloom_store_calls_total"


def _harness(name: str) -> StoreHarness:
    return {"memory": MemoryHarness, "sqlite": SqliteHarness, "postgres": PgHarness}[name]()


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    made = _harness(request.param)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def durable(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    made = _harness(request.param)
    try:
        yield made
    finally:
        made.cleanup()


def _waiters(store: Checkpointer) -> int:
    return store.wakeups().waiters.count()  # type: ignore[attr-defined]


def _reads(meter: InMemoryMeter) -> float:
    return meter.snapshot().counter(READS, op="await_events_after")



def test_waiters_at_different_positions_each_get_exactly_their_events_from_one_read_per_position(
    harness: StoreHarness,
) -> None:
    inner = harness.open()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(store, harness, "t")
    writer.emit(5)
    positions = [5] * 30 + [6] * 20 + [7] * 10 + [8] * 5  # the commit brings 6, 7, 8: those at 8 wait on

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=4)
        tasks = [asyncio.create_task(aio.await_events_after("t", after, 100, LONG)) for after in positions]
        await wait_until(lambda: _waiters(inner) == len(positions), "every waiter to register")
        await wait_until(lambda: not aio._reads, "the first reads to end")
        before = _reads(meter)
        records = await asyncio.to_thread(writer.emit, 3)
        assert [record.seq for record in records] == [6, 7, 8]
        woken = [(task, after) for task, after in zip(tasks, positions, strict=True) if after < 8]
        results = await asyncio.wait_for(asyncio.gather(*(task for task, _ in woken)), WAIT)
        for (_, after), got in zip(woken, results, strict=True):
            assert got == [record for record in records if record.seq > after]
        assert len({id(got) for got in results}) == len(results)  # each waiter's own list
        # One read per woken position, not one per waiter (a spurious wake may add a round; never 60 reads). On
        # PostgreSQL the commit's notification carries its events: the waiters at 5, which they continue, may take
        # them without a read (README "asyncio"); those at 6 and 7 read.
        least = 2 if isinstance(harness, PgHarness) else 3
        assert least <= _reads(meter) - before < 20
        waiting = [task for task, after in zip(tasks, positions, strict=True) if after == 8]
        assert not any(task.done() for task in waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert _waiters(inner) == 0 and not aio._reads
        await aio.close()

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_shared_read_to_the_others_and_the_store_stays_usable(
    harness: StoreHarness,
) -> None:
    store = harness.open()
    writer = Writer(store, harness, "t")
    writer.emit(2)

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=1)
        tasks = [asyncio.create_task(aio.await_events_after("t", 2, 100, LONG)) for _ in range(10)]
        await wait_until(lambda: _waiters(store) == 10 and not aio._reads, "every waiter to wait")
        gate = threading.Event()
        blocker = asyncio.create_task(aio.call(gate.wait, WAIT))  # the pool's one thread is busy
        # Events too big for a PostgreSQL notification to carry (README "asyncio"): the woken waiters read them,
        # on every store, and share that read.
        big = [attrs.evolve(draft, payload={"pad": "x" * 9000}) for draft in writer.drafts(2)]
        records = await asyncio.to_thread(writer.commit, events=big)
        await wait_until(lambda: len(aio._reads) == 1, "the woken waiters to share a read")
        shared = next(iter(aio._reads.values()))
        await wait_until(lambda: shared.waiters == 10, "every woken waiter to join the read")
        for task in tasks[:3]:
            task.cancel()
        await asyncio.gather(*tasks[:3], return_exceptions=True)
        assert all(task.cancelled() for task in tasks[:3])
        gate.set()
        assert await blocker is True
        assert await asyncio.wait_for(asyncio.gather(*tasks[3:]), WAIT) == [records] * 7
        # Every waiter of a read still queued cancelled: the read is dropped, the next wait reads afresh.
        gate.clear()
        blocker = asyncio.create_task(aio.call(gate.wait, WAIT))
        lone = [asyncio.create_task(aio.await_events_after("t", 0, 100, LONG)) for _ in range(3)]
        await wait_until(lambda: len(aio._reads) == 1, "the waiters to share a read")
        for task in lone:
            task.cancel()
        await asyncio.gather(*lone, return_exceptions=True)
        gate.set()
        await blocker
        await wait_until(lambda: not aio._reads, "the cancelled read to end")
        assert await aio.await_events_after("t", 0, 100, LONG) == store.events_after("t", 0, 100)
        assert _waiters(store) == 0
        await aio.close()

    asyncio.run(scenario())
    assert not store.closed


def test_an_error_of_the_shared_read_reaches_every_waiter(harness: StoreHarness) -> None:
    inner = harness.open()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(store, harness, "t")
    writer.emit(3)

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=4)
        tasks = [asyncio.create_task(aio.await_events_after("t", 3, 100, LONG)) for _ in range(40)]
        await wait_until(lambda: _waiters(inner) == 40 and not aio._reads, "every waiter to wait")
        before = _reads(meter)
        await asyncio.to_thread(writer.delete)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
        assert all(isinstance(result, ThreadDeleted) and result.thread_id == "t" for result in results)
        assert _reads(meter) - before < 10  # the waiters shared the read that failed
        assert _waiters(inner) == 0
        await aio.close()

    asyncio.run(scenario())


def _tick_graph() -> Graph:
    async def tick(state: dict[str, int], ctx: object) -> Step:
        ctx.emit("tick", {"n": state.get("n", 0)})  # type: ignore[attr-defined]
        return Step.end(state)

    return Graph("tick", {"tick": tick}, entry="tick")


def test_async_subscriptions_at_different_positions_each_get_exactly_their_events(durable: StoreHarness) -> None:
    store = durable.open()
    runtime = GraphRuntime(store, node_id="wake")
    graph = _tick_graph()
    starts = [0, 1, 2, 3] * 25

    async def host() -> None:
        await (await runtime.astart("t1", graph, {"n": 1}))  # events 1..3
        subscriptions = [runtime.subscribe("t1", after) for after in starts]
        received: list[list[EventRecord]] = [[] for _ in subscriptions]

        async def consume(index: int) -> None:
            async for event in subscriptions[index]:
                received[index].append(event)

        consumers = [asyncio.create_task(consume(index)) for index in range(len(subscriptions))]
        await wait_until(lambda: all(len(got) == 3 - after for got, after in zip(received, starts, strict=True)), "replays")
        stray = asyncio.create_task(consume(0))  # a second consumer of one subscription, cancelled while parked
        await asyncio.sleep(0.01)
        stray.cancel()
        await asyncio.gather(stray, return_exceptions=True)
        await (await runtime.astart("t1", graph, {"n": 2}))  # events 4..6, one commit each turn
        await wait_until(lambda: all(len(got) == 6 - after for got, after in zip(received, starts, strict=True)), "events")
        log = store.events_after("t1", 0, 100)
        assert [event.seq for event in log] == [1, 2, 3, 4, 5, 6]
        for got, after in zip(received, starts, strict=True):
            assert got == log[after:]
        assert len(runtime._tails) == 1  # one watch of the thread on this loop for the hundred
        for subscription in subscriptions:
            subscription.cancel()
        await asyncio.wait_for(asyncio.gather(*consumers), WAIT)
        assert runtime._tails == {}

    try:
        asyncio.run(host())
    finally:
        runtime.close()


def test_a_subscription_whose_event_loop_ended_ends_with_an_error_instead_of_hanging() -> None:
    """Found by hostile testing: a subscription that had joined its loop's shared watch, consumed after that loop
    ended (``asyncio.run`` returned), waited forever. It now gets what was delivered, then an error."""
    from threadloom import GraphRuntime
    from threadloom.domain.errors import ProcessingError
    from threadloom.testing.contract._support import Writer
    from threadloom.testing.sqlite_harness import SqliteHarness

    harness = SqliteHarness()
    try:
        store = harness.open()
        runtime = GraphRuntime(store, node_id="n")
        writer = Writer(store, harness, "t")
        writer.step("c1", events=2)

        async def make():
            subscription = runtime.subscribe("t")
            while len(subscription._queue) < 2:  # its replay delivered 1 and 2; it then joins the loop's tail
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            return subscription

        subscription = asyncio.run(make())  # that loop ends here
        writer.step("c2", events=2)

        async def consume():
            got = []
            try:
                while True:
                    got.append((await asyncio.wait_for(subscription.__anext__(), 10)).seq)
            except StopAsyncIteration:
                return got, "ended"
            except ProcessingError as error:
                return got, str(error)

        got, how = asyncio.run(consume())
        runtime.close()
        assert got == [1, 2] and "event loop" in how and "stopped" in how, (got, how)
    finally:
        harness.cleanup()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_events_before_the_threads_first_checkpoint_wait_for_the_tenant_check(mode: str) -> None:
    """Found by hostile testing: a thread with events but no checkpoint (so no tenant yet) had its events delivered
    to any tenant's subscription. They now wait: the owner's subscription gets them, in order, once a checkpoint
    names its tenant; another tenant's ends with TenantMismatch having got none."""
    from threadloom import TenantMismatch

    harness = SqliteHarness()
    try:
        store = harness.open()
        runtime = GraphRuntime(store, node_id="n")

        def consume(thread_id: str, tenant: str) -> tuple[list[int], str]:
            got: list[int] = []
            if mode == "sync":
                subscription = runtime.subscribe(thread_id, tenant_id=tenant)
                try:
                    while (event := subscription.get(timedelta(seconds=5))) is not None:
                        got.append(event.seq)
                        if event.seq == 4:
                            break
                except TenantMismatch:
                    return got, "mismatch"
                finally:
                    subscription.cancel()
                return got, "ok"

            async def run() -> tuple[list[int], str]:
                subscription = runtime.subscribe(thread_id, tenant_id=tenant)
                try:
                    while True:
                        event = await asyncio.wait_for(subscription.__anext__(), 5)
                        got.append(event.seq)
                        if event.seq == 4:
                            return got, "ok"
                except TenantMismatch:
                    return got, "mismatch"
                finally:
                    subscription.cancel()

            return asyncio.run(run())

        for thread_id, tenant, expected in (("t", "acme", ([], "mismatch")), ("u", "globex", ([1, 2, 3, 4], "ok"))):
            writer = Writer(store, harness, thread_id, tenant="globex")
            writer.emit(3)  # events under globex's claim, no checkpoint yet

            def commit_checkpoint_soon(writer: Writer = writer) -> None:
                threading.Event().wait(0.5)
                writer.step("c1", events=1)  # the thread's first checkpoint, globex's, with event 4

            committer = threading.Thread(target=commit_checkpoint_soon)
            committer.start()
            try:
                assert consume(thread_id, tenant) == expected, tenant
            finally:
                committer.join()
        runtime.close()
    finally:
        harness.cleanup()


def test_an_event_handed_to_a_consumer_cancelled_before_it_resumed_goes_to_the_next_consumer() -> None:
    # A delivery hands the next event to the parked consumer's future; when that consumer's task is cancelled
    # before it runs again, the event must stay in the subscription (no gap), and is not delivered twice.
    harness = MemoryHarness()
    try:
        store = harness.open()
        runtime = GraphRuntime(store, node_id="wake")

        async def host() -> None:
            loop = asyncio.get_running_loop()
            await (await runtime.astart("t1", _tick_graph(), {"n": 1}))  # events 1..3
            subscription = runtime.subscribe("t1", 3)
            writer = Writer(store, harness, "t1")
            parked = asyncio.create_task(subscription.__anext__())
            await wait_until(lambda: bool(subscription._parked), "the consumer to park")
            writer.emit(1)  # event 4; the tail delivers it later, on this loop
            (event,) = store.events_after("t1", 3, 10)
            subscription._deliver([event], loop=loop)  # the delivery hands it to the parked consumer...
            parked.cancel()  # ...whose task is cancelled before it resumed
            with pytest.raises(asyncio.CancelledError):
                await parked
            assert (await asyncio.wait_for(subscription.__anext__(), WAIT)).seq == 4
            writer.emit(1)  # event 5
            assert (await asyncio.wait_for(subscription.__anext__(), WAIT)).seq == 5  # 4 not twice
            assert subscription.last_seq == 5
            subscription.cancel()

        asyncio.run(host())
        runtime.close()
    finally:
        harness.cleanup()


def test_an_event_loop_closed_under_a_subscription_leaves_the_store_closable(tmp_path):
    """Found by hostile testing: a loop closed (a web server's, shut down without cancelling its tasks) while an
    ``async for`` over a subscription waited on it made the next commit's wake and ``store.close()`` raise
    ``RuntimeError: Event loop is closed``, the close stopping half-way (a PostgreSQL connection left open)."""
    from threadloom import SqliteCheckpointer

    def node(state, ctx):
        ctx.emit("tick", {})
        return Step.end(state)

    graph = Graph("g", {"n": node}, entry="n")
    store = SqliteCheckpointer.open(str(tmp_path / "closed-loop.db"))
    runtime = GraphRuntime(store)
    runtime.start("t", graph, {}).wait()
    loop = asyncio.new_event_loop()
    got: list[str] = []

    async def park() -> None:
        subscription = runtime.subscribe("t")

        async def read() -> None:
            async for event in subscription:
                got.append(event.type)

        asyncio.ensure_future(read())
        await asyncio.sleep(0.2)  # replayed, then parked on the loop's shared watch

    loop.run_until_complete(park())
    loop.close()
    assert "tick" in got
    runtime.start("t", graph, {}).wait()  # its commit wakes a waiter whose loop is gone
    runtime.close()
    store.close()
    assert store.closed
