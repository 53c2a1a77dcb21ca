"""PostgreSQL: a commit's notification carries its events when they fit (README "asyncio"). An async waiter whose
position they continue gets them without a read, equal to what a read returns; a commit too big for a
notification, a waiter they do not continue, and a notification that does not decode each fall back to a read;
async subscriptions of one thread, joined at different times, each get exactly their events in order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from threadloom import GraphRuntime, InMemoryMeter, MeteredCheckpointer
from threadloom.domain.values import EventDraft, EventRecord
from threadloom.persistence.aio import AsyncStore
from threadloom.persistence.postgres.store import PostgresCheckpointer
from threadloom.testing.aio_harness import wait_until
from threadloom.testing.contract._support import Writer
from threadloom.testing.postgres_harness import PgHarness

pytestmark = pytest.mark.postgres

LONG = timedelta(seconds=60)
WAIT = 20  # seconds: a bound for the test, far above what any step needs
READS = "threadloom_store_calls_total"


@pytest.fixture
def harness() -> Iterator[PgHarness]:
    made = PgHarness()
    try:
        yield made
    finally:
        made.cleanup()


def _reads(meter: InMemoryMeter) -> float:
    return meter.snapshot().counter(READS, op="await_events_after")



def _drafts(writer: Writer, payloads: list[object]) -> list[EventDraft]:
    now = writer.harness.clock.now()
    return [EventDraft(run_id=writer.holder, type="step", timestamp=now, payload=p) for p in payloads]


def _waiting(store: PostgresCheckpointer, aio: AsyncStore, count: int) -> object:
    return lambda: store.wakeups().waiters.count() == count and not aio._reads and store._listener.ready.is_set()


def test_a_commits_events_reach_a_waiter_through_its_notification_equal_to_a_read(harness: PgHarness) -> None:
    inner = harness.open_pg()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(inner, harness, "t")
    writer.emit(2)
    payloads: list[object] = [{"text": "héllo \n\"q\" ✓", "nested": [1, 2.5, None, True]}, "two", [], 3]

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=2)
        tasks = [asyncio.create_task(aio.await_events_after("t", 2, 100, LONG)) for _ in range(5)]
        await wait_until(_waiting(inner, aio, 5), "the waiters to wait")
        await asyncio.sleep(0.05)  # a wake of the listener's start, if any, is over
        before = _reads(meter)
        committed = await asyncio.to_thread(writer.commit, events=_drafts(writer, payloads))
        results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        assert _reads(meter) == before  # no read: the notification carried them
        read = await aio.events_after("t", 2, 100)
        assert [event.payload for event in read] == payloads
        assert results == [read] * 5 and read == committed
        assert len({id(result) for result in results}) == 5  # each waiter's own list (of shared records)
        assert all(result[0] is results[0][0] for result in results)
        await aio.close()

    asyncio.run(scenario())


def test_a_commit_too_big_for_a_notification_is_read(harness: PgHarness) -> None:
    inner = harness.open_pg()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(inner, harness, "t")
    writer.emit(1)
    payloads: list[object] = [{"blob": "x" * 9000}, {"small": 1}]

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=2)
        task = asyncio.create_task(aio.await_events_after("t", 1, 100, LONG))
        await wait_until(_waiting(inner, aio, 1), "the waiter to wait")
        before = _reads(meter)
        committed = await asyncio.to_thread(writer.commit, events=_drafts(writer, payloads))
        got = await asyncio.wait_for(task, WAIT)
        assert got == committed and [event.payload for event in got] == payloads
        assert _reads(meter) > before  # the thread id only: the waiter read them
        await aio.close()

    asyncio.run(scenario())


def test_waiters_the_carried_events_do_not_continue_read_and_the_limit_holds(harness: PgHarness) -> None:
    inner = harness.open_pg()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(inner, harness, "t")
    writer.emit(5)
    positions = [5, 5, 6, 7]  # the commit brings 6, 7, 8: those at 6 and 7 are not continued by it

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=2)
        tasks = [asyncio.create_task(aio.await_events_after("t", after, 100, LONG)) for after in positions]
        limited = asyncio.create_task(aio.await_events_after("t", 5, 2, LONG))
        await wait_until(_waiting(inner, aio, 5), "the waiters to wait")
        await asyncio.sleep(0.05)
        before = _reads(meter)
        records = await asyncio.to_thread(writer.emit, 3)
        results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        for after, got in zip(positions, results, strict=True):
            assert got == [record for record in records if record.seq > after]
        assert await asyncio.wait_for(limited, WAIT) == records[:2]
        assert 2 <= _reads(meter) - before < 10  # positions 6 and 7 read; those at 5 did not
        await aio.close()

    asyncio.run(scenario())


def test_a_notification_that_does_not_decode_wakes_every_waiter_to_read(
    harness: PgHarness, caplog: pytest.LogCaptureFixture
) -> None:
    inner = harness.open_pg()
    meter = InMemoryMeter()
    store = MeteredCheckpointer(inner, meter)
    writer = Writer(inner, harness, "t")
    writer.emit(1)
    channel = inner._config.events_channel

    async def scenario() -> None:
        aio = AsyncStore(store, own_store=False, max_workers=2)
        tasks = [asyncio.create_task(aio.await_events_after("t", 1, 100, LONG)) for _ in range(3)]
        await wait_until(_waiting(inner, aio, 3), "the waiters to wait")
        await asyncio.sleep(0.05)
        before = _reads(meter)
        for payload in ("not json", "[]", '[{"seq": 1}]', "{}"):
            with psycopg.connect(harness.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("SELECT pg_notify({}, {})").format(sql.Literal(channel), sql.Literal(payload)))
            await wait_until(lambda: _reads(meter) > before, "the waiters to re-read")
            before = _reads(meter)
        assert not any(task.done() for task in tasks)  # nothing new: they wait on
        records = await asyncio.to_thread(writer.emit, 2)
        assert await asyncio.wait_for(asyncio.gather(*tasks), WAIT) == [records] * 3
        await aio.close()

    asyncio.run(scenario())


def test_async_subscriptions_joined_mid_stream_each_get_every_event_once_in_order(harness: PgHarness) -> None:
    store_a = harness.open_pg()
    store_b = harness.sibling()
    writer = Writer(store_b, harness, "t")
    writer.step("c1", events=2)  # a checkpoint: each subscription's tenant check passes
    runtime = GraphRuntime(store_a, node_id="wake")

    async def host() -> None:
        received: dict[int, list[EventRecord]] = {}
        starts: dict[int, int] = {}
        consumers = []

        def subscribe(after: int, count: int) -> None:
            for _ in range(count):
                index = len(starts)
                starts[index], received[index] = after, []
                subscription = runtime.subscribe("t", after)

                async def consume(subscription: object = subscription, index: int = index) -> None:
                    async for event in subscription:  # type: ignore[attr-defined]
                        received[index].append(event)

                consumers.append((subscription, asyncio.create_task(consume())))

        subscribe(0, 50)
        subscribe(2, 50)
        for turn in range(6):
            await asyncio.to_thread(writer.emit, 1 + turn % 3)
            if turn == 2:  # joined mid-stream: one behind the log (replays, then joins the tail), one at its end
                last = store_a.events_after("t", 0, 100)[-1].seq
                subscribe(1, 20)
                subscribe(last, 20)
            await asyncio.sleep(0.01)
        log = store_a.events_after("t", 0, 100)
        await wait_until(
            lambda: all(len(received[i]) == len(log) - starts[i] for i in received), "every event everywhere"
        )
        for index, got in received.items():
            assert got == log[starts[index]:]
        assert [event.seq for event in log] == list(range(1, len(log) + 1))
        assert len(runtime._tails) == 1
        for subscription, _task in consumers:
            subscription.cancel()
        await asyncio.wait_for(asyncio.gather(*(task for _, task in consumers)), WAIT)
        assert runtime._tails == {}
        assert store_a.wakeups().waiters.count() == 0

    try:
        asyncio.run(host())
    finally:
        runtime.close()


def _listen(conn: psycopg.Connection, store: PostgresCheckpointer, *, register: bool = True) -> None:
    """LISTENs on the store's two channels, registered as a listener of its schema (tl_listen) in the same
    transaction, as an outside program does (docs/operations.md)."""
    statements = [sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in (store._config.events_channel,
                                                                          store._config.channel)]
    if register:
        statements.append(sql.SQL("SELECT {}.tl_listen()").format(sql.Identifier(store._config.schema)))
    conn.execute(sql.SQL("; ").join(statements))


def _listeners(harness: PgHarness) -> list[int]:
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT pid FROM {} ORDER BY pid").format(sql.Identifier(harness.schema, "listeners"))
        return [row[0] for row in conn.execute(query).fetchall()]


def test_a_commit_without_events_sends_no_notification(harness: PgHarness) -> None:
    inner = harness.open_pg()
    writer = Writer(inner, harness, "t")
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        _listen(conn, inner)
        writer.step("c1")
        writer.commit(events=_drafts(writer, ["a"]))
        writer.commit(events=_drafts(writer, [{"blob": "y" * 9000}]))
        notes = [(n.channel, n.payload) for n in conn.notifies(timeout=1.0, stop_after=2)]
    assert [channel for channel, _ in notes] == [inner._config.events_channel, inner._config.channel]
    assert notes[1][1] == "t"
    assert '"payload":"a"' in notes[0][1] and notes[0][1].startswith('[{"seq":1,')


def test_commits_notify_only_while_a_listener_is_registered(harness: PgHarness) -> None:
    inner = harness.open_pg()
    writer = Writer(inner, harness, "t")
    writer.step("c1")
    with psycopg.connect(harness.dsn, autocommit=True) as unregistered:
        _listen(unregistered, inner, register=False)
        writer.commit(events=_drafts(writer, ["nobody registered"]))
        assert list(unregistered.notifies(timeout=0.5, stop_after=1)) == []
        with psycopg.connect(harness.dsn, autocommit=True) as registered:
            _listen(registered, inner)
            assert _listeners(harness) == [registered.info.backend_pid]
            writer.commit(events=_drafts(writer, ["heard"]))
            heard = [n.payload for n in registered.notifies(timeout=WAIT, stop_after=1)]
            also = [n.payload for n in unregistered.notifies(timeout=WAIT, stop_after=1)]
            assert len(heard) == 1 and '"payload":"heard"' in heard[0] and also == heard
        # the registration of a session that ended is removed by the next one
        with psycopg.connect(harness.dsn, autocommit=True) as again:
            _listen(again, inner)
            assert _listeners(harness) == [again.info.backend_pid]


def test_a_listening_store_registers_and_removes_its_registration_when_closed(harness: PgHarness) -> None:
    store = harness.open_pg()
    other = harness.sibling()
    writer = Writer(other, harness, "t")
    writer.step("c1")
    assert _listeners(harness) == []
    assert store.await_events_after("t", 0, 10, timedelta(0)) == []  # a read: no listener yet
    records = writer.emit(1)
    assert store.await_events_after("t", 0, 10, timedelta(seconds=WAIT)) == records  # starts the listener
    asyncio.run(wait_until(store._listener.ready.is_set, "the listener to listen"))
    assert _listeners(harness) == [store._listener.backend_pid]
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(store.await_events_after, "t", records[-1].seq, 10, LONG)
        more = writer.emit(1)
        assert later.result(timeout=WAIT) == more
    store.close()
    assert _listeners(harness) == []


def test_the_events_channel_fits_a_long_schema_name() -> None:
    from threadloom.persistence.postgres.config import PostgresCheckpointerConfig

    short = PostgresCheckpointerConfig(schema="tl_x")
    long = PostgresCheckpointerConfig(schema="tl_" + "y" * 60)
    assert short.events_channel == "threadloom-events.tl_x" and short.events_channel != short.channel
    assert len(long.events_channel.encode()) <= 63 and long.events_channel != long.channel


def test_async_subscriptions_get_every_event_once_across_a_lost_notification_and_a_listener_reconnect(
    harness: PgHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threadloom.actors.subscription as subscription_module

    monkeypatch.setattr(subscription_module, "ASYNC_WAIT", timedelta(milliseconds=300))  # the re-read of a lost one
    store_a = harness.open_pg()
    store_b = harness.sibling()
    writer = Writer(store_b, harness, "t")
    writer.step("c1", events=1)
    runtime = GraphRuntime(store_a, node_id="wake")
    listener = store_a._listener
    carried, dropped = listener._on_events, []

    def lossy(payload: str) -> None:  # the first carried notification is lost
        if not dropped:
            dropped.append(payload)
            return
        assert carried is not None
        carried(payload)

    listener._on_events = lossy

    async def host() -> None:
        subscriptions = [runtime.subscribe("t", 0) for _ in range(20)]
        received: list[list[EventRecord]] = [[] for _ in subscriptions]

        async def consume(index: int) -> None:
            async for event in subscriptions[index]:
                received[index].append(event)

        consumers = [asyncio.create_task(consume(index)) for index in range(len(subscriptions))]
        await wait_until(lambda: all(len(got) == 1 for got in received) and listener.ready.is_set(), "the replays")
        await asyncio.to_thread(writer.emit, 2)  # its notification is lost: the tail's wait times out and reads
        await wait_until(lambda: all(len(got) == 3 for got in received), "the events of the lost notification")
        assert dropped
        old_pid = listener.backend_pid
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        await wait_until(lambda: listener.backend_pid != old_pid and listener.ready.is_set(), "the listener to return")
        for n in (1, 3, 1):
            await asyncio.to_thread(writer.emit, n)
        log = store_a.events_after("t", 0, 100)
        assert len(log) == 8
        await wait_until(lambda: all(len(got) == len(log) for got in received), "every event")
        assert all(got == log for got in received)
        for subscription in subscriptions:
            subscription.cancel()
        await asyncio.wait_for(asyncio.gather(*consumers), WAIT)

    try:
        asyncio.run(host())
    finally:
        runtime.close()
