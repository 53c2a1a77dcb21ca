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

- **every store, relative to its own latency**: the 90th percentile of the write calls of the last whole second
  (at least ``RELATIVE_MIN_CALLS`` of them) above ``press_ratio`` (default 1.5) times the store's baseline - a
  slow moving average of the earlier seconds' 90th percentiles, which rises by at most ``press_ratio`` of itself
  per ``RELATIVE_MEMORY`` seconds, so a lasting change of the load becomes the new normal in about a minute - and
  above ``RELATIVE_FLOOR`` (1 ms; below it a store is not waiting on anything). The baseline is judged only after
  ``RELATIVE_WARMUP`` seconds with calls. A walk's stamping that delays live commits shows here before any call
  reaches ``press_threshold``.
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
from threadloom.domain.errors import OutcomeUnknown, StoreUnavailable, ThreadloomError, ValidationError

PRESS_THRESHOLD = timedelta(milliseconds=100)
"""The default ``press_threshold``: a write call longer than this presses the store."""
PRESS_WINDOW = timedelta(seconds=1)
"""The default window of :meth:`WritePressure.pressed`."""
PRESS_RATIO = 1.5
"""The default ``press_ratio``: a second whose write calls' p90 exceeds this times the baseline presses the store."""
RELATIVE_MIN_CALLS = 5
"""A second with fewer write calls than this says nothing about latency."""
RELATIVE_FLOOR = 0.001
"""Seconds: a p90 below this never presses (the store waited on nothing)."""
RELATIVE_MEMORY = 30
"""Seconds: the baseline moves ``1 / RELATIVE_MEMORY`` of the way to each second's p90 (capped, see the module)."""
RELATIVE_WARMUP = 3
"""Seconds with calls before the baseline is judged."""
RELATIVE_SAMPLES = 4096
"""The most write calls one second keeps for its p90 (the rest of that second is not sampled)."""
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

    def __init__(
        self,
        threshold: timedelta = PRESS_THRESHOLD,
        probe: Callable[[], bool] | None = None,
        *,
        ratio: float | None = PRESS_RATIO,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._threshold_s = v.check_positive_duration("press_threshold", threshold).total_seconds()
        self._ratio = _check_ratio(ratio)
        self._clock = clock
        self._last_press = -1e300  # clock seconds of the last press
        self._presses = 0
        self._lock = threading.Lock()
        self.probe = probe
        # the relative signal: this second's call durations, and the baseline of the earlier seconds' p90
        self._second_started: float | None = None
        self._durations: list[float] = []
        self._baseline: float | None = None
        self._seconds_seen = 0
        self.last_p90: float | None = None
        """Seconds: the p90 of the write calls of the last whole second judged (None: none yet)."""

    @property
    def ratio(self) -> float | None:
        """A second whose write calls' p90 exceeds this times the baseline presses the store (None: off)."""
        return self._ratio

    @ratio.setter
    def ratio(self, value: float | None) -> None:
        self._ratio = _check_ratio(value)

    @property
    def baseline(self) -> float | None:
        """Seconds: the slow moving p90 of this store's write calls (None before the first judged second)."""
        return self._baseline

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
            self._press_locked(self._clock())

    def _press_locked(self, now: float) -> None:
        self._last_press = max(self._last_press, now)
        self._presses += 1

    def record(self, seconds: float, error: BaseException | None = None) -> None:
        """Records a write call that took ``seconds`` and ended with ``error`` (None: it returned)."""
        if seconds > self._threshold_s or isinstance(error, (StoreUnavailable, OutcomeUnknown)):
            self.press()
        if self._ratio is None:
            return
        now = self._clock()
        started, durations = self._second_started, self._durations
        if started is not None and started <= now < started + 1.0:
            # Within the open second, no lock: every write takes this path, and a lock here queued a runtime's node
            # threads behind each other. ``append`` is atomic; a roll racing it swaps the list (see ``_roll``), so
            # such a sample counts in the second that just closed, or not at all: a reading, never a wrong state.
            if len(durations) < RELATIVE_SAMPLES:
                durations.append(seconds)
            return
        with self._lock:
            now = self._clock()
            self._roll(now)
            if len(self._durations) < RELATIVE_SAMPLES:
                self._durations.append(seconds)

    def _roll(self, now: float) -> None:
        """Under the lock: closes the second of calls once it is over, judging its p90 against the baseline."""
        started = self._second_started
        if started is None or now < started:  # the first call, or a clock that went back: start a second now
            self._second_started = now
            self._durations = []
            return
        if now - started < 1.0:
            return
        durations, self._durations = self._durations, []
        self._second_started = now if now - started >= 2.0 else started + 1.0
        ratio = self._ratio
        if ratio is None or len(durations) < RELATIVE_MIN_CALLS:
            return
        durations = sorted(durations)  # a copy: a lock-free ``record`` may still append to the list it read
        p90 = durations[min(len(durations) - 1, int(0.9 * len(durations)))]
        self.last_p90 = p90
        baseline = self._baseline
        self._seconds_seen += 1
        if baseline is None:
            self._baseline = p90
            return
        if self._seconds_seen > RELATIVE_WARMUP and p90 > ratio * baseline and p90 > RELATIVE_FLOOR:
            self._press_locked(started + 1.0)
        self._baseline = baseline + (min(p90, ratio * baseline) - baseline) / RELATIVE_MEMORY

    def pressed(self, window: timedelta = PRESS_WINDOW) -> bool:
        """Whether the store was pressed within the last ``window`` (judged by this process's monotonic clock),
        or the probe says it is pressed now."""
        seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
        with self._lock:
            now = self._clock()
            if self._ratio is not None:
                self._roll(now)
            if now - self._last_press <= seconds:
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


def _check_ratio(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < float("inf"):
        raise ValidationError("press_ratio", (f"must be a finite number > 1 or None, got {value!r}",))
    return float(value)


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
