"""The LangGraph saver never runs what a stored value names: LangGraph's msgpack extension types name a module
and a callable that its default serializer imports and calls on read. A value stored by a hostile or careless
writer (any host with write access to the store) must come back as data, not run ``os.mkdir``."""

from __future__ import annotations

import os

import ormsgpack
import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from threadloom.domain.errors import ValidationError
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer

EXT_CONSTRUCTOR_SINGLE_ARG = 0  # LangGraph's msgpack extension: (module, name, arg) -> module.name(arg)


def _put(saver: ThreadloomSaver, thread_id: str, value: object) -> dict:
    checkpoint = generate_checkpoint()
    checkpoint["channel_values"] = {"x": value}
    checkpoint["channel_versions"] = {"x": saver.get_next_version(None, None)}
    return saver.put(generate_config(thread_id), checkpoint, generate_metadata(), checkpoint["channel_versions"])


def test_a_stored_value_naming_a_callable_is_not_called_on_read(tmp_path):
    target = tmp_path / "ran"
    planted = ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, ormsgpack.packb(("os", "mkdir", str(target))))
    with ThreadloomSaver(InMemoryCheckpointer()) as saver:
        config = _put(saver, "t", planted)
        got = saver.get_tuple(config)
        listed = list(saver.list(generate_config("t")))
    assert not os.path.exists(target)
    assert got is not None and got.checkpoint["channel_values"]["x"] == str(target)  # its argument, as data
    assert len(listed) == 1


def test_the_safe_types_still_round_trip():
    import datetime
    import uuid

    value = {"when": datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC), "id": uuid.UUID(int=7), "tags": {"a"}}
    with ThreadloomSaver(InMemoryCheckpointer()) as saver:
        got = saver.get_tuple(_put(saver, "t", value))
    assert got is not None and got.checkpoint["channel_values"]["x"] == value


def test_a_serializer_that_would_call_any_stored_callable_is_refused():
    store = InMemoryCheckpointer()
    with pytest.raises(ValidationError) as caught:
        ThreadloomSaver(store, serde=JsonPlusSerializer(allowed_msgpack_modules=True))
    assert caught.value.field == "serde"
    with pytest.raises(ValidationError) as caught:
        ThreadloomSaver(store, serde=JsonPlusSerializer(pickle_fallback=True, allowed_msgpack_modules=None))
    assert caught.value.field == "serde"
    # an explicit allowlist of the host's own types is the way to store them
    ThreadloomSaver(store, serde=JsonPlusSerializer(allowed_msgpack_modules=[("collections", "OrderedDict")])).close()
