"""The wall clock (DESIGN §2): the only ``Clock`` that reads the operating system's time."""

from __future__ import annotations

from datetime import datetime, timezone


class SystemClock:
    """Reads the operating system's wall clock; ``now()`` is aware UTC with microsecond precision."""

    def now(self) -> datetime:
        """The current time, aware UTC."""
        return datetime.now(timezone.utc)

    def __repr__(self) -> str:
        return "SystemClock()"
