"""Access schemas, stamps, options and walk records (domain/access.py): pure values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from threadloom.domain.access import (
    AccessAttribute,
    AccessSchema,
    AccessSchemas,
    AccessStamp,
    AccessStampOptions,
    WalkRecord,
    is_walk_thread,
    member_group,
    serves,
    walk_thread_id,
)
from threadloom.domain.errors import ProcessingError, ValidationError
from threadloom.domain.values import Checkpoint, CheckpointStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cp(state=None, metadata=None, tenant="acme") -> Checkpoint:
    return Checkpoint(
        id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=T0,
        state=state if state is not None else {}, tenant_id=tenant, metadata=metadata or {}, graph_id="chat",
    )


REGION = AccessAttribute(name="region", source="metadata", key="region")
PLAN = AccessAttribute(name="plan", source="state", key="/account/plan")


def test_hash_is_stable_across_attribute_order_and_names_the_declaration():
    one = AccessSchema("chat", (REGION, PLAN))
    two = AccessSchema("chat", [PLAN, REGION])
    assert one == two and one.hash == two.hash
    assert one.hash.startswith("a1") and len(one.hash) == 16
    int(one.hash[2:], 16)
    # a fixed value: the hash must not change between processes or versions of the code
    assert AccessSchema("chat").hash == AccessSchema("chat").hash
    assert AccessSchema("chat").hash != one.hash
    assert AccessSchema("other", (REGION, PLAN)).hash != one.hash
    assert AccessSchema("chat", (AccessAttribute(name="region", source="metadata", key="zone"), PLAN)).hash != one.hash


def test_the_hash_is_the_same_in_another_process():
    import subprocess
    import sys

    code = (
        "from threadloom.domain.access import AccessAttribute as A, AccessSchema as S;"
        "print(S('chat', (A(name='region', source='metadata', key='region'),"
        " A(name='plan', source='state', key='/account/plan'))).hash)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", **__import__("os").environ})
    assert out.stdout.strip() == AccessSchema("chat", (PLAN, REGION)).hash


def test_derive_from_metadata_and_json_pointer():
    schema = AccessSchema("chat", (REGION, PLAN, AccessAttribute(name="first", source="state", key="/items/0/n"),
                                   AccessAttribute(name="esc", source="state", key="/a~1b/c~0d")))
    stamp = schema.derive(cp({"account": {"plan": "gold"}, "items": [{"n": 7}], "a/b": {"c~d": [1]}},
                             {"region": "eu"}))
    assert stamp == AccessStamp(schema=schema.hash, tenant_id="acme",
                                attributes={"region": "eu", "plan": "gold", "first": 7, "esc": [1]})
    assert stamp.columns() == (schema.hash, "acme", '{"esc":[1],"first":7,"plan":"gold","region":"eu"}')
    assert schema.columns(cp({"account": {"plan": "gold"}}, {"region": "eu"}))[2] == (
        '{"esc":null,"first":null,"plan":"gold","region":"eu"}')


@pytest.mark.parametrize("state", [{}, {"account": None}, {"account": {"plan2": 1}}, {"account": [1, 2]},
                                   {"account": "x"}])
def test_a_missing_value_derives_as_null(state):
    stamp = AccessSchema("chat", (REGION, PLAN)).derive(cp(state, tenant=None))
    assert stamp.attributes == {"region": None, "plan": None}
    assert stamp.tenant_id is None


def test_pointer_into_lists():
    attr = AccessAttribute(name="x", source="state", key="/l/1")
    assert attr.value_of(cp({"l": [0, 5]})) == 5
    for bad in ({"l": [0]}, {"l": {"1": 3}}):
        assert attr.value_of(cp(bad)) == (3 if isinstance(bad["l"], dict) else None)
    assert AccessAttribute(name="x", source="state", key="/l/01").value_of(cp({"l": [0, 5]})) is None
    assert AccessAttribute(name="x", source="state", key="/l/-").value_of(cp({"l": [0, 5]})) is None
    assert AccessAttribute(name="x", source="state", key="").value_of(cp({"l": 1})) == {"l": 1}


def test_the_implicit_schema_is_the_tenant_only():
    schemas = AccessSchemas([AccessSchema("chat", (REGION,))])
    assert schemas.for_graph("chat").attributes == (REGION,)
    assert schemas.for_graph("other") == AccessSchema("other")
    assert schemas.for_graph("other").derive(cp()).attributes == {}
    assert schemas.declared("chat") and not schemas.declared("other")
    assert AccessSchemas() == AccessSchemas(())


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: AccessAttribute(name="Region", source="metadata", key="r"), "access_attribute.name"),
        (lambda: AccessAttribute(name="tenant_id", source="metadata", key="r"), "access_attribute.name"),
        (lambda: AccessAttribute(name="x" * 64, source="metadata", key="r"), "access_attribute.name"),
        (lambda: AccessAttribute(name=3, source="metadata", key="r"), "access_attribute.name"),
        (lambda: AccessAttribute(name="r", source="column", key="r"), "access_attribute.source"),
        (lambda: AccessAttribute(name="r", source="metadata", key=""), "access_attribute.key"),
        (lambda: AccessAttribute(name="r", source="metadata", key=5), "access_attribute.key"),
        (lambda: AccessAttribute(name="r", source="state", key="a/b"), "access_attribute.key"),
        (lambda: AccessAttribute(name="r", source="state", key="/a~2"), "access_attribute.key"),
        (lambda: AccessSchema("", ()), "access_schema.graph_id"),
        (lambda: AccessSchema("chat", (REGION, REGION)), "access_schema.attributes"),
        (lambda: AccessSchema("chat", ("region",)), "access_schema.attributes"),
        (lambda: AccessSchema("chat", "region"), "access_schema.attributes"),
        (lambda: AccessSchema("threadloom.access-walk"), "access_schema.graph_id"),
        (lambda: AccessSchemas([AccessSchema("chat"), AccessSchema("chat", (REGION,))]), "access_schemas.graph_id"),
        (lambda: AccessSchemas(["chat"]), "access_schemas"),
        (lambda: AccessStamp(schema="a1", tenant_id=None, attributes={"x": float("nan")}),
         "access_stamp.attributes.x"),
        (lambda: AccessStamp(schema="a1", tenant_id=None, attributes={"x": {1, 2}}), "access_stamp.attributes.x"),
        (lambda: AccessStamp(schema="a1", tenant_id=None, attributes={"X": 1}), "access_stamp.attributes"),
        (lambda: AccessStamp(schema="", tenant_id=None), "access_stamp.schema"),
        (lambda: AccessStampOptions(walk_share=0), "access_stamp_options.walk_share"),
        (lambda: AccessStampOptions(walk_share=1.5), "access_stamp_options.walk_share"),
        (lambda: AccessStampOptions(walk_share=True), "access_stamp_options.walk_share"),
        (lambda: AccessStampOptions(walk_rate=0), "access_stamp_options.walk_rate"),
        (lambda: AccessStampOptions(walk_rate=float("inf")), "access_stamp_options.walk_rate"),
        (lambda: AccessStampOptions(walk_batch=0), "access_stamp_options.walk_batch"),
        (lambda: AccessStampOptions(walk_batch=1.5), "access_stamp_options.walk_batch"),
        (lambda: AccessStampOptions(interval=timedelta(0)), "access_stamp_options.interval"),
        (lambda: AccessStampOptions(interval=10), "access_stamp_options.interval"),
        (lambda: WalkRecord(graph_id="g", schema="s", heads=-1), "walk_record.heads"),
        (lambda: WalkRecord(graph_id="g", schema="s", heads=1, count=-1), "walk_record.count"),
        (lambda: WalkRecord(graph_id="g", schema="s", heads=1, completed=1), "walk_record.completed"),
        (lambda: walk_thread_id("a#b", "g"), "group"),
        (lambda: walk_thread_id("grp", "g" * 250), "walk thread id"),
        (lambda: member_group(""), "group"),
    ],
)
def test_bad_input_is_a_validation_error_naming_the_field(build, field):
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.field == field


def test_a_hash_naming_two_declarations_is_refused(monkeypatch):
    one, two = AccessSchema("chat"), AccessSchema("other")
    object.__setattr__(two, "_hash", one.hash)  # a collision, as a 56-bit prefix might one day give
    with pytest.raises(ValidationError) as caught:
        AccessSchemas([one, two])
    assert caught.value.field == "access_schemas.hash"
    assert AccessSchemas([one, AccessSchema("chat")]).schemas == (one,)  # the same declaration twice is fine


def test_options_defaults():
    options = AccessStampOptions()
    assert (options.interval, options.walk_batch, options.walk_share, options.walk_rate) == (
        timedelta(seconds=10), 1000, 0.10, 100.0)


def test_walk_record_round_trip_and_names():
    record = WalkRecord(graph_id="chat", schema="a1x", heads=42, cursor="t-9", count=9, completed=False)
    assert WalkRecord.from_state("g#access-walk/chat", record.to_state()) == record
    import json

    assert WalkRecord.from_state("w", json.loads(json.dumps(record.to_state()))) == record
    assert walk_thread_id("g", "chat") == "g#access-walk/chat" and is_walk_thread("g#access-walk/chat")
    assert not is_walk_thread("g#access")
    assert member_group("g") == "g#access"
    assert serves(AccessSchema("chat")) == f"chat@{AccessSchema('chat').hash}"


@pytest.mark.parametrize("state", [None, [], "x", {"graph_id": "g"}, {"graph_id": "g", "schema": "s", "heads": "1"},
                                   {"graph_id": "g", "schema": "s", "heads": 1, "extra": 1},
                                   {"graph_id": "g", "schema": "s", "heads": 1, "count": 0, "completed": "no"}])
def test_a_record_that_does_not_decode_is_a_processing_error_naming_the_walk(state):
    with pytest.raises(ProcessingError) as caught:
        WalkRecord.from_state("g#access-walk/chat", state)
    assert caught.value.operation == "walk" and "g#access-walk/chat" in caught.value.message
