"""The runtime's superstep path: a node's thread commits its own step and runs the next node; a step's state is
validated once and reaches the next node without another copy; what is checked once per run stays checked. Every
runtime test runs over memory and over SQLite."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import structlog

from threadloom import (
    Checkpoint,
    CheckpointStatus,
    Graph,
    GraphRuntime,
    InMemoryCheckpointer,
    RunFailed,
    Step,
    ValidationError,
)
from threadloom.actors import graph as g
from threadloom.actors.scheduler import RandomIds
from threadloom.domain.validation import EncodedJson
from threadloom.persistence.logs import SafeLogger

WAIT = timedelta(seconds=10)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _memory(tmp_path):
    return InMemoryCheckpointer()


def _sqlite(tmp_path):
    from threadloom.persistence.sqlite.store import SqliteCheckpointer

    return SqliteCheckpointer.open(str(tmp_path / "hot.db"))


@pytest.fixture(params=[_memory, _sqlite], ids=["memory", "sqlite"])
def store(request, tmp_path):
    store = request.param(tmp_path)
    yield store
    store.close()


def test_what_a_node_does_to_its_state_after_the_step_never_reaches_the_committed_checkpoints(store):
    kept: dict = {}

    def a(state, ctx):
        new = {**state, "items": [1, 2], "nested": {"x": 1}}
        kept["returned"] = new
        return Step.to("b", new, events=[("a.done", kept.setdefault("payload", {"n": 1}))])

    def b(state, ctx):
        kept["given"] = state
        # Change what a returned and what b was given, in place: neither is a committed checkpoint's state.
        kept["returned"]["items"].append("from a's object")
        kept["payload"]["n"] = 99
        state["items"].append("from b's input")
        state["nested"]["x"] = {"not": "committed"}
        raise RuntimeError("b fails after changing its input")

    with GraphRuntime(store, node_id="n1") as runtime:
        with pytest.raises(RunFailed):
            runtime.start("t1", Graph("g", {"a": a, "b": b}, entry="a"), {"start": True}).wait(WAIT)
    assert kept["given"] is not kept["returned"]  # the node got the committed copy, not the object a returned
    failed, step_a, admitted = store.history("t1", limit=3)
    expected = {"start": True, "items": [1, 2], "nested": {"x": 1}}
    assert step_a.state == expected
    assert failed.status is CheckpointStatus.FAILED and failed.state == expected  # the state as committed
    assert admitted.state == {"start": True}
    payloads = [e.payload for e in store.events_after("t1", 0, 10) if e.type == "a.done"]
    assert payloads == [{"n": 1}]


def test_every_node_of_a_plain_run_runs_on_one_task_thread_and_commits_its_own_step(store):
    threads: list[threading.Thread] = []

    def node(state, ctx):
        threads.append(threading.current_thread())
        n = state["n"] + 1
        return Step.to("node", {"n": n}) if n < 5 else Step.end({"n": n})

    with GraphRuntime(store, node_id="n1") as runtime:
        outcome = runtime.start("t1", Graph("g", {"node": node}, entry="node"), {"n": 0}).wait(WAIT)
    assert outcome.state == {"n": 5} and outcome.steps == 5
    assert len(set(threads)) == 1
    assert [cp.metadata[g.STEP_KEY] for cp in store.history("t1", limit=10)] == ["5", "4", "3", "2", "1", "0"]


class _BadIdsFrom(RandomIds):
    """Ids as usual, but from step ``bad_from`` on a checkpoint id longer than 255 characters."""

    def __init__(self, bad_from: int) -> None:
        self.bad_from = bad_from

    def checkpoint_id(self, run_id: str, step: int) -> str:
        return "x" * 300 if step >= self.bad_from else super().checkpoint_id(run_id, step)


def test_a_checkpoint_id_the_id_factory_gets_wrong_mid_run_is_refused_and_nothing_of_that_step_is_stored(store):
    def node(state, ctx):
        ctx.emit("tick", {"n": state["n"]})
        return Step.to("node", {"n": state["n"] + 1})

    with GraphRuntime(store, node_id="n1", ids=_BadIdsFrom(3)) as runtime:
        handle = runtime.start("t1", Graph("g", {"node": node}, entry="node"), {"n": 0})
        with pytest.raises(ValidationError) as caught:
            handle.wait(WAIT)
    assert caught.value.field == "checkpoint.id"
    assert [cp.metadata[g.STEP_KEY] for cp in store.history("t1", limit=10)] == ["2", "1", "0"]
    assert [e.payload for e in store.events_after("t1", 0, 20) if e.type == "tick"] == [{"n": 0}, {"n": 1}]


def test_a_task_id_over_255_characters_is_refused_only_when_the_step_has_events(store):
    long_node = "n" * 253  # its task ids "1:<node>" fit; "10:<node>" and later do not

    def quiet(state, ctx):
        n = state["n"] + 1
        return Step.to(long_node, {"n": n}) if n < 12 else Step.end({"n": n})

    def loud(state, ctx):
        return Step.to(long_node, {**state, "n": state["n"] + 1}, events=[("tick", state["n"])])

    with GraphRuntime(store, node_id="n1") as runtime:
        outcome = runtime.start("quiet", Graph("q", {long_node: quiet}, entry=long_node), {"n": 0}).wait(WAIT)
        assert outcome.steps == 12
        with pytest.raises(ValidationError) as caught:
            runtime.start("loud", Graph("l", {long_node: loud}, entry=long_node), {"n": 0}).wait(WAIT)
    assert caught.value.field == "event.task_id"
    assert [cp.metadata[g.STEP_KEY] for cp in store.history("loud", limit=20)][0] == "9"


# -- encoded once -------------------------------------------------------------------------------------------------


def test_an_encoded_json_is_validated_like_the_value_and_a_checkpoint_takes_it_as_it_is():
    value = {"a": [1, 2.5, "x"], "b": None}
    encoded = EncodedJson("checkpoint.state", value)
    cp = Checkpoint(
        id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
        state=encoded,
    )
    plain = Checkpoint(
        id="c1", parent=None, thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
        state=value,
    )
    assert cp == plain and cp.sealed_json() == plain.sealed_json() == encoded.text
    value["a"].append("later")  # the caller's object is not the checkpoint's
    assert cp.state == {"a": [1, 2.5, "x"], "b": None}
    with pytest.raises(ValidationError) as caught:
        EncodedJson("step.state", {"bad": {1, 2}})
    assert caught.value.field == "step.state"


def test_a_second_take_of_an_encoded_json_shares_nothing_with_the_first():
    encoded = EncodedJson("x", {"list": [1, {"deep": True}]})
    text, first = encoded.take()
    first["list"][1]["deep"] = "changed by its first owner"
    again_text, second = encoded.take()
    assert again_text == text and second == {"list": [1, {"deep": True}]}
    assert second["list"] is not first["list"]


def test_a_step_keeps_the_state_it_was_given_and_refuses_a_bad_event_payload_naming_it():
    state = {"k": [1]}
    step = Step.to("next", state, events=[("e", {"ok": True})])
    assert step.state is state and step.events == (("e", {"ok": True}),)
    encoded_state, payloads = step.encoded()
    assert encoded_state.text == '{"k":[1]}' and [p.text for p in payloads] == ['{"ok":true}']
    with pytest.raises(ValidationError) as caught:
        Step.to("next", {}, events=[("e", {"ok": True}), ("f", float("nan"))])
    assert caught.value.field == "step.events[1]"



def test_a_prevalidated_builder_makes_the_value_the_constructor_makes_and_a_replaced_field_is_checked_again():
    from threadloom import Commit, EventDraft
    from threadloom.domain.values import intact, prevalidated_builder
    from threadloom.persistence.encoded import encode_commit

    state = EncodedJson("checkpoint.state", {"a": [1, {"b": None}]})
    payload = EncodedJson("event.payload", {"ok": True})
    metadata = {"next": "n", "step": "1"}
    cp = prevalidated_builder(Checkpoint)(
        state.text, "c1", "c0", "t", "r", CheckpointStatus.RUNNING, NOW, state.take()[1], "g", None, None, None,
        metadata,
    )
    event = prevalidated_builder(EventDraft)(payload.text, "r", "e", NOW, payload.take()[1], "c1", "1:n", "n")
    commit = prevalidated_builder(Commit)(7, cp, (), (event,), (), False, None, None)
    public_cp = Checkpoint(
        id="c1", parent="c0", thread_id="t", run_id="r", status=CheckpointStatus.RUNNING, created_at=NOW,
        state={"a": [1, {"b": None}]}, graph_id="g", metadata=metadata,
    )
    public_event = EventDraft(run_id="r", type="e", timestamp=NOW, payload={"ok": True}, checkpoint_id="c1",
                              task_id="1:n", node_id="n")
    public = Commit(token=7, checkpoint=public_cp, events=(public_event,))
    assert cp == public_cp and event == public_event and commit == public
    assert cp.sealed_json() == public_cp.sealed_json() and event.sealed_json() == public_event.sealed_json()
    assert intact(cp._seal, Checkpoint._GETTER(cp)) and intact(event._seal, EventDraft._GETTER(event))
    built, constructed = encode_commit("t", commit), encode_commit("t", public)
    assert built.checkpoint == constructed.checkpoint and built.events[0].text(1) == constructed.events[0].text(1)
    object.__setattr__(cp, "run_id", "")  # replaced behind the builder's back: validated again when stored
    with pytest.raises(ValidationError):
        encode_commit("t", commit)
    with pytest.raises(ValueError):  # one value per public field, no fewer
        prevalidated_builder(Commit)(7, cp)


# -- logging --------------------------------------------------------------------------------------------------------


def test_a_safe_logger_says_whether_a_level_is_written():
    import logging

    filtering = structlog.make_filtering_bound_logger(logging.WARNING)
    quiet = SafeLogger(filtering(structlog.PrintLogger(), processors=[], context={}))
    assert not quiet.enabled_for(logging.INFO) and quiet.enabled_for(logging.ERROR)
    assert SafeLogger(object()).enabled_for(logging.DEBUG)  # a logger that cannot tell: assumed on

    class Broken:
        def is_enabled_for(self, level):
            raise RuntimeError("broken")

    assert SafeLogger(Broken()).enabled_for(logging.INFO)
