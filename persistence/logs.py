"""Loggers that never raise: a log line that cannot be written must never change a call's outcome.

The library logs through structlog and never configures it. An unconfigured structlog writes to standard output;
when that is a closed pipe (``program | head -1``) or an application's handler fails, the write raises. A store
call or a run must then go on exactly as if the line had been written: its claim released, its caller answered.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from datetime import timedelta
from time import perf_counter
from typing import Any

import structlog


class SafeLogger:
    """Wraps a structlog logger: every call (``info``, ``warning``, ``bind``, …) swallows what the write raises.

    Args:
        inner: the structlog (bound or lazy) logger to write through.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def bind(self, **values: Any) -> SafeLogger:
        """The same logger with ``values`` bound to every line."""
        try:
            return SafeLogger(self._inner.bind(**values))
        except Exception:  # noqa: BLE001 - a logger must not fail its caller
            return self

    def enabled_for(self, level: int) -> bool:
        """Whether a line at ``level`` (a ``logging`` level) would be written: what a filtering bound logger (the
        default, or ``make_filtering_bound_logger``) or a standard-library one says; True when it cannot tell."""
        try:
            check = getattr(self._inner, "is_enabled_for", None) or getattr(self._inner, "isEnabledFor", None)
            return True if check is None else bool(check(level))
        except Exception:  # noqa: BLE001 - a logger must not fail its caller
            return True

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a closed pipe or a broken handler must not fail the call
                return None

        return call


def get_logger(name: str) -> SafeLogger:
    """A :class:`SafeLogger` over ``structlog.get_logger(name)``."""
    return SafeLogger(structlog.get_logger(name))


SLOW_CALL = timedelta(seconds=1)
"""The default ``slow_call`` of every store: a call that takes longer is logged as ``store.call_slow``."""

_store_log = get_logger("threadloom.store")


def slow_call_seconds(value: Any) -> float:
    """The threshold in seconds for a ``slow_call`` option: a ``timedelta`` > 0, or None or ``timedelta(0)``
    for never (infinity).

    Raises:
        ValidationError: (field ``slow_call``) not a timedelta or None, or negative.
    """
    from threadloom.domain.errors import ValidationError

    if value is None:
        return math.inf
    if not isinstance(value, timedelta):
        raise ValidationError("slow_call", (f"must be a timedelta or None, got {type(value).__name__}",))
    if value < timedelta(0):
        raise ValidationError("slow_call", (f"must not be negative, got {value}",))
    return value.total_seconds() or math.inf


def log_slow_call(store: object, operation: str, thread_id: str | None, started: float, threshold_s: float) -> None:
    """Logs ``store.call_slow`` (warning) for a store call that began at ``started`` (``perf_counter`` seconds):
    keys ``op``, ``thread_id`` (None for a call about no one thread), ``duration_ms``, ``threshold_ms``, ``store``
    (the store's class). Never raises."""
    _store_log.warning(
        "store.call_slow",
        op=operation,
        thread_id=thread_id,
        duration_ms=round((perf_counter() - started) * 1000, 3),
        threshold_ms=round(threshold_s * 1000, 3),
        store=type(store).__name__,
    )


class SlowCalls:
    """The timing every store and run queue base shares: each public call begins with :meth:`_begin` and ends,
    in a ``finally``, with ``if started and perf_counter() - started > self._slow_s: self._slow(...)`` - two clock
    reads and a compare, inlined so the fast path pays nothing more (no clock at all while ``slow_call`` is off).
    A subclass provides ``_closed``."""

    _slow_s: float = SLOW_CALL.total_seconds()
    """The ``slow_call`` threshold in seconds (infinity: off)."""
    _closed: bool

    def _begin(self, operation: str) -> float:
        """Refuses a call on a closed store (``StoreClosed``); returns its start (``perf_counter`` seconds), or 0.0
        when ``slow_call`` is off (no clock is read)."""
        if self._closed:
            from threadloom.domain.errors import StoreClosed

            raise StoreClosed(operation, "the store is closed; open a new one")
        return perf_counter() if self._slow_s != math.inf else 0.0

    def _slow(self, operation: str, thread_id: str | None, started: float) -> None:
        log_slow_call(self, operation, thread_id, started, self._slow_s)


@contextlib.contextmanager
def structlog_restored() -> Iterator[None]:
    """Puts structlog's configuration back as it was on exit (unconfigured again, if it was): for the tools that
    configure logging for a while — the CLI, a simulation, a benchmark — inside a host that has its own."""
    configured = structlog.is_configured()
    saved = structlog.get_config()
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()
