"""The per-store pressed signal and the history bulkhead (``persistence.pressure``), on real stores."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from threadloom.domain.errors import StoreUnavailable, ValidationError
from threadloom.domain.values import ClaimRequest
from threadloom.persistence.memory import InMemoryCheckpointer
from threadloom.persistence.metrics import MeteredCheckpointer
from threadloom.persistence.pressure import Bulkhead, BulkheadFull, WritePressure, pool_probe
from threadloom.persistence.sqlite import SqliteCheckpointer


def claim_request(holder: str) -> ClaimRequest:
    return ClaimRequest(holder=holder, ttl=timedelta(seconds=30))


def test_write_pressure_records_slow_calls_and_busy_errors() -> None:
    pressure = WritePressure(timedelta(milliseconds=50))
    assert not pressure.pressed()
    pressure.record(0.01)
    assert not pressure.pressed()
    pressure.record(0.2)
    assert pressure.pressed()
    assert not pressure.pressed(timedelta(0) - timedelta(microseconds=1))
    other = WritePressure()
    other.record(0.0, StoreUnavailable("commit", "busy"))
    assert other.pressed() and other.presses == 1
    calm = WritePressure()
    calm.record(0.0, ValueError("not a store failure"))
    assert not calm.pressed()


class FakeClock:
    """Seconds passed in by the test (the relative signal's clock)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def one_second(pressure: WritePressure, clock: FakeClock, durations: list[float]) -> None:
    """Write calls of ``durations`` seconds spread over one second of the passed clock, which ends a second later."""
    began = clock.now
    for index, seconds in enumerate(durations):
        clock.now = began + 0.9 * index / len(durations)
        pressure.record(seconds)
    clock.now = began + 1.0


def test_relative_signal_presses_when_a_second_is_slower_than_the_baseline() -> None:
    clock = FakeClock()
    pressure = WritePressure(timedelta(seconds=10), ratio=1.5, clock=clock)
    for _ in range(6):  # calm seconds: 2 ms calls, well under the fixed threshold
        one_second(pressure, clock, [0.002] * 20)
        assert not pressure.pressed()
    assert pressure.baseline == pytest.approx(0.002)
    one_second(pressure, clock, [0.0025] * 20)  # 1.25x: within the ratio
    assert not pressure.pressed()
    one_second(pressure, clock, [0.004] * 20)  # 2x the baseline, still far under the fixed threshold
    assert pressure.pressed() and pressure.last_p90 == pytest.approx(0.004)
    clock.now += 1.5  # a second with no calls: the press is older than the window
    assert not pressure.pressed()
    assert pressure.baseline is not None and pressure.baseline <= 0.002 * 1.5 * 1.01  # moved up little


def test_relative_signal_ignores_sparse_seconds_the_floor_and_the_warmup() -> None:
    clock = FakeClock()
    pressure = WritePressure(timedelta(seconds=10), clock=clock)
    one_second(pressure, clock, [0.002] * 20)
    one_second(pressure, clock, [0.1] * 20)  # within the warm-up: sets no press
    assert not pressure.pressed()
    micro = WritePressure(timedelta(seconds=10), clock=clock)
    for _ in range(5):
        one_second(micro, clock, [0.00001] * 20)
    one_second(micro, clock, [0.0005] * 20)  # 50x, but under the 1 ms floor: a store waiting on nothing
    assert not micro.pressed()
    sparse = WritePressure(timedelta(seconds=10), clock=clock)
    for _ in range(5):
        one_second(sparse, clock, [0.002] * 20)
    one_second(sparse, clock, [0.05] * 3)  # too few calls to judge a second
    assert not sparse.pressed()
    off = WritePressure(timedelta(seconds=10), ratio=None, clock=clock)
    for _ in range(5):
        one_second(off, clock, [0.002] * 20)
    one_second(off, clock, [0.05] * 20)
    assert not off.pressed() and off.baseline is None


def test_a_lasting_slower_load_becomes_the_baseline() -> None:
    clock = FakeClock()
    pressure = WritePressure(timedelta(seconds=10), clock=clock)
    for _ in range(5):
        one_second(pressure, clock, [0.002] * 20)
    pressed = []
    for _ in range(120):  # the load doubles for good
        one_second(pressure, clock, [0.004] * 20)
        pressed.append(pressure.pressed())
    assert pressed[0] and not any(pressed[-30:])


@pytest.mark.parametrize("ratio", [1.0, 0.5, True, "2", float("inf")])
def test_press_ratio_out_of_range_names_the_field(ratio: object) -> None:
    with pytest.raises(ValidationError, match="press_ratio"):
        WritePressure(ratio=ratio)  # type: ignore[arg-type]


def test_bulkhead_refuses_past_its_limit_and_presses() -> None:
    pressure = WritePressure()
    bulkhead = Bulkhead("history reads", 2, pressure)
    with bulkhead.slot(), bulkhead.slot():
        assert bulkhead.running == 2
        with pytest.raises(BulkheadFull), bulkhead.slot():
            pass
    assert bulkhead.running == 0 and bulkhead.refused == 1
    assert pressure.pressed()


def test_pool_probe_reads_waits_from_pool_statistics() -> None:
    class Stats:
        def __init__(self) -> None:
            self.stats = {"requests_queued": 0, "requests_waiting": 0}

        def get_stats(self) -> dict[str, int]:
            return dict(self.stats)

    pool = Stats()
    probe = pool_probe(pool)
    assert probe is not None and pool_probe(object()) is None
    assert not probe() and not probe()
    pool.stats["requests_queued"] = 3
    assert probe()  # queued since the last read
    assert not probe()
    pool.stats["requests_waiting"] = 1
    assert probe()


def test_memory_store_lock_wait_presses_it() -> None:
    store = InMemoryCheckpointer()
    store.write_pressure.threshold = timedelta(milliseconds=30)
    store.claim("t1", claim_request("r1"))
    assert not store.pressed()
    # a write that waits behind the store's lock for longer than the threshold
    store._lock.acquire()  # noqa: SLF001 - holds the store's own lock, as a long write would
    done = threading.Event()

    def write() -> None:
        store.claim("t2", claim_request("r2"))
        done.set()

    worker = threading.Thread(target=write)
    worker.start()
    time.sleep(0.1)
    store._lock.release()  # noqa: SLF001
    worker.join(5)
    assert done.is_set()
    assert store.pressed()
    assert MeteredCheckpointer(store).pressed()  # wrappers show their store's signal


def test_sqlite_write_lock_wait_presses_the_waiting_store(tmp_path) -> None:
    path = tmp_path / "p.db"
    first = SqliteCheckpointer.open(path)
    second = SqliteCheckpointer.open(path)
    try:
        second.write_pressure.threshold = timedelta(milliseconds=30)
        second.claim("t0", claim_request("r0"))
        assert not second.pressed(timedelta(milliseconds=1))
        import sqlite3

        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
        done = threading.Event()

        def write() -> None:
            second.claim("t1", claim_request("r1"))
            done.set()

        worker = threading.Thread(target=write)
        worker.start()
        time.sleep(0.15)
        blocker.execute("ROLLBACK")
        blocker.close()
        worker.join(10)
        assert done.is_set()
        assert second.pressed()
        assert not first.pressed()  # the signal is per store object: first did not wait
    finally:
        first.close()
        second.close()


@pytest.mark.postgres
def test_postgres_pool_wait_presses_the_store() -> None:
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    try:
        store = harness.open_pg(min_size=1, max_size=1)
        store.claim("t0", claim_request("r0"))
        assert not store.pressed(timedelta(milliseconds=1))  # the probe's first read sets its baseline
        assert not store.pressed(timedelta(milliseconds=1))
        held = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with store.pool.connection():
                held.set()
                release.wait(5)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(5)
        reader = threading.Thread(target=lambda: store.latest("t0"))  # a read queues for the one connection
        reader.start()
        time.sleep(0.2)
        assert store.pressed(timedelta(milliseconds=1))  # a request waits for a connection now
        release.set()
        holder.join(5)
        reader.join(5)
    finally:
        harness.cleanup()
