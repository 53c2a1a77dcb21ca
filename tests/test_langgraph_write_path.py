"""The saver's write path: a ``put`` / ``put_writes`` builds its checkpoint, event, writes and commit from parts it
validated itself, with their JSON text composed of those parts (no JSON value walked and encoded twice); what
the saver did not make itself (metadata values, config values, a task path) is still checked, and bad input is
refused with nothing written. Over memory, SQLite and PostgreSQL."""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.graph import END, START, StateGraph

from threadloom import ValidationError
from threadloom.domain import validation as v
from threadloom.langgraph import ThreadloomSaver


@pytest.fixture
def store(each_store):
    return each_store


class _State(TypedDict, total=False):
    left: int
    text: str
    log: Annotated[list[str], operator.add]


def _graph(checkpointer: Any):
    """The loop of the langgraph benchmark: one node, one superstep per round."""

    def step(state: _State) -> _State:
        return {"left": state["left"] - 1, "text": "x" * 64, "log": [f"s{state['left']}"]}

    graph = StateGraph(_State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: "step" if state["left"] > 0 else END, ["step", END])
    return graph.compile(checkpointer=checkpointer)


def _put(saver: Any, thread: str, *, parent: Any = None, **metadata: Any) -> dict:
    config = generate_config(thread)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent
    return saver.put(config, generate_checkpoint(channel_values={"n": 1}), generate_metadata(**metadata), {})


def test_a_graph_run_encodes_no_json_value_twice_and_stores_the_text_the_constructor_would(store, monkeypatch):
    encoded: list[str] = []
    original = v.encode_json

    def counting(field: str, value: Any) -> tuple[str, Any]:
        encoded.append(field)
        return original(field, value)

    monkeypatch.setattr(v, "encode_json", counting)
    with ThreadloomSaver(store) as saver:
        config = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}"}}
        result = _graph(saver).invoke({"left": 5, "log": []}, config)
        assert encoded == []  # every state, payload and event text composed of validated parts
        assert result["log"] == ["s5", "s4", "s3", "s2", "s1"]
        history = list(saver.list(config))
        assert len(history) == 7
        assert [item.pending_writes for item in history][1:] != [[]] * 6  # each superstep's writes came back
        monkeypatch.setattr(v, "encode_json", original)
        latest = store.latest(config["configurable"]["thread_id"])
        assert latest is not None
        # what the store holds decodes to the value the state holds, and is its canonical compact text
        cp = latest.checkpoint
        assert cp.sealed_json() == v.encode_json("state", cp.state)[0]
        assert [w.sealed_json() for w in latest.pending_writes] == [
            v.encode_json("payload", w.payload)[0] for w in latest.pending_writes
        ]


def test_a_non_ascii_parent_source_and_task_path_are_stored_as_they_are(store):
    with ThreadloomSaver(store) as saver:
        first = _put(saver, "plain", source="ïnput")
        config = _put(saver, "plain", parent=first["configurable"]["checkpoint_id"], source="loop")
        saver.put_writes(config, [("chännel", "välue")], "task-1", task_path="päth")
        got = saver.get_tuple(config)
        assert got is not None and got.metadata["source"] == "loop"
        assert [(task, channel, value) for task, channel, value in got.pending_writes] == [
            ("task-1", "chännel", "välue")
        ]
        other = _put(saver, "odd-parent", parent="çheckpoint-0")  # no checkpoint of this saver: kept as given
        assert saver.get_tuple(other) is not None


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("run_id", "checkpoint.run_id"),
        ("parent", "checkpoint.state"),
        ("source", "event.payload"),
        ("tenant", "checkpoint.tenant_id"),
    ],
)
def test_a_put_of_bad_input_the_saver_did_not_make_is_refused_and_writes_nothing(store, case, field):
    with ThreadloomSaver(store) as saver:
        if case == "tenant":
            saver.tenant_id = ""  # a public attribute, replaced after the saver checked it
        with pytest.raises(ValidationError) as caught:
            if case == "run_id":
                _put(saver, "bad", run_id="run-\ud800")
            elif case == "parent":
                _put(saver, "bad", parent="cp-\ud800")
            elif case == "source":
                _put(saver, "bad", source="loop-\udfff")
            else:
                _put(saver, "bad")
        assert caught.value.field == field
        assert store.latest("bad") is None


def test_put_writes_of_a_bad_task_path_is_refused_and_writes_nothing(store):
    with ThreadloomSaver(store) as saver:
        config = _put(saver, "w")
        with pytest.raises(ValidationError) as caught:
            saver.put_writes(config, [("channel", 1)], "task-1", task_path="path-\ud800")
        assert caught.value.field == "pending_write.payload"
        latest = store.latest("w")
        assert latest is not None and latest.pending_writes == ()
