"""Async nodes, ``await ctx.effect``, the runtime's awaitable methods, awaitable run handles and ``async for``
over subscriptions (README "asyncio"), over SQLite."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from threadloom import (
    CancelledError,
    CheckpointStatus,
    Graph,
    GraphRuntime,
    RunFailed,
    SqliteCheckpointer,
    Step,
    ThreadQuery,
    ValidationError,
    effect_keys,
)
from threadloom.actors.graph import EVENT_RUN_COMPLETED, EVENT_RUN_STARTED

WAIT = 20


@pytest.fixture
def store(tmp_path):
    store = SqliteCheckpointer.open(str(tmp_path / "aio.db"))
    yield store
    store.close()


@pytest.fixture
def runtime(store):
    runtime = GraphRuntime(store, node_id="aio")
    yield runtime
    runtime.close()


def _thread_names() -> set[str]:
    return {thread.name for thread in threading.enumerate()}


def test_async_and_sync_nodes_mix_and_async_nodes_run_on_the_runtimes_loop(runtime, store):
    seen: dict[str, str] = {}
    calls: list[str] = []

    async def charge(idempotency_key):
        await asyncio.sleep(0.01)
        calls.append(idempotency_key)
        return {"charged": 5}

    def plan(state, ctx):
        seen["plan"] = threading.current_thread().name
        return Step.to("pay", {**state, "planned": True})

    async def pay(state, ctx):
        seen["pay"] = threading.current_thread().name
        await asyncio.sleep(0.01)
        result = await ctx.effect("charge", charge)
        again = await ctx.effect("charge", charge)  # recorded in this step: not called twice
        ctx.emit("paid", result)
        return Step.to("done", {**state, "paid": result, "again": again})

    def done(state, ctx):
        return Step.end({**state, "done": True})

    graph = Graph("shop", {"plan": plan, "pay": pay, "done": done}, entry="plan")

    async def host() -> None:
        host_thread = threading.current_thread().name
        handle = await runtime.astart("t1", graph, {"order": 1})
        outcome = await handle
        assert outcome.status is CheckpointStatus.COMPLETED
        assert outcome.state == {"order": 1, "planned": True, "paid": {"charged": 5}, "again": {"charged": 5}, "done": True}
        assert seen["pay"].startswith("threadloom-aio-loop") and seen["pay"] != host_thread
        assert not seen["plan"].startswith("threadloom-aio-loop")
        record = store.effect("t1", effect_keys("t1", "charge", turn_id=handle.run_id).record)
        assert record is not None and record.result == {"charged": 5}
        assert len(calls) == 1

    asyncio.run(host())


def test_a_sync_node_handing_ctx_effect_an_async_function_fails_naming_the_node_with_nothing_recorded(runtime, store):
    async def fetch():
        return 1

    def node(state, ctx):
        ctx.effect("k", fetch)
        return Step.end(state)

    handle = runtime.start("t1", Graph("bad", {"node": node}, entry="node"), {})
    with pytest.raises(RunFailed) as caught:
        handle.wait(timedelta(seconds=WAIT))
    cause = caught.value.__cause__
    assert isinstance(cause, ValidationError) and cause.field == "effect 'k' fn" and "'node'" in str(cause)
    keys = effect_keys("t1", "k", turn_id=handle.run_id)
    assert store.effect("t1", keys.intent) is None and store.effect("t1", keys.record) is None


@pytest.mark.parametrize("is_async_node", [False, True], ids=["sync-node", "async-node"])
def test_an_effect_result_that_is_an_unawaited_coroutine_is_refused_naming_the_node(runtime, store, is_async_node):
    async def fetch():
        return 1

    def sync_node(state, ctx):
        ctx.effect("k", lambda: fetch())
        return Step.end(state)

    async def async_node(state, ctx):
        ctx.effect("k", lambda: fetch())
        return Step.end(state)

    graph = Graph("bad", {"node": async_node if is_async_node else sync_node}, entry="node")
    handle = runtime.start("t1", graph, {})
    with pytest.raises(RunFailed) as caught:
        handle.wait(timedelta(seconds=WAIT))
    cause = caught.value.__cause__
    assert isinstance(cause, ValidationError) and cause.field == "effect 'k' result"
    assert "coroutine" in str(cause) and "'node'" in str(cause)
    assert store.effect("t1", effect_keys("t1", "k", turn_id=handle.run_id).record) is None


def test_a_node_that_is_not_callable_is_refused_when_the_graph_is_built():
    with pytest.raises(ValidationError) as caught:
        Graph("g", {"a": "not a function"}, entry="a")  # type: ignore[dict-item]
    assert caught.value.field == "nodes['a']"


def test_async_subscription_streams_a_run_until_its_end_without_a_thread_of_its_own(runtime):
    async def slow(state, ctx):
        for index in range(3):
            await asyncio.sleep(0.01)
            ctx.emit("tick", {"i": index})
        return Step.end(state)

    graph = Graph("ticker", {"slow": slow}, entry="slow")

    async def host() -> None:
        before = _thread_names()
        handle = await runtime.astart("t1", graph, {})
        subscription = runtime.subscribe("t1", until_run_end=handle.run_id)
        assert not any(name.startswith("threadloom-watch") for name in _thread_names() - before)
        types = [event.type async for event in subscription]
        assert types == [EVENT_RUN_STARTED, "tick", "tick", "tick", EVENT_RUN_COMPLETED]
        assert not subscription.active
        await handle
        # A second turn: a subscription from the last seq sees only that turn, and ends with it.
        second = await runtime.astart("t1", graph, {})
        later = [event async for event in runtime.subscribe("t1", subscription.last_seq, until_run_end=second.run_id)]
        assert [event.run_id for event in later] == [second.run_id] * 5
        # Cancelling an async subscription ends its iteration at once.
        open_ended = runtime.subscribe("t1", later[-1].seq)
        consumer = asyncio.create_task(asyncio.wait_for(anext(open_ended), WAIT))
        await asyncio.sleep(0.05)
        open_ended.cancel()
        with pytest.raises(StopAsyncIteration):
            await consumer

    asyncio.run(host())


def test_the_awaitable_runtime_methods(runtime, store):
    async def ask(state, ctx):
        return Step.suspend("answer", {**state, "asked": True})

    async def answer(state, ctx):
        child = await ctx.aspawn(f"{ctx.thread_id}-child", leaf, {"x": 1})
        child_outcome = await child
        return Step.end({**state, "child": child_outcome.state})

    def leaf(state, ctx):
        return Step.end({**state, "leaf": True})

    leaf = Graph("leaf", {"leaf": leaf}, entry="leaf")
    graph = Graph("chat", {"ask": ask, "answer": answer}, entry="ask")

    async def host() -> None:
        first = await (await runtime.astart("t1", graph, {"q": 1}, tenant_id="acme"))
        assert first.status is CheckpointStatus.SUSPENDED
        resumed = await (await runtime.aresume("t1", graph, {"a": 2}, tenant_id="acme"))
        assert resumed.status is CheckpointStatus.COMPLETED and resumed.state["child"] == {"x": 1, "leaf": True}
        assert await runtime.achildren("t1", "acme") == ["t1-child"]
        page = await runtime.athreads(ThreadQuery(tenant_id="acme", limit=10))
        assert {summary.thread_id for summary in page.items} >= {"t1"}
        assert set(await runtime.adelete_thread("t1", "acme")) == {"t1", "t1-child"}
        assert store.latest("t1") is None
        with pytest.raises(ValidationError):
            await runtime.astart("", graph)

    asyncio.run(host())


def test_arecover_continues_an_async_run_and_reads_its_turns_effect_records(store):
    calls: list[str] = []
    gate = threading.Event()

    async def charge(key):
        calls.append(key)
        return "ok"

    async def pay(state, ctx):
        return Step.to("ship", {**state, "paid": await ctx.effect("charge", charge)})

    async def ship(state, ctx):
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, WAIT)
        return Step.to("done", {**state, "shipped": True})

    async def done(state, ctx):
        return Step.end({**state, "done": await ctx.effect("charge", charge)})  # the turn's record: not called

    graph = Graph("order", {"pay": pay, "ship": ship, "done": done}, entry="pay")
    first = GraphRuntime(store, node_id="first", close_timeout=timedelta(seconds=2))
    handle = first.start("t1", graph, {})
    while (latest := store.latest("t1")) is None or latest.checkpoint.metadata.get("threadloom.node") != "pay":
        threading.Event().wait(0.01)
    handle.cancel()
    gate.set()
    with pytest.raises(CancelledError):
        handle.wait(timedelta(seconds=WAIT))
    first.close()
    second = GraphRuntime(store, node_id="second")
    try:

        async def host() -> None:
            outcome = await (await second.arecover("t1", graph))
            assert outcome.state == {"paid": "ok", "shipped": True, "done": "ok"}

        asyncio.run(host())
    finally:
        second.close()
    assert len(calls) == 1


def test_async_subscriptions_of_one_thread_share_one_watch_and_a_delete_ends_them_all(runtime, store):
    async def tick(state, ctx):
        ctx.emit("tick", {"n": state.get("n", 0)})
        return Step.end(state)

    graph = Graph("tick", {"tick": tick}, entry="tick")

    async def host() -> None:
        first = await (await runtime.astart("t1", graph, {"n": 1}))
        assert first.status is CheckpointStatus.COMPLETED
        subscriptions = [runtime.subscribe("t1") for _ in range(50)]
        received: list[list[int]] = [[] for _ in subscriptions]

        async def consume(index: int) -> None:
            async for event in subscriptions[index]:
                received[index].append(event.seq)

        consumers = [asyncio.create_task(consume(index)) for index in range(len(subscriptions))]
        while not all(len(seqs) == 3 for seqs in received):  # the first turn's events, replayed by each
            await asyncio.sleep(0.01)
        assert len(runtime._tails) == 1  # one shared watch for the fifty
        subscriptions[0].cancel()
        await (await runtime.astart("t1", graph, {"n": 2}))
        while not all(len(seqs) == 6 for seqs in received[1:]):
            await asyncio.sleep(0.01)
        assert all(seqs == [1, 2, 3, 4, 5, 6] for seqs in received[1:]) and received[0] == [1, 2, 3]
        await runtime.adelete_thread("t1")
        results = await asyncio.wait_for(asyncio.gather(*consumers, return_exceptions=True), WAIT)
        assert results[0] is None
        assert {type(result).__name__ for result in results[1:]} == {"ThreadDeleted"}
        assert runtime._tails == {}

    asyncio.run(host())


def test_a_thread_watched_subscription_can_be_read_with_async_for(runtime):
    def tick(state, ctx):
        ctx.emit("tick", None)
        return Step.end(state)

    handle = runtime.start("t1", Graph("tick", {"tick": tick}, entry="tick"), {})
    subscription = runtime.subscribe("t1", until_run_end=handle.run_id)  # plain code: a watch thread

    async def read() -> list[str]:
        return [event.type async for event in subscription]

    assert asyncio.run(read()) == [EVENT_RUN_STARTED, "tick", EVENT_RUN_COMPLETED]


class _NotAnException(BaseException):
    pass


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, _NotAnException, asyncio.CancelledError])
@pytest.mark.parametrize("where", ["sync-node", "async-node", "sync-effect", "async-effect", "sync-returns-coroutine"])
def test_a_base_exception_from_a_node_fails_its_run_and_the_runtime_goes_on(runtime, store, where, raised):
    """Found by hostile testing: a node (or its effect) raising a BaseException that is not an Exception killed its
    task thread (or the runtime's event loop), left the run RUNNING under a claim renewed forever, and every later
    async node of the runtime hung."""

    def boom():
        raise raised()

    async def aboom():
        raise raised()

    def sync_node(state, ctx):
        boom()

    async def async_node(state, ctx):
        await aboom()

    def sync_effect(state, ctx):
        ctx.effect("e", boom)
        return Step.end(state)

    async def async_effect(state, ctx):
        await ctx.effect("e", aboom)
        return Step.end(state)

    def returns_coroutine(state, ctx):
        return async_node(state, ctx)

    nodes = {"sync-node": sync_node, "async-node": async_node, "sync-effect": sync_effect,
             "async-effect": async_effect, "sync-returns-coroutine": returns_coroutine}  # fmt: skip
    handle = runtime.start("t", Graph("g", {"n": nodes[where]}, entry="n"), {})
    with pytest.raises((RunFailed, CancelledError)):
        handle.wait(timedelta(seconds=WAIT))
    assert store.latest("t").checkpoint.status is CheckpointStatus.FAILED
    assert store.current_claim("t") is None  # released: another runtime may start the thread again

    async def fine(state, ctx):
        await asyncio.sleep(0)
        return Step.end({"ok": True})

    after = runtime.start("t2", Graph("ok", {"n": fine}, entry="n"), {})
    assert after.wait(timedelta(seconds=WAIT)).state == {"ok": True}  # the runtime's loop still runs


@pytest.mark.parametrize("where", ["async-node", "sync-returns-coroutine"])
def test_an_async_effect_the_node_forgot_to_await_fails_the_node_naming_it(runtime, store, where):
    """Found by hostile testing: ``ctx.effect("x", afetch)`` without ``await`` completed the run; the effect never
    ran and nothing was recorded, with only Python's "never awaited" warning."""
    calls: list[str] = []

    async def afetch():
        calls.append("fetched")
        return 1

    async def forgets(state, ctx):
        ctx.effect("fetch", afetch)  # no await
        return Step.end(state)

    def returns_coroutine(state, ctx):
        return forgets(state, ctx)

    node = forgets if where == "async-node" else returns_coroutine
    handle = runtime.start("t", Graph("g", {"n": node}, entry="n"), {})
    with pytest.raises(RunFailed) as caught:
        handle.wait(timedelta(seconds=WAIT))
    assert "'fetch'" in str(caught.value) and "await" in str(caught.value)
    assert calls == [] and store.latest("t").checkpoint.status is CheckpointStatus.FAILED
