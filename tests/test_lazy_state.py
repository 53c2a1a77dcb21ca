"""Checkpoints read from a store decode their state on first access (``LazyJson``): the value a user sees is the
one an eager read builds, the state is decoded once, and writing the checkpoint again takes its stored text."""

from __future__ import annotations

import copy
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadloom.domain.errors import StoreCorrupt
from threadloom.domain.values import (
    Checkpoint,
    CheckpointOrigin,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    LazyJson,
    intact,
    lazy_checkpoint,
)
from threadloom.persistence import codec
from threadloom.testing import strategies as tls

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _undecoded(cp: Checkpoint) -> bool:
    """Whether ``cp``'s state slot still holds its LazyJson (read around the descriptor)."""
    return type(Checkpoint._GETTER(cp)[6]) is LazyJson


def _counting(decode_delay_s: float = 0.0) -> tuple[LazyJson, list[str]]:
    calls: list[str] = []

    def decode(text: str, _value: object) -> tuple[object, bool]:
        calls.append(text)
        if decode_delay_s:
            time.sleep(decode_delay_s)  # widen the window in which first readers overlap
        return json.loads(text), True

    return LazyJson(decode, codec._is_json), calls


def _lazy(state_text: str, lazy: LazyJson, **changes: object) -> Checkpoint:
    fields = {
        "id": "c1", "parent": None, "thread_id": "t", "run_id": "r", "status": CheckpointStatus.RUNNING,
        "created_at": NOW, "graph_id": "default", "tenant_id": None, "fencing_token": 3, "origin": None,
        "metadata": {}, **changes,
    }  # fmt: skip
    return lazy_checkpoint(
        state_text, fields["id"], fields["parent"], fields["thread_id"], fields["run_id"], fields["status"],
        fields["created_at"], lazy, fields["graph_id"], fields["tenant_id"], fields["fencing_token"],
        fields["origin"], fields["metadata"],
    )  # fmt: skip


# -- the value a user sees -----------------------------------------------------------------------------------------


@given(tls.checkpoints())
def test_a_lazily_read_checkpoint_equals_the_eagerly_read_one(cp: Checkpoint) -> None:
    text = codec.encode_checkpoint(cp)
    lazy = codec.decode_checkpoint(text, cp.thread_id)
    eager = codec._decode_checkpoint_strictly(text, cp.thread_id)
    assert _undecoded(lazy)
    assert lazy == eager == cp and eager == lazy
    assert repr(lazy) == repr(eager)
    assert json.dumps(lazy.state) == json.dumps(eager.state)  # the same types (ints stay ints)


@given(tls.checkpoints())
def test_every_attrs_view_of_a_lazy_checkpoint_is_the_eager_ones(cp: Checkpoint) -> None:
    text = codec.encode_checkpoint(cp)

    def public(value: Checkpoint) -> dict:
        return {k: x for k, x in attrs.asdict(value).items() if not k.startswith("_")}

    eager = codec._decode_checkpoint_strictly(text, cp.thread_id)
    assert public(codec.decode_checkpoint(text, cp.thread_id)) == public(eager)
    assert attrs.evolve(codec.decode_checkpoint(text, cp.thread_id), run_id="other") == attrs.evolve(
        eager, run_id="other"
    )
    assert copy.deepcopy(codec.decode_checkpoint(text, cp.thread_id)) == eager
    assert copy.copy(codec.decode_checkpoint(text, cp.thread_id)) == eager


def test_equality_and_hash_decode_the_state() -> None:
    lazy, _calls = _counting()
    a, b = _lazy('{"a":[1,2]}', lazy), _lazy('{"a":[1,2]}', lazy)
    c = _lazy('{"a":[1,3]}', lazy)
    assert a == b and a != c
    with pytest.raises(TypeError):  # a dict state is unhashable, read lazily or not
        hash(a)
    eager = Checkpoint(
        id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
        state={"a": [1, 2]}, fencing_token=3,
    )  # fmt: skip
    assert a == eager and eager == b


def test_a_lazy_checkpoint_stays_immutable() -> None:
    cp = _lazy('{"a":1}', _counting()[0])
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cp.state = {"b": 2}  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        del cp.state  # type: ignore[misc]
    assert cp.state == {"a": 1}


def test_the_class_attribute_is_the_field_not_a_value() -> None:
    assert not isinstance(Checkpoint.state, (dict, list))
    assert Checkpoint.state.__get__(None, Checkpoint) is Checkpoint.state
    assert "state" in attrs.fields_dict(Checkpoint)


# -- decoded once --------------------------------------------------------------------------------------------------


def test_the_state_is_decoded_on_first_access_once() -> None:
    lazy, calls = _counting()
    cp = _lazy('{"messages":["hi"],"step":2}', lazy)
    assert calls == [] and _undecoded(cp)
    first = cp.state
    assert first == {"messages": ["hi"], "step": 2}
    assert cp.state is first and cp.state is first
    assert cp == cp and repr(cp)
    assert calls == ['{"messages":["hi"],"step":2}']
    assert not _undecoded(cp)


def test_concurrent_first_readers_get_one_value() -> None:
    for _round in range(5):
        lazy, calls = _counting(decode_delay_s=0.01)
        cp = _lazy('{"a":[1,{"b":null}]}', lazy)
        readers = 8
        barrier = threading.Barrier(readers)
        seen: list[object] = [None] * readers

        def read(index: int, cp: Checkpoint = cp, barrier: threading.Barrier = barrier, seen: list = seen) -> None:
            barrier.wait()
            seen[index] = cp.state

        threads = [threading.Thread(target=read, args=(index,)) for index in range(readers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert all(value == {"a": [1, {"b": None}]} for value in seen)
        assert all(value is seen[0] for value in seen)  # one value kept, whoever decoded first
        assert cp.state is seen[0]
        assert 1 <= len(calls) <= readers
        assert cp.sealed_json() == '{"a":[1,{"b":null}]}'  # still sealed with its text


def test_a_state_that_does_not_decode_is_a_store_error_naming_the_thread() -> None:
    cp = _lazy("[" * 100_000 + "]" * 100_000, codec._LAZY_STATE, thread_id="thread-42")
    with pytest.raises(StoreCorrupt) as info:
        _ = cp.state
    assert "'thread-42'" in info.value.message
    assert _undecoded(cp)  # nothing kept: the next read fails the same way


# -- written again -------------------------------------------------------------------------------------------------


def test_writing_a_lazy_checkpoint_again_takes_its_text_without_decoding() -> None:
    lazy, calls = _counting()
    cp = _lazy('{"z":1,  "a":[true]}', lazy)  # the stored text as it is, white space and key order included
    assert cp.sealed_json() == '{"z":1,  "a":[true]}'
    assert codec.encode_checkpoint(cp).endswith(',"state":{"z":1,  "a":[true]}}')
    assert calls == [] and _undecoded(cp)


def test_a_decoded_lazy_checkpoint_keeps_its_text_sealed() -> None:
    lazy, calls = _counting()
    cp = _lazy('{"a":1}', lazy)
    assert cp.state == {"a": 1}
    assert intact(cp._seal, Checkpoint._GETTER(cp))
    assert cp.sealed_json() == '{"a":1}' and len(calls) == 1


def test_a_replaced_state_is_validated_and_encoded_again() -> None:
    cp = _lazy('{"a":1}', _counting()[0])
    object.__setattr__(cp, "state", {"b": [2]})
    assert cp.state == {"b": [2]}
    assert cp.sealed_json() == '{"b":[2]}'
    object.__setattr__(cp, "state", {"bad": float("nan")})
    with pytest.raises(ValueError):
        cp.sealed_json()


def test_a_replaced_field_is_validated_and_the_state_encoded_again() -> None:
    lazy, calls = _counting()
    cp = _lazy('{"a":1}', lazy)
    object.__setattr__(cp, "run_id", "")
    with pytest.raises(ValueError):
        cp.sealed_json()
    object.__setattr__(cp, "run_id", "r2")
    assert cp.sealed_json() == '{"a":1}' and len(calls) == 1  # decoded to be validated again


def test_a_lazy_json_passed_to_the_constructor_is_refused() -> None:
    with pytest.raises(ValueError):
        Checkpoint(
            id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
            state=codec._LAZY_STATE,
        )  # fmt: skip


def test_a_lazily_read_checkpoint_committed_again_round_trips(each_store, request) -> None:
    """Read from one store, committed to a fresh one of the same kind (the same first token), read back."""
    state = {"messages": [{"role": "user", "content": "héllo \u2028"}], "n": 12345678901234567890, "f": 0.5}
    source = each_store
    claim = source.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5)))
    written = Checkpoint(
        id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
        state=state, metadata={"k": "v"},
    )  # fmt: skip
    source.commit("t", Commit(token=claim.token, checkpoint=written))
    read = source.history("t", limit=1)[0]
    assert _undecoded(read)
    target = _fresh_like(source, request)
    try:
        again = target.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5)))
        assert again.token == claim.token == read.fencing_token
        target.commit("t", Commit(token=again.token, checkpoint=read))
        assert _undecoded(read)  # written from its text
        back = target.latest("t")
        assert back is not None
        assert back.checkpoint == read == attrs.evolve(written, fencing_token=claim.token)
        assert back.checkpoint.state == state
    finally:
        target.close()


def _fresh_like(store, request):
    from threadloom.persistence.memory.store import InMemoryCheckpointer
    from threadloom.persistence.postgres.store import PostgresCheckpointer
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    if isinstance(store, InMemoryCheckpointer):
        return InMemoryCheckpointer()
    if isinstance(store, SqliteCheckpointer):
        return SqliteCheckpointer.open(request.getfixturevalue("tmp_path") / "again.db")
    assert isinstance(store, PostgresCheckpointer)
    from threadloom.testing.postgres_harness import PgHarness

    harness = PgHarness()
    request.addfinalizer(harness.cleanup)
    return harness.open_pg()


def test_every_store_reads_checkpoints_lazily(each_store) -> None:
    claim = each_store.claim("t", ClaimRequest(holder="r", ttl=timedelta(minutes=5)))
    parent = None
    for index in range(3):
        cp = Checkpoint(
            id=f"c{index}", parent=parent, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING,
            created_at=NOW, state={"i": index},
        )  # fmt: skip
        each_store.commit("t", Commit(token=claim.token, checkpoint=cp))
        parent = cp.id
    history = each_store.history("t", limit=10)
    latest = each_store.latest("t")
    one = each_store.checkpoint("t", "c1")
    assert latest is not None and one is not None
    for cp in (*history, latest.checkpoint, one):
        assert _undecoded(cp)
    assert [cp.state for cp in history] == [{"i": 2}, {"i": 1}, {"i": 0}]
    assert latest.checkpoint.state == {"i": 2} and one.state == {"i": 1}


# -- the fast reader's split of the stored text ---------------------------------------------------------------------

_TRICKY = st.text(st.sampled_from(list(',"state:{}[]\\ \u2028é')), min_size=1, max_size=24)
"""Text made of what the split of a stored checkpoint looks for (``,"state":``) and what escapes it."""


@st.composite
def _tricky_checkpoints(draw: st.DrawFn) -> Checkpoint:
    leaf = st.one_of(_TRICKY, st.integers(), st.none(), st.just("state"))
    keys = st.one_of(_TRICKY, st.just("state"))
    state = draw(st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=8))
    metadata = draw(st.dictionaries(keys, _TRICKY, max_size=3))
    origin = draw(st.none() | st.builds(CheckpointOrigin, parent_thread=_TRICKY, task_id=st.none() | _TRICKY))
    return Checkpoint(
        id=draw(_TRICKY), parent=draw(st.none() | _TRICKY), thread_id=draw(_TRICKY), run_id=draw(_TRICKY),
        status=CheckpointStatus.RUNNING, created_at=NOW, state=state, graph_id=draw(_TRICKY),
        tenant_id=draw(st.none() | _TRICKY), origin=origin, metadata=metadata,
    )  # fmt: skip


@given(_tricky_checkpoints(), st.sampled_from(["as stored", "reordered", "state first", "spaced"]))
def test_every_reader_reads_every_layout_alike(cp: Checkpoint, layout: str) -> None:
    text = codec.encode_checkpoint(cp)
    if layout != "as stored":
        fields = json.loads(text)
        if layout == "reordered":
            fields = dict(reversed(fields.items()))
        elif layout == "state first":
            fields = {"state": fields.pop("state"), **fields}
        text = json.dumps(fields, ensure_ascii=False, separators=(",", ":") if layout != "spaced" else None)
    fast = codec.decode_checkpoint(text, cp.thread_id)
    strict = codec._decode_checkpoint_strictly(text, cp.thread_id)
    assert _undecoded(fast)
    assert json.loads(fast._json) == cp.state  # the state's own text, whatever the layout
    if layout == "as stored":
        assert fast._json == cp.sealed_json()
    assert fast == strict == cp
    assert json.dumps(fast.state) == json.dumps(strict.state)


@pytest.mark.parametrize(
    ("state_text", "value"),
    [
        pytest.param("NaN", None, id="nan"),
        pytest.param("1e400", float("inf"), id="overflowing-float"),
        pytest.param('"\\ud800"', "\ud800", id="lone-surrogate"),
    ],
)
def test_a_damaged_state_reads_as_json_loads_reads_it_and_is_validated_when_written(state_text, value) -> None:
    cp = Checkpoint(id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW)
    text = codec.encode_checkpoint(cp)[: -len('"state":{}}')] + f'"state":{state_text}}}'
    read = codec.decode_checkpoint(text, "t")
    assert _undecoded(read)  # not looked at when read
    if value is None:
        assert read.state != read.state  # NaN, as json.loads reads it
    else:
        assert read.state == value
    with pytest.raises(ValueError):  # ValidationError: encoded again, refused
        read.sealed_json()
    untouched = codec.decode_checkpoint(text, "t")
    if state_text != "1e400":  # strict JSON refuses the text: decoded, validated again, refused
        with pytest.raises(ValueError):
            untouched.sealed_json()


@pytest.mark.parametrize(
    "state_text",
    ["{", '{"a":tru}', '{"a":1},"id":"x"', '"\\q"'],
)
def test_a_state_that_is_not_json_is_a_store_error_when_read_or_written(state_text: str) -> None:
    cp = Checkpoint(id="c1", parent=None, thread_id="t-9", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW)
    text = codec.encode_checkpoint(cp)[: -len('"state":{}}')] + f'"state":{state_text}}}'
    try:
        read = codec.decode_checkpoint(text, "t-9")
    except StoreCorrupt:
        return  # the row's other fields did not decode either: refused when read
    for attempt in (lambda: read.state, read.sealed_json):
        with pytest.raises(StoreCorrupt) as info:
            attempt()
        assert "'t-9'" in info.value.message
