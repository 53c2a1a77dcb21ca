"""Write pressure and the history-read bulkhead of a store: what an access walk reads to slow down.

An access walk is background work on the store live commits write to (README "Access walks"). Each second its
pace (:class:`~threadloom.domain.pace.WalkPace`) asks the store whether its writes were *pressed* during the last
second - ``store.pressed(window)`` - and halves its share while they were. The signal, per store
(docs/operations.md "Access walks"):

- **every store**: a write call of this store object (``claim``, ``renew``, ``release``, ``commit``,
  ``delete_thread``) that took longer than ``press_threshold`` (default 100 ms) within the window, or that ended
  in ``StoreUnavailable`` or ``OutcomeUnknown`` (busy, locked or timed out); a refusal of the history bulkhead.
  What makes a write call that long differs by store:

  - memory: waiting for the store's lock (the write itself takes microseconds);
  - SQLite: waiting for the file's write lock (``BEGIN IMMEDIATE`` under the busy handler, another thread's or
    process's transaction) - a busy error is one that waited ``busy_timeout`` in vain;
  - PostgreSQL: waiting for a pooled connection or for a row lock (``SELECT … FOR UPDATE`` behind another
    transaction); ``lock_timeout``, ``statement_timeout`` and a pool timeout end in ``StoreUnavailable``.

- **PostgreSQL, in addition**: the pool's own statistics (``psycopg_pool`` ``get_stats()``): a request waiting for
  a connection now, or a request that waited (``requests_queued`` grew) since the last read.

The walk's own ``stamp_thread`` calls are not counted: their time already sets the walk's pace. The signal is
per store object (per process): another process's load reaches it through this store's own waits, which grow
with it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from time import monotonic, perf_counter
from typing import Any, TypeVar

from threadloom.domain import validation as v
from threadloom.domain.errors import OutcomeUnknown, StoreUnavailable, ThreadloomError

PRESS_THRESHOLD = timedelta(milliseconds=100)
"""The default ``press_threshold``: a write call longer than this presses the store."""
PRESS_WINDOW = timedelta(seconds=1)
"""The default window of :meth:`WritePressure.pressed`."""
HISTORY_READS = 4
"""The default size of a store's history bulkhead: history reads (a walk's stamping) running at once."""

_F = TypeVar("_F", bound=Callable[..., Any])


class BulkheadFull(ThreadloomError):
    """The bulkhead refused a call: as many as it admits run already. Nothing was read; retry later (retryable)."""

    retryable = True

    def __init__(self, name: str, limit: int) -> None:
        super().__init__(f"the {name} bulkhead is full ({limit} running); try again later")
        self.name = name
        self.limit = limit


class WritePressure:
    """The pressed signal of one store object. Thread-safe.

    Args:
        threshold: a write call longer than this presses the store (> 0; default 100 ms).
        probe: an extra check called by :meth:`pressed` (returns True when pressed now), e.g. a pool's wait
            statistics; None: none.
    """

    def __init__(self, threshold: timedelta = PRESS_THRESHOLD, probe: Callable[[], bool] | None = None) -> None:
        self._threshold_s = v.check_positive_duration("press_threshold", threshold).total_seconds()
        self._last_press = -1e300  # monotonic seconds of the last press
        self._presses = 0
        self._lock = threading.Lock()
        self.probe = probe

    @property
    def threshold(self) -> timedelta:
        """A write call longer than this presses the store."""
        return timedelta(seconds=self._threshold_s)

    @threshold.setter
    def threshold(self, value: timedelta) -> None:
        self._threshold_s = v.check_positive_duration("press_threshold", value).total_seconds()

    @property
    def presses(self) -> int:
        """How many presses were recorded since the store opened."""
        return self._presses

    def press(self) -> None:
        """Records a press now (a refused bulkhead slot, a write that waited)."""
        with self._lock:
            self._last_press = monotonic()
            self._presses += 1

    def record(self, seconds: float, error: BaseException | None = None) -> None:
        """Records a write call that took ``seconds`` and ended with ``error`` (None: it returned)."""
        if seconds > self._threshold_s or isinstance(error, (StoreUnavailable, OutcomeUnknown)):
            self.press()

    def pressed(self, window: timedelta = PRESS_WINDOW) -> bool:
        """Whether the store was pressed within the last ``window`` (judged by this process's monotonic clock),
        or the probe says it is pressed now."""
        seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
        if monotonic() - self._last_press <= seconds:
            return True
        probe = self.probe
        if probe is not None:
            try:
                if probe():
                    self.press()
                    return True
            except Exception:  # noqa: BLE001 - a probe that fails says nothing; never fail the caller
                return False
        return False


def timed_write(operation: str) -> Callable[[_F], _F]:
    """Decorates a store base's write method: its duration and its error are recorded in ``self.write_pressure``.

    The bare ``perf_counter`` pair is the only cost on the call's path."""

    def decorate(method: _F) -> _F:
        @functools.wraps(method)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = perf_counter()
            try:
                result = method(self, *args, **kwargs)
            except BaseException as error:
                self.write_pressure.record(perf_counter() - started, error)
                raise
            self.write_pressure.record(perf_counter() - started)
            return result

        timed.__name__ = method.__name__ or operation
        return timed  # type: ignore[return-value]

    return decorate


def pool_probe(pool: Any) -> Callable[[], bool] | None:
    """A probe over a ``psycopg_pool.ConnectionPool``'s statistics: pressed while a request waits for a
    connection, or when one was queued since the previous call. None for an object with no ``get_stats``."""
    get_stats = getattr(pool, "get_stats", None)
    if not callable(get_stats):
        return None
    seen = {"queued": None}

    def probe() -> bool:
        stats = get_stats()
        queued = int(stats.get("requests_queued", 0))
        before = seen["queued"]
        seen["queued"] = queued  # type: ignore[assignment]
        if int(stats.get("requests_waiting", 0)) > 0:
            return True
        return before is not None and queued > before

    return probe


class Bulkhead:
    """A bounded number of calls at once, refusing (never waiting) past it; a refusal presses the store.

    Args:
        name: names the bulkhead in its refusals.
        limit: how many calls may run at once (>= 1).
        pressure: the store's write pressure a refusal presses (None: none).
    """

    def __init__(self, name: str, limit: int = HISTORY_READS, pressure: WritePressure | None = None) -> None:
        self.name = name
        self.limit = v.check_int("history_reads", limit, low=1)
        self._pressure = pressure
        self._running = 0
        self._refused = 0
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        """How many calls run under the bulkhead now."""
        return self._running

    @property
    def refused(self) -> int:
        """How many calls it refused since it was made."""
        return self._refused

    def try_enter(self) -> bool:
        """Takes a slot if one is free (True); else counts a refusal, presses the store and returns False."""
        with self._lock:
            if self._running < self.limit:
                self._running += 1
                return True
            self._refused += 1
        if self._pressure is not None:
            self._pressure.press()
        return False

    def leave(self) -> None:
        """Gives back a slot :meth:`try_enter` took."""
        with self._lock:
            self._running = max(0, self._running - 1)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Runs the block in a slot.

        Raises:
            BulkheadFull: every slot is taken (nothing ran; a refusal presses the store).
        """
        if not self.try_enter():
            raise BulkheadFull(self.name, self.limit)
        try:
            yield
        finally:
            self.leave()
