"""The JSON text codec (DESIGN §3 rule 10): round trips, time encoding, and damaged rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadloom.domain.errors import ProcessingError
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EffectRecord,
    EventDraft,
    EventRecord,
    PendingWrite,
    trusted,
)
from threadloom.persistence import codec
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing import strategies as tls

NOW = datetime(2026, 1, 1, tzinfo=UTC)


# -- round trips -------------------------------------------------------------------------------------------------------


@given(tls.checkpoints())
def test_checkpoints_round_trip(cp: Checkpoint) -> None:
    text = codec.encode_checkpoint(cp)
    assert isinstance(json.loads(text), dict)
    back = codec.decode_checkpoint(text, cp.thread_id)
    assert back == cp
    assert back.created_at.utcoffset() == timedelta(0)


@given(tls.pending_writes())
def test_pending_writes_round_trip(pw: PendingWrite) -> None:
    assert codec.decode_pending_write(codec.encode_pending_write(pw), "t") == pw


@given(tls.event_drafts(), tls.ids(max_size=40), st.integers(1, 2**62), st.integers(1, 2**62))
def test_event_records_round_trip(draft: EventDraft, thread_id: str, seq: int, token: int) -> None:
    record = EventRecord.of(draft, thread_id=thread_id, seq=seq, token=token)
    assert codec.decode_event(codec.encode_event(record), thread_id) == record


@given(tls.effect_records())
def test_effect_records_round_trip(effect: EffectRecord) -> None:
    assert codec.decode_effect(codec.encode_effect(effect), "t") == effect


@given(tls.metadata())
def test_metadata_round_trips(metadata: dict[str, str]) -> None:
    assert codec.decode_metadata(codec.encode_metadata(metadata), "t") == metadata
    assert codec.decode_metadata(None, "t") == {}


def test_every_checkpoint_field_survives() -> None:
    cp = Checkpoint(
        id="c2",
        parent="c1",
        thread_id="t",
        run_id="r",
        status=CheckpointStatus.SUSPENDED,
        created_at=datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=timezone(timedelta(hours=-5))),
        state={"messages": [{"role": "user", "content": "hé ☃ \x00"}], "n": 2**63 - 1, "f": -0.5, "b": False},
        graph_id="chat",
        tenant_id="acme",
        fencing_token=42,
        origin=CheckpointOrigin(parent_thread="p", parent_checkpoint="pc", task_id="task"),
        metadata={"k": "v", "": ""},
    )
    back = codec.decode_checkpoint(codec.encode_checkpoint(cp), "t")
    assert back == cp
    assert back.created_at.tzinfo == UTC


def test_tuples_are_stored_as_json_arrays() -> None:
    pw = PendingWrite(checkpoint_id="c", task_id="t", node_id="n", payload={"pair": (1, "a")})
    assert codec.decode_pending_write(codec.encode_pending_write(pw), "t").payload == {"pair": [1, "a"]}


def test_times_are_integer_microseconds_since_the_epoch() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert codec.to_micros(epoch) == 0
    assert codec.to_micros(epoch + timedelta(microseconds=1)) == 1
    assert codec.to_micros(epoch - timedelta(microseconds=1)) == -1
    assert codec.to_micros(NOW) == 1_767_225_600_000_000
    assert codec.to_micros(datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))) == codec.to_micros(NOW)
    assert codec.from_micros(1_767_225_600_000_001) == NOW + timedelta(microseconds=1)
    raw = json.loads(
        codec.encode_event(
            EventRecord.of(EventDraft(run_id="r", type="e", timestamp=NOW), thread_id="t", seq=1, token=1)
        )
    )
    assert raw["timestamp"] == 1_767_225_600_000_000 and isinstance(raw["timestamp"], int)


@given(tls.aware_datetimes(min_year=1, max_year=9998))
def test_micros_round_trip_any_aware_datetime(when: datetime) -> None:
    back = codec.from_micros(codec.to_micros(when))
    assert back == when and back.tzinfo == UTC


def test_encoding_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError):
        codec.dumps(float("nan"))
    assert codec.loads(codec.dumps({"a": ["☃", None]})) == {"a": ["☃", None]}


@given(tls.json_values(max_leaves=30))
def test_loads_reads_what_json_loads_reads(value) -> None:
    text = codec.dumps(value)
    back = codec.loads(text)
    assert back == json.loads(text)
    assert json.dumps(back) == json.dumps(json.loads(text))  # the same types too (int stays int, -0.0 stays -0.0)


@pytest.mark.parametrize(
    "text",
    [
        "18446744073709551616",  # past 64 bits: an exact int, never a float
        "-9223372036854775809",
        "1" * 4300,
        '{"n": 123456789012345678901234567890, "f": 1.5e300, "z": -0.0, "e": 1E2, "k": 5e-324}',
        '"\\ud800"',  # a lone surrogate escape
        '"\\u0000 h\\u00e9 \\ud83d\\ude00"',
        '{"a": 1, "a": 2}',
        " \n[1, 2] \t",
        "NaN",
        "[-Infinity]",
        "1e400",  # overflows to infinity
        "[" * 100 + "]" * 100,
    ],
)
def test_loads_reads_any_text_as_json_loads_does(text: str) -> None:
    expected = json.loads(text)
    back = codec.loads(text)
    assert repr(back) == repr(expected)


@pytest.mark.parametrize("text", ["", "1 2", "{", "[1,]", "0123", "'a'", '"\t"', "1" * 4301, "[" * 100_000])
def test_loads_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises((ValueError, RecursionError)):
        json.loads(text)
    with pytest.raises((ValueError, RecursionError)):
        codec.loads(text)


@given(tls.checkpoints())
def test_a_decoded_checkpoint_is_sealed_with_its_state_text(cp: Checkpoint) -> None:
    back = codec.decode_checkpoint(codec.encode_checkpoint(cp), cp.thread_id)
    assert back._json == cp.sealed_json()  # the stored text of the state, kept as it is
    assert back.sealed_json() == cp.sealed_json()  # written back as it is, not decoded nor encoded again
    fields = {name: getattr(back, name) for name in attrs.fields_dict(Checkpoint) if not name.startswith("_")}
    assert back == trusted(Checkpoint, **fields) == cp


@given(tls.checkpoints())
def test_a_strictly_decoded_checkpoint_is_built_as_trusted_builds_it(cp: Checkpoint) -> None:
    back = codec._decode_checkpoint_strictly(codec.encode_checkpoint(cp), cp.thread_id)
    fields = {name: getattr(back, name) for name in attrs.fields_dict(Checkpoint) if not name.startswith("_")}
    assert back == trusted(Checkpoint, **fields) == cp
    assert (back._json, back._seal) == (None, ())
    assert back.sealed_json() == cp.sealed_json()  # encoded again, validated, when written back


@given(tls.checkpoints(), st.booleans())
def test_the_fast_and_the_strict_checkpoint_readers_agree(cp: Checkpoint, reorder: bool) -> None:
    text = codec.encode_checkpoint(cp)
    if reorder:  # another key order, white space: still the same row
        text = json.dumps(dict(reversed(json.loads(text).items())), indent=1, ensure_ascii=False)
    fast = codec.decode_checkpoint(text, cp.thread_id)
    strict = codec._decode_checkpoint_strictly(text, cp.thread_id)
    assert fast == strict == cp
    assert json.dumps(fast.state) == json.dumps(strict.state)  # the same types (ints stay ints)


@given(tls.pending_writes(), st.booleans())
def test_the_fast_and_the_strict_pending_write_readers_agree(pw: PendingWrite, reorder: bool) -> None:
    text = codec.encode_pending_write(pw)
    if reorder:  # another key order, white space: still the same row
        text = json.dumps(dict(reversed(json.loads(text).items())), indent=1, ensure_ascii=False)
    fast = codec.decode_pending_write(text, "t")
    strict = codec._decode_pending_write_strictly(text, "t")
    raw = json.loads(text)
    assert fast == strict == pw == PendingWrite(**raw)
    assert json.dumps(fast.payload) == json.dumps(strict.payload) == json.dumps(raw["payload"])  # ints stay ints
    assert (fast._json, fast._seal) == (None, ())  # built as trusted builds it: encoded again when written back
    assert fast.sealed_json() == pw.sealed_json()


# -- damaged rows ------------------------------------------------------------------------------------------------------

_GOOD_CHECKPOINT = json.loads(
    codec.encode_checkpoint(
        Checkpoint(id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW)
    )
)
_GOOD_EVENT = json.loads(
    codec.encode_event(EventRecord.of(EventDraft(run_id="r", type="e", timestamp=NOW), thread_id="t", seq=1, token=1))
)
_GOOD_EFFECT = json.loads(codec.encode_effect(EffectRecord(key="k", run_id="r", recorded_at=NOW)))
_GOOD_WRITE = json.loads(codec.encode_pending_write(PendingWrite(checkpoint_id="c", task_id="t", node_id="n")))


def _with(base: dict, **changes) -> str:
    raw = dict(base)
    for key, value in changes.items():
        if value is _DROP:
            raw.pop(key)
        else:
            raw[key] = value
    return json.dumps(raw)


_DROP = object()

DAMAGED = [
    pytest.param(codec.decode_checkpoint, "{not json", id="checkpoint-not-json"),
    pytest.param(codec.decode_checkpoint, "[]", id="checkpoint-array"),
    pytest.param(codec.decode_checkpoint, "null", id="checkpoint-null"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, id=_DROP), id="checkpoint-missing-id"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, id=_DROP, ids="c1"), id="checkpoint-renamed-key"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, surprise=1), id="checkpoint-unknown-field"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, run_id="r\x00"), id="checkpoint-nul-id"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, metadata={"k": "\x00"}), id="checkpoint-nul-meta"),
    pytest.param(codec.decode_checkpoint, '{"id": "c1"', id="checkpoint-torn"),
    pytest.param(codec.decode_checkpoint, '"\\ud800"', id="checkpoint-lone-surrogate"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, status="paused"), id="checkpoint-unknown-status"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, created_at="2026-01-01"), id="checkpoint-text-time"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, id="x" * 300), id="checkpoint-overlong-id"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, created_at=10**18), id="checkpoint-time-past-9999"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, created_at=2**70), id="checkpoint-time-past-int64"),
    pytest.param(
        codec.decode_checkpoint,
        _with(_GOOD_CHECKPOINT, origin={"parent_thread": "p\x00", "parent_checkpoint": None, "task_id": None}),
        id="checkpoint-nul-origin",
    ),
    pytest.param(
        codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, metadata={"k\x00": "v"}), id="checkpoint-nul-meta-key"
    ),
    pytest.param(codec.decode_event, _with(_GOOD_EVENT, timestamp=10**18), id="event-time-past-9999"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, origin={"parent": "p"}), id="checkpoint-bad-origin"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, metadata={"k": 1}), id="checkpoint-bad-metadata"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, fencing_token=0), id="checkpoint-bad-token"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, fencing_token=2**63), id="checkpoint-huge-token"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, graph_id=""), id="checkpoint-empty-graph"),
    pytest.param(codec.decode_checkpoint, _with(_GOOD_CHECKPOINT, origin={"parent_thread": ""}), id="checkpoint-bad-origin-id"),
    pytest.param(codec.decode_event, "", id="event-empty"),
    pytest.param(codec.decode_event, _with(_GOOD_EVENT, timestamp=None), id="event-null-time"),
    pytest.param(codec.decode_event, _with(_GOOD_EVENT, surprise=1), id="event-unknown-field"),
    pytest.param(codec.decode_event, _with(_GOOD_EVENT, type=""), id="event-empty-type"),
    pytest.param(codec.decode_effect, _with(_GOOD_EFFECT, recorded_at=_DROP), id="effect-missing-time"),
    pytest.param(codec.decode_effect, '"a string"', id="effect-string"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, task_id=None), id="write-null-task"),
    pytest.param(codec.decode_pending_write, "[1, 2]", id="write-array"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, node_id="n\x00"), id="write-nul-id"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, task_id="t\ud800"), id="write-surrogate-id"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, checkpoint_id="c" * 256), id="write-overlong-checkpoint-id"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, node_id=""), id="write-empty-id"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, payload=_DROP), id="write-missing-payload"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, surprise=1), id="write-unknown-field"),
    pytest.param(codec.decode_pending_write, '{"checkpoint_id": "c"', id="write-torn"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, task_id="x" * 300), id="write-overlong-id"),
    pytest.param(codec.decode_pending_write, _with(_GOOD_WRITE, payload=_DROP), id="write-missing-payload"),
    pytest.param(codec.decode_metadata, "[1]", id="metadata-array"),
    pytest.param(codec.decode_metadata, '{"k": 2}', id="metadata-number"),
    pytest.param(codec.decode_metadata, "{", id="metadata-not-json"),
]


@pytest.mark.parametrize(("decode", "text"), DAMAGED)
def test_a_damaged_row_is_a_processing_error_naming_the_thread(decode, text: str) -> None:
    with pytest.raises(ProcessingError) as info:
        decode(text, "thread-42")
    assert info.value.operation == "decode"
    assert "'thread-42'" in info.value.message
    assert isinstance(info.value.__cause__, Exception)


def _compact(**changes) -> str:
    """A checkpoint row in the layout the store writes (compact, the state last): the fast reader's layout."""
    raw = {**_GOOD_CHECKPOINT, **changes}
    raw["state"] = raw.pop("state")
    return json.dumps(raw, separators=(",", ":"))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_compact(run_id="r\x00"), id="id"),
        pytest.param(_compact(parent="p\x00"), id="parent"),
        pytest.param(_compact(tenant_id="\x00"), id="tenant"),
        pytest.param(_compact(metadata={"k": "v\x00"}), id="meta-value"),
        pytest.param(_compact(metadata={"\x00": "v"}), id="meta-key"),
        pytest.param(
            _compact(origin={"parent_thread": "p", "parent_checkpoint": "c\x00", "task_id": None}), id="origin"
        ),
    ],
)
def test_a_nul_in_any_field_of_a_row_in_the_stores_own_layout_is_refused(text: str) -> None:
    """The fast reader checks the fields' text for the NUL escape once instead of each field: every field counts."""
    assert ',"state":' in text and "\\u0000" in text  # the layout the fast reader takes, the NUL escaped
    with pytest.raises(ProcessingError, match="NUL"):
        codec.decode_checkpoint(text, "thread-42")


def test_a_backslash_u_in_a_field_is_text_not_a_nul() -> None:
    """An escaped backslash before ``u0000`` is the text ``\\u0000``, not a NUL: read as it was written."""
    cp = codec.decode_checkpoint(_compact(run_id="r\\u0000", metadata={"k": "\\u0000"}), "t")
    assert (cp.run_id, cp.metadata) == ("r\\u0000", {"k": "\\u0000"})


def _damaged_store() -> InMemoryCheckpointer:
    store = InMemoryCheckpointer()
    claim = store.claim("thread-42", ClaimRequest(holder="r", ttl=timedelta(minutes=1)))
    cp = Checkpoint(
        id="c1", parent=None, thread_id="thread-42", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW
    )
    store.commit(
        "thread-42",
        Commit(
            token=claim.token,
            checkpoint=cp,
            events=[EventDraft(run_id="r", type="e", timestamp=NOW)],
            effects=[EffectRecord(key="k", run_id="r", recorded_at=NOW)],
            pending_writes=[PendingWrite(checkpoint_id="c1", task_id="t", node_id="n")],
        ),
    )
    # Damage what the store keeps, as a torn write or an incompatible version would.
    row = store._rows["thread-42"]
    row.history[-1].text = '{"id": "c1"'
    row.events[-1].text = "{}"
    row.effects["k"] = "[]"
    row.pending[0] = "null"
    return store


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda s: s.latest("thread-42"), id="latest"),
        pytest.param(lambda s: s.checkpoint("thread-42", "c1"), id="checkpoint"),
        pytest.param(lambda s: s.history("thread-42", limit=5), id="history"),
        pytest.param(lambda s: s.lookup_run("thread-42", ["r"]), id="lookup_run"),
        pytest.param(lambda s: s.events_after("thread-42", 0, 5), id="events_after"),
        pytest.param(lambda s: s.effect("thread-42", "k"), id="effect"),
    ],
)
def test_a_store_reports_a_damaged_row_naming_the_thread(read) -> None:
    store = _damaged_store()
    with pytest.raises(ProcessingError) as info:
        read(store)
    assert "'thread-42'" in str(info.value)
    assert store.claim("other", ClaimRequest(holder="r", ttl=timedelta(minutes=1))).token > 0  # the store still works
