"""The pace law of access walks (``domain.pace.WalkPace``): property tests with hypothesis."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadloom.domain.errors import ValidationError
from threadloom.domain.pace import WalkPace

T0 = datetime(2026, 1, 1, tzinfo=UTC)
shares = st.floats(min_value=0.001, max_value=1.0, allow_nan=False)
rates = st.floats(min_value=0.01, max_value=10_000.0, allow_nan=False)
stamp_times = st.lists(st.floats(min_value=0.0, max_value=5.0, allow_nan=False), min_size=1, max_size=60)


def pace(share: float = 0.1, rate: float = 100.0, interval: float = 10.0, batch: int = 1000) -> WalkPace:
    return WalkPace(share, rate, timedelta(seconds=interval), batch, T0)


@settings(max_examples=200, deadline=None)
@given(share=shares, rate=rates, works=stamp_times, presses=st.lists(st.booleans(), min_size=60, max_size=60))
def test_measured_share_never_exceeds_target_and_rate_cap_holds(
    share: float, rate: float, works: list[float], presses: list[bool]
) -> None:
    p = pace(share, rate)
    busy = total = 0.0
    for index, w in enumerate(works):
        wait = p.stamped(w)
        assert wait >= 0
        # each thread alone keeps to the share in force and to the rate cap
        if w > 0:
            assert w / (w + wait) <= p.share * (1 + 1e-9)
        assert w + wait >= (1 / rate) * (1 - 1e-9)
        busy += w
        total += w + wait
        p.second(presses[index])
    assert total > 0
    assert busy / total <= share * (1 + 1e-9)  # the measured share never exceeds the target
    assert len(works) / total <= rate * (1 + 1e-9)  # never more than walk_rate threads a second


@settings(max_examples=200, deadline=None)
@given(share=shares, seconds=st.lists(st.booleans(), min_size=1, max_size=40))
def test_pressed_halves_down_to_an_eighth_and_recovers_an_eighth_a_second(share: float, seconds: list[bool]) -> None:
    p = pace(share)
    expected = share
    for pressed in seconds:
        before = p.share
        got = p.second(pressed)
        expected = max(expected / 2, share / 8) if pressed else min(share, expected + share / 8)
        assert math.isclose(got, expected, rel_tol=1e-9)
        assert share / 8 * (1 - 1e-9) <= got <= share * (1 + 1e-9)
        if pressed:
            assert got <= before
        else:
            assert got >= before


def test_the_share_floor_and_full_recovery_in_eight_seconds() -> None:
    p = pace(0.4)
    for _ in range(5):
        p.second(True)
    assert p.share == pytest.approx(0.05)  # 0.4 -> 0.2 -> 0.1 -> 0.05 (floor) -> 0.05
    for step in range(1, 8):
        p.second(False)
        assert p.share == pytest.approx(0.05 * (1 + step))
    p.second(False)
    assert p.share == pytest.approx(0.4)


def test_tick_applies_one_step_per_whole_second_of_the_passed_clock() -> None:
    p = pace(0.8)
    assert not p.due(T0 + timedelta(milliseconds=999))
    assert p.tick(T0 + timedelta(milliseconds=999), True) == 0
    assert p.share == pytest.approx(0.8)
    assert p.due(T0 + timedelta(seconds=1))
    assert p.tick(T0 + timedelta(seconds=2, milliseconds=500), True) == 2
    assert p.share == pytest.approx(0.2)
    assert p.pressed
    # the half second left over counts toward the next second
    assert p.tick(T0 + timedelta(seconds=3), False) == 1
    assert p.share == pytest.approx(0.3)
    assert p.tick(T0, True) == 0  # a clock that went back applies nothing
    assert p.share == pytest.approx(0.3)


@settings(max_examples=200, deadline=None)
@given(
    share=shares,
    rate=rates,
    interval=st.floats(min_value=0.001, max_value=600, allow_nan=False),
    batch=st.integers(min_value=1, max_value=5000),
    w=st.one_of(st.none(), st.floats(min_value=0.0, max_value=10.0, allow_nan=False)),
)
def test_page_size_is_what_the_pace_stamps_in_an_interval(
    share: float, rate: float, interval: float, batch: int, w: float | None
) -> None:
    p = pace(share, rate, interval, batch)
    if w is not None:
        p.stamped(w)
    size = p.page_size()
    assert 1 <= size <= batch
    cycle = max((w or 0.0) / share, 1 / rate)  # seconds per thread at this pace
    threads = math.floor(interval / cycle * (1 + 1e-12))
    assert size == max(1, min(batch, threads)) or abs(size - max(1, min(batch, threads))) <= 1


def test_page_size_examples() -> None:
    assert pace(0.1, 100.0, 10.0, 1000).page_size() == 1000  # no stamp yet: the rate cap, 100/s for 10 s
    p = pace(0.1, 100.0, 10.0, 1000)
    p.stamped(0.05)  # 0.05 s at share 0.1 -> one thread each 0.5 s -> 20 in 10 s
    assert p.page_size() == 20
    p.stamped(30.0)  # slower than an interval: still one thread a page
    assert p.page_size() == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"walk_share": 0.0}, "walk_share"),
        ({"walk_share": 1.5}, "walk_share"),
        ({"walk_rate": 0}, "walk_rate"),
        ({"walk_rate": math.inf}, "walk_rate"),
        ({"walk_batch": 0}, "walk_batch"),
        ({"interval": timedelta(0)}, "interval"),
    ],
)
def test_out_of_range_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {
        "walk_share": 0.1,
        "walk_rate": 100.0,
        "interval": timedelta(seconds=10),
        "walk_batch": 1000,
        "now": T0,
    }
    args.update(kwargs)
    with pytest.raises(ValidationError) as raised:
        WalkPace(**args)  # type: ignore[arg-type]
    assert raised.value.field == field


def _second_busy(stamps: list[tuple[float, float]], end: float) -> float:
    """Stamping time within the second ending at ``end``."""
    return sum(max(0.0, min(stop, end) - max(start, end - 1.0)) for start, stop in stamps)


@settings(max_examples=200, deadline=None)
@given(share=st.floats(min_value=0.01, max_value=1.0), works=stamp_times.map(lambda ws: [w / 10 for w in ws]))
def test_with_the_end_time_each_second_keeps_to_the_share_and_the_wait_is_never_shorter(
    share: float, works: list[float]
) -> None:
    p = pace(share, rate=10_000.0)
    law = pace(share, rate=10_000.0)
    now = 0.0
    stamps: list[tuple[float, float]] = []
    for index, w in enumerate(works):
        start, now = now, now + w
        stamps.append((start, now))
        wait = p.stamped(w, T0 + timedelta(seconds=now))
        assert wait >= law.stamped(w) - 1e-9  # the per-thread law still holds: the wait only grows
        # the second that ends with the stamp just made holds at most the share, plus what this thread took
        # beyond the one before it (the pace counted the next thread as long as the last one)
        grew = max(0.0, w - works[index - 1]) if index else w
        if w <= share:
            assert _second_busy(stamps, now) <= share + grew + 1e-5  # datetimes hold microseconds
        now += wait


def test_slow_threads_after_fast_ones_wait_for_the_second_to_make_room() -> None:
    p = pace(0.1, rate=10_000.0)
    now = 0.0
    for _ in range(50):  # fast threads, 2 ms each, paced by the law: 18 ms apart
        now += 0.002
        assert p.stamped(0.002, T0 + timedelta(seconds=now)) == pytest.approx(0.018)
        now += 0.018
    now += 0.030  # then a slow one (30 ms): its second already holds 0.1 s of stamping
    assert p.stamped(0.030, T0 + timedelta(seconds=now)) > 0.27 + 0.05  # longer than the law's 270 ms
    assert pace(0.1, rate=10_000.0).stamped(0.030) == pytest.approx(0.27)  # without the end time: the law


def test_a_clock_that_goes_back_forgets_the_earlier_stamps() -> None:
    p = pace(0.1, rate=10_000.0)
    assert p.stamped(0.05, T0 + timedelta(seconds=10)) == pytest.approx(0.45)
    assert p.stamped(0.01, T0 + timedelta(seconds=5)) == pytest.approx(0.09)


def _plain_second_wait(stamps: list[tuple[float, float]], share: float, w: float, end: float) -> float:
    """The per-second wait by its definition: the stamps of the last second, newest first, until they exceed
    what the second ending with a next thread of ``w`` may still take."""
    budget = share - w
    if budget <= 0:
        return 0.0
    busy = 0.0
    for start, stop in reversed([(a, b) for a, b in stamps if b > end - 1.0]):
        if busy + (stop - start) > budget + 1e-6:
            return max(0.0, stop - max(0.0, budget - busy) - (end + w - 1.0))
        busy += stop - start
    return 0.0


@pytest.mark.parametrize("share", [0.05, 0.3, 1.0])
def test_a_second_of_thousands_of_short_stamps_waits_as_the_definition_says(share: float) -> None:
    p = pace(share, rate=1_000_000.0)
    law = pace(share, rate=1_000_000.0)
    cycle = [0.0001, 0.0003, 0.002, 0.0001, 0.0005]  # seconds: short stamps, an occasional longer one
    now = 0.0
    stamps: list[tuple[float, float]] = []
    for index in range(1500):
        w = cycle[index % len(cycle)]
        now += w
        end = (T0 + timedelta(seconds=now) - T0).total_seconds()  # what the pace sees of the end time
        stamps.append((end - w, end))
        expected = max(law.stamped(w), _plain_second_wait(stamps, share, w, end))
        assert p.stamped(w, T0 + timedelta(seconds=now)) == pytest.approx(expected, abs=1e-9)
        now += expected
