"""PrometheusMeter against a real prometheus_client registry, and served over HTTP."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from threadloom import (  # noqa: E402
    ClaimRequest,
    Commit,
    EventDraft,
    InMemoryCheckpointer,
    ManualClock,
    MeteredCheckpointer,
    SweepPolicy,
    ThreadBusy,
    ValidationError,
)
from threadloom.persistence.metrics.meter import LATENCY_BUCKETS, MetricSpec  # noqa: E402
from threadloom.persistence.metrics.prometheus import PrometheusMeter  # noqa: E402
from threadloom.testing.contract import CheckpointerContract  # noqa: E402
from threadloom.testing.harness import MemoryHarness  # noqa: E402
from threadloom.testing.metered_harness import metered_harness  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
TTL = timedelta(seconds=30)


@pytest.fixture
def registry():
    return prometheus_client.CollectorRegistry()


def exercise(store: MeteredCheckpointer) -> None:
    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    with pytest.raises(ThreadBusy):
        store.claim("t", ClaimRequest(holder="run-2", ttl=TTL))
    event = EventDraft(run_id="run-1", type="step", timestamp=START)
    store.commit("t", Commit(token=claim.token, events=(event, event, event)))
    store.events_after("t", 0, 10)
    store.await_events_after("t", 3, 10, timedelta(0))
    store.sweep(SweepPolicy(), None)


def test_store_metrics_land_in_the_registry(registry):
    store = MeteredCheckpointer(InMemoryCheckpointer(ManualClock(START)), PrometheusMeter(registry))
    exercise(store)
    value = registry.get_sample_value
    assert value("threadloom_store_calls_total", {"op": "claim"}) == 2
    assert value("threadloom_store_calls_total", {"op": "commit"}) == 1
    assert value("threadloom_store_errors_total", {"op": "claim", "error": "ThreadBusy"}) == 1
    assert value("threadloom_claims_total", {"outcome": "granted"}) == 1
    assert value("threadloom_claims_total", {"outcome": "busy"}) == 1
    assert value("threadloom_events_committed_total") == 3
    assert value("threadloom_waits_total", {"outcome": "timed_out"}) == 1
    assert value("threadloom_sweep_pages_total") == 1
    assert value("threadloom_sweep_visited_total") == 1
    assert value("threadloom_sweep_reclaimed_total") == 0  # described up front, so exposed at zero
    assert value("threadloom_store_call_seconds_count", {"op": "commit"}) == 1
    assert value("threadloom_store_call_seconds_sum", {"op": "commit"}) >= 0
    assert value("threadloom_store_call_seconds_bucket", {"op": "commit", "le": "+Inf"}) == 1
    assert value("threadloom_store_call_seconds_bucket", {"op": "commit", "le": str(LATENCY_BUCKETS[-1])}) == 1
    text = prometheus_client.generate_latest(registry).decode()
    assert "# HELP threadloom_store_calls_total Store calls" in text
    assert "# TYPE threadloom_store_call_seconds histogram" in text
    store.close()


def test_one_meter_serves_several_stores_but_a_second_meter_on_the_registry_is_refused(registry):
    meter = PrometheusMeter(registry)
    one = MeteredCheckpointer(InMemoryCheckpointer(), meter)
    two = MeteredCheckpointer(InMemoryCheckpointer(), meter)
    one.latest("t")
    two.latest("t")
    assert registry.get_sample_value("threadloom_store_calls_total", {"op": "latest"}) == 2
    with pytest.raises(ValidationError) as caught:
        MeteredCheckpointer(InMemoryCheckpointer(), PrometheusMeter(registry))
    assert caught.value.field == "registry"
    assert "one PrometheusMeter per registry" in str(caught.value)


def test_undescribed_metrics_are_created_on_first_use_and_kinds_are_checked(registry):
    meter = PrometheusMeter(registry)
    meter.add("app_jobs_total", 2, (("queue", "a"),))
    meter.observe("app_job_seconds", 0.3)
    assert registry.get_sample_value("app_jobs_total", {"queue": "a"}) == 2
    assert registry.get_sample_value("app_job_seconds_count") == 1
    with pytest.raises(ValidationError):
        meter.observe("app_jobs_total", 1.0, (("queue", "a"),))
    with pytest.raises(ValidationError):
        meter.add("app_jobs_total", 1, (("other", "a"),))
    with pytest.raises(ValidationError):
        meter.describe(MetricSpec(name="app_jobs_total", kind="counter", help="different", labels=("queue",)))


def test_the_registry_is_served_over_http(registry):
    meter = PrometheusMeter(registry)
    store = MeteredCheckpointer(InMemoryCheckpointer(), meter)
    store.latest("t")
    with meter.serve(0) as server:
        assert server.port > 0 and server.url.endswith("/metrics")
        with urllib.request.urlopen(server.url, timeout=10) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain")
        assert 'threadloom_store_calls_total{op="latest"} 1.0' in body
        store.latest("t")
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert 'threadloom_store_calls_total{op="latest"} 2.0' in response.read().decode()
    server.close()  # twice does nothing
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)
    with pytest.raises(ValidationError):
        meter.serve(70000)
    store.close()


def _prometheus_meter() -> PrometheusMeter:
    return PrometheusMeter(prometheus_client.CollectorRegistry())


class TestPrometheusMeteredContract(CheckpointerContract):
    """The whole contract through a wrapper recording into a real registry."""

    harness_class = metered_harness(MemoryHarness, _prometheus_meter)
