"""Clocks: the ``Clock`` protocol and the test clock ``ManualClock``.

``domain`` never reads the wall clock: stores and runtimes are given a ``Clock``. The wall-clock implementation,
``SystemClock``, lives in :mod:`threadloom.persistence.clock` beside the I/O it belongs with.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from threadloom.domain.validation import check_aware

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""Where stored times count from: stores keep times as integer microseconds since this instant (UTC)."""


def to_micros(when: datetime) -> int:
    """An aware datetime as integer microseconds since :data:`EPOCH`."""
    delta = when - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """Integer microseconds since :data:`EPOCH` as an aware UTC datetime."""
    return EPOCH + timedelta(0, 0, micros)  # positional: the same timedelta, built faster


def duration_micros(duration: timedelta) -> int:
    """A duration as a whole number of microseconds."""
    return (duration.days * 86_400 + duration.seconds) * 1_000_000 + duration.microseconds


@runtime_checkable
class Clock(Protocol):
    """A source of the current time: ``now()`` returns a timezone-aware UTC ``datetime``."""

    def now(self) -> datetime: ...


class ManualClock:
    """A clock that moves only when told to: for tests and simulations. Safe to share between threads.

    Args:
        start: the first reading; an aware datetime (converted to UTC).

    Raises:
        ValidationError: ``start`` is naive.
    """

    def __init__(self, start: datetime) -> None:
        self._now = check_aware("start", start).astimezone(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The current reading, aware UTC."""
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Moves the clock by ``delta`` (negative moves it back) and returns the new reading."""
        if not isinstance(delta, timedelta):
            from threadloom.domain.errors import ValidationError

            raise ValidationError("delta", (f"must be a timedelta, got {type(delta).__name__}",))
        with self._lock:
            self._now = self._now + delta
            return self._now

    def set(self, when: datetime) -> None:
        """Sets the clock to ``when`` (aware; forward or back)."""
        value = check_aware("when", when).astimezone(UTC)
        with self._lock:
            self._now = value

    def __repr__(self) -> str:
        return f"ManualClock({self.now().isoformat()})"
