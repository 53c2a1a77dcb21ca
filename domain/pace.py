"""``WalkPace``: the pace law of an access walk, and ``WalkPaceReport``, the message a walker sends about it.

A walk is background work on the store live commits write to, so it takes a bounded share of it by construction
(README "Access walks", docs/operations.md "Access walks"):

- ``share`` starts at ``walk_share``. After stamping a thread that took ``w`` seconds the walker waits
  ``max(w * (1 / share - 1), 1 / walk_rate - w)`` seconds (never less than 0): its stamping is at most ``share`` of
  its time, and it stamps at most ``walk_rate`` threads a second. Given the time the thread ended, it also waits
  until the next thread - counted as long as the last one - keeps the walker's stamping within any one second at
  most ``share`` of that second (the per-thread wait alone lets a run of slow threads that follows fast ones take
  more of a short span); this only ever lengthens the wait.
- Each second the walker reads whether the store's writes were *pressed*: pressed, ``share`` halves, down to
  ``walk_share / 8``; not pressed, it comes back by ``walk_share / 8``, up to ``walk_share``.
- A page holds the threads the current pace stamps in ``interval`` (at least 1, at most ``walk_batch``), so the
  walk records its cursor about once an ``interval``.

Pure: no clock is read here; the caller passes the time (``Clock.now()``) and the measured durations in. Not
thread-safe: one walker owns one pace.
"""

from __future__ import annotations

import collections
import math
from datetime import datetime, timedelta

import attrs

from threadloom.domain import validation as v
from threadloom.domain.errors import ValidationError

PRESS_FLOOR = 8
"""The share never falls below ``walk_share / PRESS_FLOOR`` and comes back by that much a second."""
SECOND = timedelta(seconds=1)
"""How often the pressed signal moves the share."""
_TIME_GRAIN = 1e-6
"""Seconds: a datetime's resolution; stamping within this of the second's budget still fits it."""


def _check_share(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValidationError(field, (f"must be a number in (0, 1], got {value!r}",))
    return float(value)


def _check_rate(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValidationError(field, (f"must be a finite number > 0, got {value!r}",))
    return float(value)


class WalkPace:
    """The pace of one walk on one node.

    Args:
        walk_share: the target share of the walker's time spent stamping, in (0, 1].
        walk_rate: the most threads stamped a second (> 0).
        interval: about how often the walk records its cursor (> 0): a page holds what the pace stamps in it.
        walk_batch: the most threads a page holds (>= 1).
        now: the time the pace starts at (an aware datetime): the first pressed second ends a second later.

    Raises:
        ValidationError: an argument out of range, naming it.
    """

    def __init__(
        self, walk_share: float, walk_rate: float, interval: timedelta, walk_batch: int, now: datetime
    ) -> None:
        self.walk_share = _check_share("walk_share", walk_share)
        self.walk_rate = _check_rate("walk_rate", walk_rate)
        self.interval = v.check_positive_duration("interval", interval)
        self.walk_batch = v.check_int("walk_batch", walk_batch, low=1)
        self._second_started = v.check_aware("now", now)
        self._origin = self._second_started
        self._stamps: collections.deque[tuple[float, float]] = collections.deque()
        """(start, end) of the threads stamped within the last second, in seconds after ``_origin``, oldest first."""
        self._stamps_busy = 0.0
        """The stamping time ``_stamps`` holds (the sum of their lengths)."""
        self.share = self.walk_share
        """The share in force now: ``walk_share`` halved per pressed second, down to ``walk_share / 8``."""
        self.last_stamp_s: float | None = None
        """How long, in seconds, the last thread's stamping took; None before the first."""
        self.pressed = False
        """Whether the last second read was pressed."""

    @classmethod
    def from_options(cls, options: object, now: datetime) -> WalkPace:
        """A pace from an ``AccessStampOptions`` (its ``walk_share``, ``walk_rate``, ``interval``, ``walk_batch``)."""
        return cls(
            getattr(options, "walk_share"),  # noqa: B009 - duck-typed: domain.access is another module's
            getattr(options, "walk_rate"),  # noqa: B009
            getattr(options, "interval"),  # noqa: B009
            getattr(options, "walk_batch"),  # noqa: B009
            now,
        )

    @property
    def floor(self) -> float:
        """The lowest share: ``walk_share / 8``."""
        return self.walk_share / PRESS_FLOOR

    def stamped(self, seconds: float, ended: datetime | None = None) -> float:
        """Records that stamping one thread took ``seconds`` (>= 0); returns how long to wait now, in seconds.

        The wait is ``max(w * (1 / share - 1), 1 / walk_rate - w)``, at least 0, with the share in force now.
        With ``ended`` (an aware datetime: when the thread's stamping ended, by the clock ``now`` came from) the
        wait is also at least what keeps the stamping within the second that ends with the next thread - counted
        as taking ``w`` too - at most ``share`` of it; a thread longer than ``share`` of a second has only the
        first bound.
        """
        w = max(0.0, float(seconds))
        self.last_stamp_s = w
        wait = max(w * (1.0 / self.share - 1.0), 1.0 / self.walk_rate - w, 0.0)
        if ended is None:
            return wait
        return max(wait, self._second_budget_wait(w, (v.check_aware("ended", ended) - self._origin).total_seconds()))

    def _second_budget_wait(self, w: float, end: float) -> float:
        """The least wait after a thread that took ``w`` and ended at ``end`` (seconds after ``_origin``) such
        that the second ending with a next thread of ``w`` holds at most ``share`` of a second of stamping.

        That wait ends one second after the earliest moment from which the stamps made, newest first, exceed
        what the second may still take: found from the oldest stamp on, past the ones the second drops, with the
        stamps' total kept as they come and go, so a thread costs a few steps however many the second holds."""
        horizon = SECOND.total_seconds()
        stamps = self._stamps
        if stamps and end < stamps[-1][1]:  # a clock that went back: the earlier stamps say nothing any more
            stamps.clear()
        if not stamps:
            self._stamps_busy = 0.0  # (a fresh total: no rounding carried over)
        stamps.append((end - w, end))
        self._stamps_busy += w
        while stamps and stamps[0][1] <= end - horizon:
            start, stop = stamps.popleft()
            self._stamps_busy -= stop - start
        budget = self.share * horizon - w  # what the stamps already made may take of that second
        if budget <= 0:
            return 0.0
        limit = budget + _TIME_GRAIN  # (a stamp that just fits is no reason to wait)
        rest = self._stamps_busy  # the stamping of the stamps from the one at hand to the newest
        for start, stop in stamps:  # oldest first
            took = stop - start
            newer = rest - took
            if rest <= limit:  # everything from here on fits
                return 0.0
            if newer <= limit:  # the oldest stamp that does not fit beside the newer ones
                earliest = stop - max(0.0, budget - newer)
                return max(0.0, earliest - (end + w - horizon))
            rest = newer
        return 0.0

    def second(self, pressed: bool) -> float:
        """Applies one second of the pressed signal; returns the share now.

        Pressed: ``share = max(share / 2, walk_share / 8)``; not pressed: ``share = min(walk_share, share +
        walk_share / 8)``.
        """
        self.pressed = bool(pressed)
        if pressed:
            self.share = max(self.share / 2.0, self.floor)
        else:
            self.share = min(self.walk_share, self.share + self.floor)
        return self.share

    def due(self, now: datetime) -> bool:
        """Whether a whole second has passed since the last one applied (the walker should read pressure)."""
        return now - self._second_started >= SECOND

    def tick(self, now: datetime, pressed: bool) -> int:
        """Applies the pressed signal once for each whole second that passed since the last applied one.

        ``pressed`` is what the caller read over those seconds (a store's ``pressed(window)`` over the time since
        its last read). A clock that went back applies nothing and restarts the second at ``now``.

        Returns:
            How many seconds were applied (0 when less than a second passed).
        """
        elapsed = now - self._second_started
        if elapsed < timedelta(0):
            self._second_started = now
            return 0
        seconds = int(elapsed / SECOND)
        # after PRESS_FLOOR seconds the share is at its floor or at walk_share whatever the start: apply no more
        for _ in range(min(seconds, PRESS_FLOOR + 1)):
            self.second(pressed)
        self._second_started += SECOND * seconds
        return seconds

    def rate(self) -> float:
        """The threads a second the pace allows now: ``1 / max(w / share, 1 / walk_rate)`` with ``w`` the last
        thread's stamping time (``walk_rate`` before the first)."""
        w = self.last_stamp_s or 0.0
        return 1.0 / max(w / self.share, 1.0 / self.walk_rate)

    def page_size(self) -> int:
        """The threads of the next page: what the current pace stamps in ``interval``, at least 1, at most
        ``walk_batch``."""
        threads = math.floor(self.rate() * self.interval.total_seconds())
        return max(1, min(self.walk_batch, threads))


@attrs.frozen
class WalkPaceReport:
    """What a walker tells its supervisor after each thread and each page (the ``WalkPace`` message).

    Attributes:
        graph_id: the walked graph kind.
        share: the share in force (0..1].
        rate: the threads a second the pace allows now.
        pressed: whether the last second read was pressed.
        cursor: the last thread id the walk recorded (None before the first page).
        count: the threads the walk stamped so far (all nodes, as recorded).
        schema: the hash of the schema walked.
        completed: whether the walk is past its last page.
    """

    graph_id: str
    share: float
    rate: float
    pressed: bool
    cursor: str | None
    count: int
    schema: str = ""
    completed: bool = False
