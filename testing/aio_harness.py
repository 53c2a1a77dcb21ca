"""The contract suite through the async API: a synchronous store that drives an :class:`AsyncStore`'s coroutines.

:class:`LoopDrivenCheckpointer` runs every call as a coroutine of an :class:`AsyncStore` on an event loop of its
own (one loop thread per wrapper) and waits for its result, so the unchanged contract suite checks the async
API: same arguments, same results, same errors. A ``cancel`` event given to ``await_events_after`` becomes task
cancellation, so the suite's cancellation cases check that an ``asyncio.CancelledError`` ends a wait promptly and
leaves the store usable. :func:`async_harness` wraps any store harness this way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from threadloom.domain.errors import CancelledError
from threadloom.persistence.aio import AsyncStore
from threadloom.persistence.base import Checkpointer
from threadloom.persistence.forwarding import ForwardingCheckpointer
from threadloom.testing.harness import StoreHarness, wrapping_harness

_CANCEL_POLL_S = 0.005


class LoopDrivenCheckpointer(ForwardingCheckpointer):
    """A ``Checkpointer`` whose every call is the same call of an :class:`AsyncStore` over ``inner``, run on an
    event loop thread this wrapper owns. ``close`` closes the async store (and so ``inner``) and ends the loop."""

    def __init__(self, inner: Checkpointer, *, max_workers: int | None = None) -> None:
        super().__init__(inner)
        self.async_store = AsyncStore(inner, max_workers=max_workers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="threadloom-aio-driver", daemon=True)
        self._thread.start()

    def _submit(self, coroutine: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _forward(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        self._ensure_open(operation)
        cancel = kwargs.pop("cancel", None) if operation == "await_events_after" else None
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            kwargs["cancel"] = cancel  # let the async store refuse it, naming the field
            cancel = None
        if cancel is not None and cancel.is_set():
            kwargs["cancel"] = cancel  # the async store refuses a set event before it reads
            cancel = None
        future = self._submit(getattr(self.async_store, operation)(*args, **kwargs))
        if cancel is None:
            return future.result()
        while True:  # the caller's event, mapped to task cancellation
            try:
                return future.result(timeout=_CANCEL_POLL_S)
            except TimeoutError:
                if cancel.is_set():
                    future.cancel()
                    try:
                        future.result()
                    except BaseException:
                        pass
                    raise CancelledError(operation) from None

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._submit(self.async_store.close()).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()


def async_harness(base: type[StoreHarness]) -> type[StoreHarness]:
    """``base``'s stores, each driven through :class:`AsyncStore` (name ``aio-<base name>``)."""
    return wrapping_harness(base, _wrap, prefix="aio")


def _wrap(_harness: StoreHarness, store: Checkpointer) -> Checkpointer:
    return LoopDrivenCheckpointer(store)


__all__ = ["LoopDrivenCheckpointer", "async_harness"]


async def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Returns once ``predicate()`` is true, checking every 5 ms on the running loop.

    Raises:
        AssertionError: still false after ``timeout_s`` seconds (the message names ``what``).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(_CANCEL_POLL_S)
