"""The wall clock: the only ``Clock`` that reads the operating system's time."""

from __future__ import annotations

from datetime import UTC, datetime


class SystemClock:
    """Reads the operating system's wall clock; ``now()`` is aware UTC with microsecond precision."""

    def now(self) -> datetime:
        """The current time, aware UTC."""
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"


def check_clock(field: str, clock: object) -> object:
    """Validates that ``clock`` has a callable ``now()`` (a ``Clock``); raises ``ValidationError`` otherwise."""
    from threadloom.domain.errors import ValidationError

    if not callable(getattr(clock, "now", None)):
        raise ValidationError(field, (f"must be a Clock with a now() method, got {type(clock).__name__}",))
    return clock


def read_clock(clock: object) -> datetime:
    """``clock.now()`` checked to be timezone-aware and converted to UTC (a naive reading is a ``ProcessingError``)."""
    from threadloom.domain.errors import ProcessingError

    now = clock.now()  # type: ignore[attr-defined]
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise ProcessingError("clock", f"the store's clock returned {now!r}, not a timezone-aware datetime")
    return now.astimezone(UTC)
