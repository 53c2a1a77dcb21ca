"""asyncio for the runtime: the event loop that runs ``async def`` nodes, and the runtime's awaitable methods.

Each :class:`~threadloom.actors.runtime.GraphRuntime` owns one :class:`RuntimeLoop` (README "asyncio"): an event
loop on a daemon thread of its own, started when the first async node runs, plus a bounded pool for the blocking
work an awaitable method hands off (a run's admission waits for its claim; a store call). Async nodes always run
on this loop - never on the host's loop, and never on an actor's thread - so a host's loop that blocks cannot
stall a run, and a node that blocks its loop stalls only other async nodes of this runtime (never a mailbox).

:class:`AsyncRuntimeMixin` gives the runtime ``astart``, ``arecover``, ``aresume``, ``adelete_thread``,
``athreads``, ``achildren`` and ``aincomplete``: the synchronous method of the same name run on that pool, awaited
from the caller's loop, with the same arguments, result and errors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from threadloom.actors.scheduler import THREAD_PREFIX
from threadloom.domain.errors import StoreClosed, ValidationError
from threadloom.domain.values import ThreadCursor, ThreadPage, ThreadQuery

if TYPE_CHECKING:
    from threadloom.actors.graph import Graph
    from threadloom.actors.runs import RunHandle

T = TypeVar("T")

DEFAULT_WORKERS = 8
"""Threads of a runtime's pool for awaitable methods and async nodes' store calls (``ctx.effect``'s record reads
and intent commits). Each call holds a thread only for its store I/O and the claim's grant, a few milliseconds; the
store serializes what would contend anyway (README "asyncio")."""


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on the calling thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def is_async_callable(fn: Any) -> bool:
    """True for an ``async def`` function, a ``functools.partial`` of one, or an object whose ``__call__`` is."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object's async __call__
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


class RuntimeLoop:
    """One event loop on a daemon thread (``threadloom-aio-loop``), started on first use, and a bounded pool.

    Args:
        name: names the loop's thread and the pool's threads.
        workers: threads of the pool (the loop's default executor too).
    """

    def __init__(self, name: str, workers: int = DEFAULT_WORKERS) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"{THREAD_PREFIX}aio-pool"
        )

    @property
    def started(self) -> bool:
        """True once the loop's thread was started (by the first async node)."""
        return self._thread is not None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started on first use.

        Raises:
            StoreClosed: never; ``RuntimeError`` once :meth:`close` was called.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the runtime's event loop was closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                loop.set_default_executor(self.executor)
                thread = threading.Thread(target=loop.run_forever, name=f"{THREAD_PREFIX}aio-loop", daemon=True)
                self._loop, self._thread = loop, thread
                thread.start()
            return self._loop

    def on_loop(self) -> bool:
        """True when called on the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules ``coroutine`` on the loop from any thread; its future."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop())

    def run(self, awaitable: Awaitable[T]) -> T:
        """Runs ``awaitable`` on the loop and blocks the calling thread (never the loop's own) until it ends."""
        if self.on_loop():
            raise RuntimeError("blocking on the runtime's event loop from that loop would deadlock it")

        async def wrapper() -> T:
            try:
                return await awaitable
            except (asyncio.CancelledError, Exception):
                raise
            except BaseException as caught:  # noqa: BLE001 - SystemExit... would stop the loop's own thread
                failure = RuntimeError(f"{type(caught).__name__} raised on the runtime's event loop: {caught}")
                raise failure from caught

        return self.submit(wrapper()).result()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs blocking ``fn`` on the pool and awaits it from the caller's loop (any loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def close(self, timeout: float) -> list[str]:
        """Cancels what still runs on the loop, stops it and joins its thread (at most ``timeout`` seconds); stops
        the pool without waiting. Returns the names of threads that did not end."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        left: list[str] = []
        if loop is not None and thread is not None:

            def stop() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()
                loop.call_soon(loop.stop)

            try:
                loop.call_soon_threadsafe(stop)
            except RuntimeError:
                pass
            if thread is not threading.current_thread():
                thread.join(timeout)
                if thread.is_alive():
                    left.append(thread.name)
                else:
                    loop.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        return left


class AsyncRuntimeMixin:
    """The runtime's awaitable methods (README "asyncio"): each runs the synchronous method of the same name on
    the runtime's pool and returns its result or raises its error; cancelling the awaiting task leaves a call
    already handed to the pool running to its end (a started run goes on: use its handle)."""

    _aio: RuntimeLoop

    if TYPE_CHECKING:

        def start(
            self,
            thread_id: str,
            graph: Graph,
            input: Any = None,  # noqa: A002
            tenant_id: str | None = None,
            *,
            run_id: str | None = None,
        ) -> RunHandle: ...

        def recover(
            self, thread_id: str, graph: Graph, tenant_id: str | None = None, *, run_id: str | None = None
        ) -> RunHandle: ...

        def resume(
            self,
            thread_id: str,
            graph: Graph,
            input: Any = None,  # noqa: A002
            tenant_id: str | None = None,
            *,
            run_id: str | None = None,
        ) -> RunHandle: ...

        def delete_thread(self, thread_id: str, tenant_id: str | None = None) -> list[str]: ...

        def children(
            self, thread_id: str, tenant_id: str | None = None, *, limit: int = 50, after: str | None = None
        ) -> list[str]: ...

        def threads(self, query: ThreadQuery) -> ThreadPage: ...

        def incomplete(
            self, tenant_id: str | None = None, *, limit: int = 50, after: ThreadCursor | None = None
        ) -> ThreadPage: ...

        def _ensure_open(self, operation: str) -> None: ...

    async def _acall(self, operation: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._ensure_open(operation)
        try:
            return await self._aio.call(fn, *args, **kwargs)
        except RuntimeError as error:  # the pool was shut down by close() meanwhile
            if "shutdown" in str(error):
                raise StoreClosed(operation, "the runtime is closed") from None
            raise

    async def astart(
        self,
        thread_id: str,
        graph: Graph,
        input: Any = None,  # noqa: A002
        tenant_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> RunHandle:
        """:meth:`start`, awaited: returns once the run holds the thread; ``await`` the handle for its outcome."""
        return await self._acall("start", self.start, thread_id, graph, input, tenant_id, run_id=run_id)

    async def arecover(
        self, thread_id: str, graph: Graph, tenant_id: str | None = None, *, run_id: str | None = None
    ) -> RunHandle:
        """:meth:`recover`, awaited."""
        return await self._acall("recover", self.recover, thread_id, graph, tenant_id, run_id=run_id)

    async def aresume(
        self,
        thread_id: str,
        graph: Graph,
        input: Any = None,  # noqa: A002
        tenant_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> RunHandle:
        """:meth:`resume`, awaited."""
        return await self._acall("resume", self.resume, thread_id, graph, input, tenant_id, run_id=run_id)

    async def adelete_thread(self, thread_id: str, tenant_id: str | None = None) -> list[str]:
        """:meth:`delete_thread`, awaited (the cascade runs on the pool)."""
        return await self._acall("delete_thread", self.delete_thread, thread_id, tenant_id)

    async def achildren(
        self, thread_id: str, tenant_id: str | None = None, *, limit: int = 50, after: str | None = None
    ) -> list[str]:
        """:meth:`children`, awaited."""
        return await self._acall("children", self.children, thread_id, tenant_id, limit=limit, after=after)

    async def athreads(self, query: ThreadQuery) -> ThreadPage:
        """:meth:`threads`, awaited."""
        return await self._acall("threads", self.threads, query)

    async def aincomplete(
        self, tenant_id: str | None = None, *, limit: int = 50, after: ThreadCursor | None = None
    ) -> ThreadPage:
        """:meth:`incomplete`, awaited."""
        return await self._acall("incomplete", self.incomplete, tenant_id, limit=limit, after=after)


def refuse_async_effect(node: str, key: str) -> ValidationError:
    """The error of an async effect function given to ``ctx.effect`` by a node that is not ``async def``."""
    return ValidationError(
        f"effect {key!r} fn",
        (
            f"is an async function, but node {node!r} is not `async def` and cannot await it: declare the node "
            "`async def` and `await ctx.effect(...)`, or pass a plain function; nothing was recorded",
        ),
    )


__all__ = [
    "DEFAULT_WORKERS",
    "AsyncRuntimeMixin",
    "RuntimeLoop",
    "is_async_callable",
    "refuse_async_effect",
    "running_loop",
]
