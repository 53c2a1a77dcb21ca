"""ThreadloomSaver's async methods run on a threadloom AsyncStore's pool, with the sync methods' results and errors.

The conformance suite runs through the async methods on every store (``test_langgraph_conformance.py``), also with
savers built on an ``AsyncStore``; here: which threads do the store calls, what a given ``AsyncStore`` shares, and
that errors (``ThreadBusy``, ``StoreClosed``, ``ValidationError``) are the sync methods' own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from threadloom import StoreClosed, ThreadBusy, ValidationError
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.aio import AsyncStore
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.persistence.memory.store import InMemoryCheckpointer


class _Threads(ForwardingCheckpointer):
    """Records the name of the thread each store call runs on."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.threads: set[str] = set()

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        return super()._forward(operation, *args, **kwargs)


async def _round(saver: ThreadloomSaver, thread: str) -> list[Any]:
    checkpoint = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": 1})
    stored = await saver.aput(generate_config(thread), checkpoint, generate_metadata(step=0), {"n": 1})
    await saver.aput_writes(stored, [("n", "w")], "task-1")
    found = await saver.aget_tuple(stored)
    listed = [item async for item in saver.alist(generate_config(thread))]
    return [found.pending_writes, [item.checkpoint["id"] for item in listed], stored]


def test_async_methods_run_on_the_saver_s_async_store_pool() -> None:
    store = _Threads(InMemoryCheckpointer())
    saver = ThreadloomSaver(store, workers=3)
    try:
        assert saver.async_store.max_workers == 3 and saver.async_store.store is store
        writes, ids, stored = asyncio.run(_round(saver, "a1"))
        assert writes == [("task-1", "n", "w")] and ids == [stored["configurable"]["checkpoint_id"]]
        assert store.threads and all(name.startswith("threadloom-aio") for name in store.threads)
    finally:
        saver.close()
    assert saver.async_store.closed and not store.closed  # the saver's pool is closed, the store it was given not
    with pytest.raises(StoreClosed):
        asyncio.run(saver.aget_tuple(generate_config("a1")))


def test_a_given_async_store_is_shared_and_stays_open() -> None:
    store = _Threads(InMemoryCheckpointer())

    async def main() -> None:
        astore = AsyncStore(store, max_workers=2)
        saver = ThreadloomSaver(astore)
        assert saver.async_store is astore
        await _round(saver, "a2")
        assert store.threads and all(name.startswith("threadloom-aio") for name in store.threads)
        await saver.aclose()
        assert not astore.closed  # the program's async store: still open for its other calls
        assert (await astore.latest("a2")) is not None
        await astore.close()

    asyncio.run(main())


def test_async_errors_are_the_sync_methods_errors() -> None:
    store = InMemoryCheckpointer()
    first, second = ThreadloomSaver(store), ThreadloomSaver(store)

    async def main() -> None:
        await _round(first, "a3")  # first's run holds the thread
        checkpoint = generate_checkpoint(channel_values={"n": 2}, channel_versions={"n": 2})
        with pytest.raises(ThreadBusy):
            await second.aput(generate_config("a3"), checkpoint, generate_metadata(step=1), {"n": 2})
        with pytest.raises(ValidationError) as bad:
            await second.aget_tuple({"configurable": {}})
        assert bad.value.field == "config"
        await first.aclose()
        with pytest.raises(StoreClosed):
            await first.aput(generate_config("a3"), checkpoint, generate_metadata(step=1), {"n": 2})

    try:
        asyncio.run(main())
    finally:
        first.close()
        second.close()
        store.close()
