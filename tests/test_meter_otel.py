"""OpenTelemetryMeter against the OpenTelemetry SDK's in-memory metric reader."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from threadloom import (  # noqa: E402
    ClaimRequest,
    Commit,
    EventDraft,
    InMemoryCheckpointer,
    ManualClock,
    MeteredCheckpointer,
    StaleClaim,
    ValidationError,
)
from threadloom.persistence.metrics.meter import LATENCY_BUCKETS, MetricSpec  # noqa: E402
from threadloom.persistence.metrics.otel import OpenTelemetryMeter, instrument_name  # noqa: E402
from threadloom.testing.contract import CheckpointerContract  # noqa: E402
from threadloom.testing.harness import MemoryHarness  # noqa: E402
from threadloom.testing.metered_harness import metered_harness  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
TTL = timedelta(seconds=30)


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reader.provider = provider
    yield reader
    provider.shutdown()


def collect(reader) -> dict[str, list]:
    """Instrument name -> its data points, from one collection."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "threadloom"
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def point(points: list, **attributes: str):
    matches = [p for p in points if dict(p.attributes) == attributes]
    assert len(matches) == 1, (attributes, points)
    return matches[0]


def test_store_metrics_reach_the_sdk(reader):
    meter = OpenTelemetryMeter(reader.provider)
    store = MeteredCheckpointer(InMemoryCheckpointer(ManualClock(START)), meter)
    claim = store.claim("t", ClaimRequest(holder="run-1", ttl=TTL))
    event = EventDraft(run_id="run-1", type="step", timestamp=START)
    store.commit("t", Commit(token=claim.token, events=(event, event)))
    store.commit("t", Commit(token=claim.token, events=(event,)))
    with pytest.raises(StaleClaim):
        store.renew("t", claim.token + 1, TTL)
    assert len(store.await_events_after("t", 0, 10, timedelta(0))) == 3

    metrics = collect(reader)
    assert point(metrics["threadloom_store_calls"], op="commit").value == 2
    assert point(metrics["threadloom_store_errors"], op="renew", error="StaleClaim").value == 1
    assert point(metrics["threadloom_claims"], outcome="granted").value == 1
    assert point(metrics["threadloom_claims"], outcome="stale").value == 1
    assert point(metrics["threadloom_waits"], outcome="woken").value == 1
    assert metrics["threadloom_events_committed"][0].value == 3
    latency = point(metrics["threadloom_store_call_seconds"], op="commit")
    assert latency.count == 2 and latency.sum >= 0
    assert tuple(latency.explicit_bounds) == LATENCY_BUCKETS  # the advisory bucket boundaries were taken
    assert sum(latency.bucket_counts) == 2
    store.close()


def test_names_units_and_kinds(reader):
    meter = OpenTelemetryMeter(reader.provider)
    counter = MetricSpec(name="app_jobs_total", kind="counter", help="jobs")
    histogram = MetricSpec(name="app_job_seconds", kind="histogram", help="job time", unit="s")
    assert instrument_name(counter) == "app_jobs" and instrument_name(histogram) == "app_job_seconds"
    meter.describe(counter)
    meter.describe(histogram)
    meter.add("app_jobs_total", 4, (("queue", "a"),))
    meter.observe("app_job_seconds", 0.25)
    meter.add("undescribed_total", 1)
    with pytest.raises(ValidationError):
        meter.observe("app_jobs_total", 1.0)
    with pytest.raises(ValidationError):
        meter.describe(MetricSpec(name="app_jobs_total", kind="counter", help="other help"))
    data = reader.get_metrics_data()
    units = {m.name: m.unit for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}
    assert units["app_job_seconds"] == "s" and units["app_jobs"] == "1"
    assert "undescribed" in units


def _otel_meter() -> OpenTelemetryMeter:
    return OpenTelemetryMeter(MeterProvider(metric_readers=[InMemoryMetricReader()]))


class TestOpenTelemetryMeteredContract(CheckpointerContract):
    """The whole contract through a wrapper recording into the OpenTelemetry SDK."""

    harness_class = metered_harness(MemoryHarness, _otel_meter)
