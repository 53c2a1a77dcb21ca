"""Values, validation, errors and the pure rules of the domain (DESIGN §2, §3)."""

from __future__ import annotations

import enum
import math
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadloom.domain import rules
from threadloom.domain import validation as v
from threadloom.domain.clock import ManualClock
from threadloom.domain.errors import (
    CancelledError,
    CheckpointConflict,
    CheckpointNotFound,
    InvalidCommit,
    OutcomeUnknown,
    ProcessingError,
    ReplayUnavailable,
    StaleClaim,
    ThreadBusy,
    ThreadDeleted,
    ThreadloomError,
    ValidationError,
)
from threadloom.domain.values import (
    BusyHolder,
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    PendingWrite,
    RetentionPolicy,
    SweepPolicy,
    ThreadCursor,
    ThreadPage,
    ThreadQuery,
    ThreadStatus,
    ThreadSummary,
)
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing import strategies as tls

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NAIVE = datetime(2026, 1, 1)


def refused(field: str, build) -> ValidationError:
    """Asserts ``build()`` raises ValidationError naming ``field`` with at least one problem; returns it."""
    with pytest.raises(ValidationError) as info:
        build()
    assert info.value.field == field, f"field {info.value.field!r}, expected {field!r}"
    assert info.value.problems and all(isinstance(p, str) and p for p in info.value.problems)
    return info.value


def checkpoint(**fields) -> Checkpoint:
    base = dict(id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW)
    return Checkpoint(**{**base, **fields})


# -- ids ---------------------------------------------------------------------------------------------------------------

BAD_IDS = [
    pytest.param("", id="empty"),
    pytest.param("x" * 256, id="256-chars"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("a\ud800b", id="surrogate"),
    pytest.param("\udfff", id="low-surrogate"),
    pytest.param(7, id="int"),
    pytest.param(b"abc", id="bytes"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_ids_are_refused_naming_the_field(bad) -> None:
    refused("thread_id", lambda: v.check_id("thread_id", bad))


@pytest.mark.parametrize("good", ["a", "x" * 255, "日本語 ☃ 🧵", "with space", "tab\there", "-"])
def test_good_ids_pass_unchanged(good: str) -> None:
    assert v.check_id("thread_id", good) is good


def test_an_overlong_id_names_its_length() -> None:
    error = refused("thread_id", lambda: v.check_id("thread_id", "x" * 256))
    assert any("256" in problem for problem in error.problems)


def test_several_problems_of_one_id_are_all_reported() -> None:
    error = refused("key", lambda: v.check_id("key", "\x00" * 256))
    assert len(error.problems) == 2


@given(tls.ids())
def test_strategy_ids_are_valid(value: str) -> None:
    assert v.check_id("id", value) == value


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("checkpoint.id", lambda bad: checkpoint(id=bad)),
        ("checkpoint.parent", lambda bad: checkpoint(parent=bad)),
        ("checkpoint.thread_id", lambda bad: checkpoint(thread_id=bad)),
        ("checkpoint.run_id", lambda bad: checkpoint(run_id=bad)),
        ("checkpoint.graph_id", lambda bad: checkpoint(graph_id=bad)),
        ("checkpoint.tenant_id", lambda bad: checkpoint(tenant_id=bad)),
        ("origin.parent_thread", lambda bad: CheckpointOrigin(parent_thread=bad)),
        ("origin.parent_checkpoint", lambda bad: CheckpointOrigin(parent_thread="p", parent_checkpoint=bad)),
        ("origin.task_id", lambda bad: CheckpointOrigin(parent_thread="p", task_id=bad)),
        ("pending_write.checkpoint_id", lambda bad: PendingWrite(checkpoint_id=bad, task_id="t", node_id="n")),
        ("pending_write.task_id", lambda bad: PendingWrite(checkpoint_id="c", task_id=bad, node_id="n")),
        ("pending_write.node_id", lambda bad: PendingWrite(checkpoint_id="c", task_id="t", node_id=bad)),
        ("event.run_id", lambda bad: EventDraft(run_id=bad, type="e", timestamp=NOW)),
        ("event.type", lambda bad: EventDraft(run_id="r", type=bad, timestamp=NOW)),
        ("event.checkpoint_id", lambda bad: EventDraft(run_id="r", type="e", timestamp=NOW, checkpoint_id=bad)),
        ("event.task_id", lambda bad: EventDraft(run_id="r", type="e", timestamp=NOW, task_id=bad)),
        ("event.node_id", lambda bad: EventDraft(run_id="r", type="e", timestamp=NOW, node_id=bad)),
        ("effect.key", lambda bad: EffectRecord(key=bad, run_id="r", recorded_at=NOW)),
        ("effect.run_id", lambda bad: EffectRecord(key="k", run_id=bad, recorded_at=NOW)),
        ("effect.checkpoint_id", lambda bad: EffectRecord(key="k", run_id="r", recorded_at=NOW, checkpoint_id=bad)),
        ("effect.task_id", lambda bad: EffectRecord(key="k", run_id="r", recorded_at=NOW, task_id=bad)),
        ("request.holder", lambda bad: ClaimRequest(holder=bad, ttl=timedelta(seconds=1))),
        ("request.tenant_id", lambda bad: ClaimRequest(holder="r", ttl=timedelta(seconds=1), tenant_id=bad)),
        ("query.tenant_id", lambda bad: ThreadQuery(tenant_id=bad)),
        ("query.graph_id", lambda bad: ThreadQuery(tenant_id=None, graph_id=bad)),
        ("after.thread_id", lambda bad: ThreadCursor(updated_at=NOW, thread_id=bad)),
    ],
)
@pytest.mark.parametrize("bad", ["", "x" * 256, "a\x00", "\ud800", 3])
def test_value_ids_are_validated_naming_the_field(field: str, build, bad) -> None:
    refused(field, lambda: build(bad))


# -- JSON values -------------------------------------------------------------------------------------------------------


class _Color(enum.IntEnum):
    RED = 1


class _Money(float):
    pass


BAD_JSON = [
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(float("-inf"), id="-inf"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param(bytearray(b"x"), id="bytearray"),
    pytest.param({1, 2}, id="set"),
    pytest.param(frozenset({"a"}), id="frozenset"),
    pytest.param(object(), id="object"),
    pytest.param({1: "a"}, id="int-key"),
    pytest.param({("a",): 1}, id="tuple-key"),
    pytest.param({"ok": {2: "b"}}, id="nested-int-key"),
    pytest.param([1, {"x": float("nan")}], id="nested-nan"),
    pytest.param(Decimal("1.5"), id="decimal"),
    pytest.param(1 + 2j, id="complex"),
    pytest.param(NOW, id="datetime"),
    pytest.param(_Color.RED, id="int-enum"),
    pytest.param(_Money(1.5), id="float-subclass"),
    pytest.param("a\ud800", id="surrogate-string"),
    pytest.param({"\ud800": 1}, id="surrogate-key"),
    pytest.param(lambda: None, id="function"),
]


@pytest.mark.parametrize("bad", BAD_JSON)
def test_non_json_values_are_refused(bad) -> None:
    refused("checkpoint.state", lambda: v.check_json("checkpoint.state", bad))
    refused("checkpoint.state", lambda: checkpoint(state=bad))
    refused("pending_write.payload", lambda: PendingWrite(checkpoint_id="c", task_id="t", node_id="n", payload=bad))
    refused("event.payload", lambda: EventDraft(run_id="r", type="e", timestamp=NOW, payload=bad))
    refused("effect.result", lambda: EffectRecord(key="k", run_id="r", recorded_at=NOW, result=bad))


def test_a_bad_json_part_is_named_by_its_path() -> None:
    error = refused("state", lambda: v.check_json("state", {"a": [1, {"b": math.nan}]}))
    assert "state.a[1].b" in error.problems[0]


def test_json_nesting_is_bounded() -> None:
    deep: list = []
    for _ in range(v.MAX_JSON_DEPTH + 5):
        deep = [deep]
    refused("state", lambda: v.check_json("state", deep))
    ok: list = []
    for _ in range(100):
        ok = [ok]
    assert v.check_json("state", ok) is ok


@pytest.mark.parametrize(
    "good",
    [
        None,
        True,
        False,
        0,
        -5,
        2**70,
        1.5,
        -0.0,
        1e308,
        "",
        "nul \x00 inside a string is JSON",
        [],
        {},
        (1, "a"),
        {"a": [1, {"b": None}]},
        ["☃", {"": ""}],
    ],
)
def test_json_values_pass_unchanged(good) -> None:
    assert v.check_json("state", good) is good


@given(tls.json_values())
def test_strategy_json_values_are_valid(value) -> None:
    v.check_json("state", value)


# -- times and durations -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("checkpoint.created_at", lambda bad: checkpoint(created_at=bad)),
        ("event.timestamp", lambda bad: EventDraft(run_id="r", type="e", timestamp=bad)),
        ("effect.recorded_at", lambda bad: EffectRecord(key="k", run_id="r", recorded_at=bad)),
        ("query.updated_since", lambda bad: ThreadQuery(tenant_id=None, updated_since=bad)),
        ("after.updated_at", lambda bad: ThreadCursor(updated_at=bad, thread_id="t")),
        ("start", lambda bad: ManualClock(bad)),
        ("when", lambda bad: ManualClock(NOW).set(bad)),
    ],
)
@pytest.mark.parametrize("bad", [NAIVE, date(2026, 1, 1), "2026-01-01T00:00:00Z", 1_700_000_000])
def test_naive_and_non_datetimes_are_refused(field: str, build, bad) -> None:
    refused(field, lambda: build(bad))


def test_aware_datetimes_in_any_offset_are_accepted() -> None:
    plus_two = datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    assert checkpoint(created_at=plus_two).created_at == NOW


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))))
    assert clock.now() == NOW and clock.now().utcoffset() == timedelta(0)
    assert clock.advance(timedelta(seconds=5)) == NOW + timedelta(seconds=5)
    clock.advance(-timedelta(seconds=10))
    assert clock.now() == NOW - timedelta(seconds=5)
    clock.set(NOW)
    assert clock.now() == NOW
    refused("delta", lambda: clock.advance(5))


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(microseconds=-1), 5, 1.5, None])
def test_claim_ttl_must_be_a_positive_duration(bad) -> None:
    refused("request.ttl", lambda: ClaimRequest(holder="r", ttl=bad))


# -- policies and queries ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("retention.max_age", lambda: RetentionPolicy(max_age=timedelta(0))),
        ("retention.max_age", lambda: RetentionPolicy(max_age=-timedelta(seconds=1))),
        ("retention.max_age", lambda: RetentionPolicy(max_age=60)),
        ("retention.max_checkpoints", lambda: RetentionPolicy(max_checkpoints=0)),
        ("retention.max_checkpoints", lambda: RetentionPolicy(max_checkpoints=-1)),
        ("retention.max_checkpoints", lambda: RetentionPolicy(max_checkpoints=True)),
        ("retention.max_checkpoints", lambda: RetentionPolicy(max_checkpoints=2.0)),
        ("retention.max_events", lambda: RetentionPolicy(max_events=-1)),
        ("retention.max_events", lambda: RetentionPolicy(max_events="3")),
        ("policy.batch_size", lambda: SweepPolicy(batch_size=0)),
        ("policy.batch_size", lambda: SweepPolicy(batch_size=10_001)),
        ("policy.batch_size", lambda: SweepPolicy(batch_size=None)),
        ("policy.tombstone_age", lambda: SweepPolicy(tombstone_age=timedelta(0))),
        ("policy.tombstone_age", lambda: SweepPolicy(tombstone_age=3600)),
        ("policy.retention", lambda: SweepPolicy(retention="keep everything")),
        ("policy.retention", lambda: SweepPolicy(retention=None)),
        ("query.limit", lambda: ThreadQuery(tenant_id=None, limit=0)),
        ("query.limit", lambda: ThreadQuery(tenant_id=None, limit=ThreadQuery.MAX_LIMIT + 1)),
        ("query.limit", lambda: ThreadQuery(tenant_id=None, limit=True)),
        ("query.limit", lambda: ThreadQuery(tenant_id=None, limit="10")),
        ("query.statuses", lambda: ThreadQuery(tenant_id=None, statuses="idle")),
        ("query.statuses", lambda: ThreadQuery(tenant_id=None, statuses={"idle"})),
        ("query.statuses", lambda: ThreadQuery(tenant_id=None, statuses=[CheckpointStatus.RUNNING])),
        ("query.statuses", lambda: ThreadQuery(tenant_id=None, statuses=5)),
        ("query.after", lambda: ThreadQuery(tenant_id=None, after="t1")),
        ("query.after", lambda: ThreadQuery(tenant_id=None, after=(NOW, "t1"))),
    ],
)
def test_policy_and_query_ranges(field: str, build) -> None:
    refused(field, build)


def test_policy_and_query_bounds_that_are_allowed() -> None:
    assert RetentionPolicy().keeps_everything
    policy = RetentionPolicy(max_age=timedelta(microseconds=1), max_checkpoints=1, max_events=0)
    assert not policy.keeps_everything
    assert SweepPolicy(batch_size=1).batch_size == 1
    assert SweepPolicy().batch_size == 100 and SweepPolicy().tombstone_age is None
    assert SweepPolicy().retention == RetentionPolicy()
    assert ThreadQuery.MAX_LIMIT == 1000
    assert ThreadQuery(tenant_id=None, limit=1).limit == 1
    assert ThreadQuery(tenant_id=None, limit=1000).limit == 1000
    assert ThreadQuery(tenant_id=None).limit == 50
    query = ThreadQuery(tenant_id="a", statuses=[ThreadStatus.IDLE, ThreadStatus.IDLE])
    assert query.statuses == frozenset({ThreadStatus.IDLE})
    assert ThreadQuery(tenant_id="a", statuses=set()).statuses == frozenset()


def test_thread_query_matches_every_filter() -> None:
    summary = ThreadSummary(
        thread_id="t",
        tenant_id="a",
        status=ThreadStatus.IDLE,
        updated_at=NOW,
        latest_checkpoint_id="c",
        latest_run_id="r",
        graph_id="g",
    )
    assert ThreadQuery(tenant_id="a").matches(summary)
    assert not ThreadQuery(tenant_id=None).matches(summary)
    assert not ThreadQuery(tenant_id="b").matches(summary)
    assert ThreadQuery(tenant_id="a", statuses={ThreadStatus.IDLE}).matches(summary)
    assert not ThreadQuery(tenant_id="a", statuses={ThreadStatus.RUNNING}).matches(summary)
    assert ThreadQuery(tenant_id="a", updated_since=NOW).matches(summary)
    assert not ThreadQuery(tenant_id="a", updated_since=NOW + timedelta(microseconds=1)).matches(summary)
    assert ThreadQuery(tenant_id="a", graph_id="g").matches(summary)
    assert not ThreadQuery(tenant_id="a", graph_id="h").matches(summary)


def test_thread_page_of_has_a_cursor_only_when_more_follow() -> None:
    rows = [
        ThreadSummary(
            thread_id=f"t{i}",
            tenant_id=None,
            status=ThreadStatus.IDLE,
            updated_at=NOW + timedelta(seconds=i),
            latest_checkpoint_id="c",
            latest_run_id="r",
            graph_id="g",
        )
        for i in range(3)
    ]
    page = ThreadPage.of(rows, 2)
    assert page.items == tuple(rows[:2])
    assert page.next == ThreadCursor(updated_at=rows[1].updated_at, thread_id="t1") == rows[1].cursor
    assert ThreadPage.of(rows[:2], 2).next is None
    assert ThreadPage.of([], 2) == ThreadPage()


# -- commits -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("commit.token", lambda: Commit(token=0)),
        ("commit.token", lambda: Commit(token=-3)),
        ("commit.token", lambda: Commit(token=True)),
        ("commit.token", lambda: Commit(token=None)),
        ("commit.token", lambda: Commit(token="7")),
        ("commit.checkpoint", lambda: Commit(token=1, checkpoint="c1")),
        ("commit.pending_writes", lambda: Commit(token=1, pending_writes="w")),
        ("commit.pending_writes", lambda: Commit(token=1, pending_writes=None)),
        ("commit.pending_writes[0]", lambda: Commit(token=1, pending_writes=[{"checkpoint_id": "c"}])),
        ("commit.events[1]", lambda: Commit(token=1, events=[EventDraft(run_id="r", type="e", timestamp=NOW), "e"])),
        ("commit.events", lambda: Commit(token=1, events={"type": "e"})),
        (
            "commit.effects[0]",
            lambda: Commit(token=1, effects=[PendingWrite(checkpoint_id="c", task_id="t", node_id="n")]),
        ),
        ("commit.fence", lambda: Commit(token=1, fence=("other",))),
        ("commit.fence", lambda: Commit(token=1, fence=["other", 2])),
        ("commit.fence", lambda: Commit(token=1, fence="other")),
        ("commit.fence thread_id", lambda: Commit(token=1, fence=("", 2))),
        ("commit.fence token", lambda: Commit(token=1, fence=("other", 0))),
        ("commit.fence token", lambda: Commit(token=1, fence=("other", "2"))),
        ("commit.retract_turn", lambda: Commit(token=1, retract_turn="yes")),
        ("commit.retract_turn", lambda: Commit(token=1, retract_turn=None)),
    ],
)
def test_commit_fields_are_validated(field: str, build) -> None:
    refused(field, build)


def test_commit_takes_any_iterable_and_keeps_order() -> None:
    drafts = (EventDraft(run_id="r", type=f"e{i}", timestamp=NOW) for i in range(3))
    commit = Commit(token=1, events=drafts, fence=("other", 4), metadata={"a": "b"})
    assert [draft.type for draft in commit.events] == ["e0", "e1", "e2"]
    assert commit.fence == ("other", 4) and commit.metadata == {"a": "b"}


@pytest.mark.parametrize(
    ("metadata", "field_start"),
    [
        ({"k": 1}, "metadata"),
        ({1: "v"}, "metadata"),
        ({"k": "v\x00"}, "metadata"),
        ({"\ud800": "v"}, "metadata"),
        (["k", "v"], "metadata"),
    ],
)
def test_metadata_must_map_text_to_text(metadata, field_start: str) -> None:
    for build in (lambda: checkpoint(metadata=metadata), lambda: Commit(token=1, metadata=metadata)):
        with pytest.raises(ValidationError) as info:
            build()
        assert info.value.field.startswith(field_start)


def test_metadata_is_copied_on_construction() -> None:
    source = {"k": "v"}
    commit = Commit(token=1, metadata=source)
    source["k"] = "changed"
    assert commit.metadata == {"k": "v"}


def test_values_are_frozen_and_compared_by_value() -> None:
    first = checkpoint(state={"a": [1]})
    assert first == checkpoint(state={"a": [1]})
    assert first != checkpoint(state={"a": [2]})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.id = "other"  # type: ignore[misc]
    assert Commit(token=1) == Commit(token=1)
    assert ClaimRequest(holder="r", ttl=timedelta(seconds=1)) == ClaimRequest(holder="r", ttl=timedelta(seconds=1))


@given(tls.checkpoints(thread_id="t1"))
def test_strategy_checkpoints_are_valid(cp: Checkpoint) -> None:
    assert cp.thread_id == "t1"
    assert attrs.evolve(cp) == cp  # re-validates every field


@settings(max_examples=25)
@given(st.data())
def test_strategy_commits_apply_to_a_store(data: st.DataObject) -> None:
    clock = ManualClock(NOW)
    with InMemoryCheckpointer(clock) as store:
        claim = store.claim("t1", ClaimRequest(holder="r", ttl=timedelta(minutes=1)))
        parent = None
        total = 0
        for step in range(data.draw(st.integers(1, 3))):
            commit = data.draw(tls.commits(thread_id="t1", token=claim.token, parent=parent, checkpoint_id=f"c{step}"))
            records = store.commit("t1", commit)
            assert [r.seq for r in records] == list(range(total + 1, total + 1 + len(commit.events)))
            total += len(records)
            parent = commit.checkpoint.id
            stored = store.latest("t1")
            assert stored.checkpoint == attrs.evolve(commit.checkpoint, fencing_token=claim.token)
            assert stored.pending_writes == commit.pending_writes


# -- errors ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (
            ThreadBusy("t-1", "c9", BusyHolder.Run("run-1")),
            dict(thread_id="t-1", latest_checkpoint="c9", holder=BusyHolder.Run("run-1")),
        ),
        (StaleClaim("t-1", 4, 7), dict(thread_id="t-1", token=4, current=7)),
        (StaleClaim("t-1", 4, None), dict(thread_id="t-1", token=4, current=None)),
        (CheckpointConflict("t-1", "c1", "c2"), dict(thread_id="t-1", expected="c1", actual="c2")),
        (InvalidCommit("t-1", "duplicate"), dict(thread_id="t-1", reason="duplicate")),
        (ReplayUnavailable("t-1", 5), dict(thread_id="t-1", earliest_seq=5)),
        (ThreadDeleted("t-1", 9), dict(thread_id="t-1", first_seq=9)),
        (CheckpointNotFound("t-1", "c3"), dict(thread_id="t-1", checkpoint_id="c3")),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
def test_errors_carry_their_fields_and_name_the_thread(error: ThreadloomError, fields: dict) -> None:
    assert isinstance(error, ThreadloomError)
    for name, value in fields.items():
        assert getattr(error, name) == value
    assert "t-1" in str(error)
    with pytest.raises(type(error)):
        raise error


def test_other_errors_carry_their_fields() -> None:
    error = ValidationError("thread_id", ("must not be empty",))
    assert isinstance(error, ValueError) and isinstance(error, ThreadloomError)
    assert (error.field, error.problems) == ("thread_id", ("must not be empty",))
    assert "thread_id" in str(error) and "must not be empty" in str(error)
    failed = ProcessingError("commit", "disk full on thread 't'")
    assert (failed.operation, failed.message) == ("commit", "disk full on thread 't'")
    unknown = OutcomeUnknown("commit", "connection lost")
    assert isinstance(unknown, ProcessingError) and unknown.operation == "commit"
    assert "may have applied" in str(unknown)
    cancelled = CancelledError("await_events_after")
    assert cancelled.operation == "await_events_after" and "cancelled" in str(cancelled)


def test_busy_holders() -> None:
    assert BusyHolder.Run("r1") == BusyHolder.Run("r1")
    assert BusyHolder.Run("r1") != BusyHolder.Run("r2")
    assert BusyHolder.UNNAMED != BusyHolder.LAPSED
    assert BusyHolder.UNNAMED == BusyHolder.UNNAMED
    assert isinstance(BusyHolder.Run("r1"), BusyHolder) and isinstance(BusyHolder.UNNAMED, BusyHolder)
    assert "r1" in str(BusyHolder.Run("r1"))
    assert repr(BusyHolder.UNNAMED) == "BusyHolder.UNNAMED"


def test_settled_statuses() -> None:
    assert {status for status in CheckpointStatus if status.settled} == {
        CheckpointStatus.COMPLETED,
        CheckpointStatus.FAILED,
    }


# -- the pure rules ----------------------------------------------------------------------------------------------------


def test_a_claim_is_live_strictly_before_it_expires() -> None:
    assert rules.claim_is_live(NOW, NOW - timedelta(microseconds=1))
    assert not rules.claim_is_live(NOW, NOW)
    assert not rules.claim_is_live(NOW, NOW + timedelta(seconds=1))


@pytest.mark.parametrize(
    ("recorded", "requested", "named"),
    [("a", "a", True), ("a", "b", False), ("a", None, False), (None, "a", False), (None, None, True)],
)
def test_holders_are_named_only_within_a_tenant(recorded, requested, named: bool) -> None:
    expected = BusyHolder.Run("run") if named else BusyHolder.UNNAMED
    assert rules.busy_holder("run", recorded, requested) == expected
    assert rules.taken_over_from("run", recorded, requested) == ("run" if named else None)
    assert rules.taken_over_from(None, recorded, requested) is None


def test_thread_status() -> None:
    status = rules.thread_status
    assert status(CheckpointStatus.RUNNING, live_claim=False, metadata={}) is ThreadStatus.IDLE
    assert status(CheckpointStatus.COMPLETED, live_claim=True, metadata={}) is ThreadStatus.RUNNING
    assert status(CheckpointStatus.SUSPENDED, live_claim=False, metadata={}) is ThreadStatus.SUSPENDED
    assert status(CheckpointStatus.FAILED, live_claim=False, metadata={"x": "y"}) is ThreadStatus.FAILED
    deleting = {rules.DELETING_KEY: "true"}
    assert status(CheckpointStatus.RUNNING, live_claim=True, metadata=deleting) is ThreadStatus.DELETED
    assert (
        status(CheckpointStatus.RUNNING, live_claim=False, metadata={rules.DELETING_KEY: "false"}) is ThreadStatus.IDLE
    )


def test_read_start() -> None:
    start = rules.read_start
    assert start("t", 0, first_seq=1, floor=1) == 0
    assert start("t", 3, first_seq=1, floor=1) == 3
    assert start("t", 0, first_seq=5, floor=5) == 4  # 0 and first - 1 read from the first event
    assert start("t", 4, first_seq=5, floor=5) == 4
    for inside in (1, 2, 3):
        with pytest.raises(ThreadDeleted) as info:
            start("t", inside, first_seq=5, floor=5)
        assert info.value.first_seq == 5
    with pytest.raises(ReplayUnavailable) as behind:
        start("t", 2, first_seq=1, floor=4)
    assert behind.value.earliest_seq == 4
    assert start("t", 3, first_seq=1, floor=4) == 3


def test_numbering_rules() -> None:
    assert rules.tombstone_next_seq(first_seq=1, next_seq=4) == 5  # the log ended at 3: one number skipped
    assert rules.tombstone_next_seq(first_seq=5, next_seq=5) is None  # nothing numbered since
    assert rules.compacted_floor(floor=1, next_seq=6, before_seq=3) == 3
    assert rules.compacted_floor(floor=3, next_seq=6, before_seq=2) == 3  # never back
    assert rules.compacted_floor(floor=3, next_seq=6, before_seq=100) == 6  # never past the next number
    policy = RetentionPolicy(max_events=2)
    assert rules.pruned_floor(floor=1, next_seq=10, policy=policy, oldest_kept_mark=None, newest_expired_seq=None) == 8
    assert rules.pruned_floor(floor=9, next_seq=10, policy=policy, oldest_kept_mark=3, newest_expired_seq=None) == 9
    assert (
        rules.pruned_floor(floor=1, next_seq=10, policy=RetentionPolicy(), oldest_kept_mark=4, newest_expired_seq=6)
        == 7
    )


def test_checkpoints_to_prune() -> None:
    rows = [
        rules.CheckpointRow(f"c{i}", run, NOW + timedelta(seconds=i), i)
        for i, run in enumerate(["a", "b", "a", "c"], start=1)
    ]
    assert rules.checkpoints_to_prune(rows, RetentionPolicy(), NOW) == []
    assert rules.checkpoints_to_prune(rows, RetentionPolicy(max_checkpoints=2), NOW) == ["c1", "c2"]
    assert rules.checkpoints_to_prune(rows, RetentionPolicy(max_checkpoints=1), NOW, {"b"}) == ["c1", "c3"]
    assert rules.checkpoints_to_prune(rows, RetentionPolicy(max_checkpoints=9), NOW) == []
    # Age: committed at NOW + 2 s and max_age 3 s: expired from NOW + 5 s on (that long ago or longer).
    age = RetentionPolicy(max_age=timedelta(seconds=3))
    assert rules.checkpoints_to_prune(rows, age, NOW + timedelta(seconds=5)) == ["c1", "c2"]
    assert rules.checkpoints_to_prune(rows, age, NOW + timedelta(seconds=5) - timedelta(microseconds=1)) == ["c1"]
    assert rules.checkpoints_to_prune(rows, age, NOW + timedelta(days=1)) == ["c1", "c2", "c3"]  # never the latest
    assert rules.checkpoints_to_prune([], age, NOW) == []


def test_every_exported_error_says_whether_it_is_retryable() -> None:
    """README: every ``ThreadloomError`` has ``error.retryable``; only the storage's passing kinds are True."""
    import threadloom

    exported = {
        name: getattr(threadloom, name)
        for name in threadloom.__all__
        if isinstance(getattr(threadloom, name), type) and issubclass(getattr(threadloom, name), BaseException)
    }
    assert "ThreadBusy" in exported and "StaleClaim" in exported and "ThreadloomError" in exported
    assert all(issubclass(kind, threadloom.ThreadloomError) for kind in exported.values()), exported
    retryable = {name for name, kind in exported.items() if kind.retryable is True}
    assert retryable == {"StoreUnavailable", "OutcomeUnknown"}
    assert all(kind.retryable is False for name, kind in exported.items() if name not in retryable)
    busy = threadloom.ThreadBusy("t1", None, threadloom.BusyHolder.UNNAMED)
    assert busy.retryable is False and threadloom.StaleClaim("t1", 3, 4).retryable is False


def _containers(value) -> list:
    """Every dict and list inside ``value`` (itself included)."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if not isinstance(item, tuple):
                found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


@given(tls.json_values())
def test_copy_json_is_an_equal_copy_sharing_no_container(value) -> None:
    copied = v.copy_json(value)
    assert copied == value
    originals = {id(item) for item in _containers(value)}
    assert not any(id(item) in originals for item in _containers(copied))


def test_copy_json_copies_tuples_and_subclasses_too() -> None:
    inner = {"a": [1]}
    value = {"t": (inner, 2), "l": [inner]}
    copied = v.copy_json(value)
    assert copied == value and copied["t"][0] is not inner and copied["l"][0] is not inner
    copied["l"][0]["a"].append(2)
    assert inner == {"a": [1]}
