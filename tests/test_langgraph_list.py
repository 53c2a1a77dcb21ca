"""ThreadloomSaver.list: filter, before and limit answered by the store, against LangGraph's own saver.

The same checkpoints go to ThreadloomSaver (over memory, SQLite and PostgreSQL) and to LangGraph's
``InMemorySaver``; every combination of filter, before and limit on which LangGraph's savers agree must list the
same checkpoints in the same order. Where they disagree (``None`` against a missing key, ``True`` against ``1``),
the saver's documented JSON semantics are asserted. The store answers the filter: a filter that matches nothing
costs one store call per 1000 checkpoints, and runs removed by ``delete_for_runs`` are paged past.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypedDict

import attrs
import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config
from langgraph.checkpoint.memory import InMemorySaver

from threadloom import ClaimRequest, Commit, ValidationError
from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.testing.harness import CountingCheckpointer


@pytest.fixture
def store(each_store):
    return each_store


def _metadata(index: int) -> dict[str, Any]:
    """Step ``index``'s metadata: plain values of every JSON kind, a value that is not plain JSON, a key that
    comes and goes, and one that is sometimes null."""
    metadata: dict[str, Any] = {
        "source": ("input", "loop", "update")[index % 3],
        "step": index,
        "score": (0, 1, 1.0, 2.5)[index % 4],  # 1 and 1.0 are one JSON value
        "tags": ["a", "b"] if index % 2 else ["b", "a"],
        "info": {"a": index % 2, "b": {"c": [1, 2]}} if index % 3 else {"b": {"c": [1, 2]}, "a": index % 2},
        "flag": (True, 1, False, 0)[index % 4],
        "when": datetime(2024, 1, 1 + index % 5, tzinfo=UTC),  # not plain JSON: not filterable
        "run_id": f"run-{index % 3}",
    }
    if index % 5 == 0:
        metadata["maybe"] = None
    elif index % 5 == 1:
        metadata["maybe"] = "x"
    return metadata


def _fill(savers: list[Any], threads: dict[str, dict[str, int]]) -> dict[tuple[str, str], list[str]]:
    """Puts the same checkpoints (same ids) to every saver: ``threads[thread][ns]`` steps each; their ids."""
    ids: dict[tuple[str, str], list[str]] = {}
    for thread, namespaces in threads.items():
        for ns, steps in namespaces.items():
            parent: str | None = None
            for index in range(steps):
                checkpoint = generate_checkpoint(channel_values={"n": index})
                config = generate_config(thread, checkpoint_ns=ns, checkpoint_id=parent)
                for saver in savers:
                    saver.put(config, checkpoint, _metadata(index), {})
                parent = checkpoint["id"]
                ids.setdefault((thread, ns), []).append(parent)
    return ids


def _listed(saver: Any, config: Any, **options: Any) -> list[tuple[str, str, str]]:
    return [
        (t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"], t.checkpoint["id"])
        for t in saver.list(config, **options)
    ]


FILTERS: list[dict[str, Any] | None] = [
    None,
    {},
    {"source": "loop"},
    {"step": 4},
    {"step": 4.0},
    {"source": "input", "step": 3},
    {"score": 1},
    {"score": 1.0},
    {"score": 2.5},
    {"tags": ["a", "b"]},
    {"info": {"b": {"c": [1, 2]}, "a": 1}},
    {"info": {"a": 0, "b": {"c": [1.0, 2]}}},
    {"maybe": "x"},
    {"source": "loop", "step": 99},
    {"absent": "x"},
    {"source": "nothing"},
    {"thread_id": "t"},
]


def test_filter_before_and_limit_list_what_langgraphs_saver_lists(store) -> None:
    saver, reference = ThreadloomSaver(store), InMemorySaver()
    try:
        ids = _fill([saver, reference], {"t": {"": 14, "sub:1": 4}, "u": {"": 3}})
        root = ids[("t", "")]
        befores = [None, root[-1], root[9], root[3], root[0]]
        configs = [generate_config("t"), generate_config("t", checkpoint_ns="sub:1"), generate_config("u")]
        checked = 0
        for config, wanted, before_id, limit in itertools.product(configs, FILTERS, befores, [None, 1, 2, 5]):
            ns = config["configurable"]["checkpoint_ns"]
            before = None
            if before_id is not None:
                if config["configurable"]["thread_id"] != "t" or ns != "":
                    continue
                before = generate_config("t", checkpoint_id=before_id)
            options = {"filter": wanted, "before": before, "limit": limit}
            ours = _listed(saver, config, **options)
            assert ours == _listed(reference, config, **options), (config, options)
            checked += bool(ours)
        assert checked > 100
        # a config without checkpoint_ns lists every namespace: the root first, then the subgraph's
        whole = {"configurable": {"thread_id": "t"}}
        for wanted in FILTERS:
            assert _listed(saver, whole, filter=wanted) == _listed(reference, whole, filter=wanted), wanted
        # a config naming a checkpoint lists that one only, if it matches
        named = generate_config("t", checkpoint_id=root[4])
        assert _listed(saver, named) == _listed(reference, named) == [("t", "", root[4])]
        assert _listed(saver, named, filter={"step": 4}) == [("t", "", root[4])]
        assert _listed(saver, named, filter={"step": 5}) == _listed(reference, named, filter={"step": 5}) == []
    finally:
        saver.close()


def test_filter_values_compare_as_json_values(store) -> None:
    """Where LangGraph's savers disagree with each other, the saver's JSON semantics (README "LangGraph")."""
    saver, reference = ThreadloomSaver(store), InMemorySaver()
    try:
        ids = _fill([saver, reference], {"t": {"": 10}})["t", ""]
        config = generate_config("t")

        def steps(wanted: dict[str, Any]) -> list[int]:
            return [t.metadata["step"] for t in saver.list(config, filter=wanted)]

        # null matches a stored null only (LangGraph's in-memory and SQLite savers also match a missing key)
        assert steps({"maybe": None}) == [5, 0]
        assert len(list(reference.list(config, filter={"maybe": None}))) == 8
        # true is not 1, and 1 is not true (their in-memory and SQLite savers match either with either)
        assert steps({"flag": True}) == [8, 4, 0]
        assert steps({"flag": 1}) == [9, 5, 1]
        assert steps({"flag": 1.0}) == [9, 5, 1]
        assert steps({"flag": False}) == [6, 2]
        assert steps({"flag": 0}) == [7, 3]
        assert len(list(reference.list(config, filter={"flag": True}))) == 6
        # numbers by value, also inside lists and objects; lists in order; objects whatever their key order
        assert steps({"score": 1}) == steps({"score": 1.0}) == [9, 6, 5, 2, 1]
        assert steps({"tags": ["a", "b"]}) == [9, 7, 5, 3, 1]
        assert steps({"tags": ["b", "a"]}) == [8, 6, 4, 2, 0]
        assert steps({"tags": ["a"]}) == []  # no containment: the whole list
        assert steps({"info": {"b": {"c": [1.0, 2.0]}, "a": 1.0}}) == [9, 7, 5, 3, 1]
        assert steps({"info": {"b": {"c": [1, 2]}}}) == []  # no containment: the whole object
        assert steps({"step": "3"}) == []  # a string is not a number
        # a key whose value is not plain JSON is not filterable: a filter naming a JSON value matches nothing
        assert steps({"when": "2024-01-01T00:00:00+00:00"}) == []
        assert [t.checkpoint["id"] for t in saver.list(config, filter={"step": 0})] == [ids[0]]
    finally:
        saver.close()


@pytest.mark.parametrize(
    "wanted, field",
    [
        ([("source", "loop")], "filter"),
        ("source", "filter"),
        ({1: "x"}, "filter key"),
        ({"a\x00": "x"}, "filter key"),
        ({"when": datetime(2024, 1, 1, tzinfo=UTC)}, "filter['when']"),
        ({"x": float("nan")}, "filter['x']"),
        ({"x": {1: "y"}}, "filter['x']"),
        ({f"k{index}": index for index in range(65)}, "filter"),
    ],
)
def test_a_filter_that_is_not_json_is_refused_naming_it(wanted: Any, field: str) -> None:
    store = InMemoryCheckpointer()
    counted = CountingCheckpointer(store)
    with ThreadloomSaver(counted) as saver:
        with pytest.raises(ValidationError) as caught:
            list(saver.list(generate_config("t"), filter=wanted))
        assert caught.value.field == field
        assert counted.calls == Counter()  # refused before the store is asked anything


def test_before_and_config_combinations_that_name_nothing_are_refused() -> None:
    with ThreadloomSaver(InMemoryCheckpointer()) as saver:
        ids = _fill([saver], {"t": {"": 3}})["t", ""]
        before = generate_config("t", checkpoint_id=ids[1])
        for config in (None, generate_config("t", checkpoint_id=ids[2])):
            with pytest.raises(ValidationError) as caught:
                list(saver.list(config, before=before))
            assert caught.value.field == "before"
        with pytest.raises(ValidationError) as caught:
            list(saver.list(generate_config("t"), before={"configurable": {"checkpoint_id": 7}}))
        assert caught.value.field == "before"
        # a before naming only a checkpoint id (LangGraph's own example) pages the listed namespace
        assert _listed(saver, generate_config("t"), before={"configurable": {"checkpoint_id": ids[2]}}) == [
            ("t", "", ids[1]), ("t", "", ids[0])
        ]  # fmt: skip
        assert _listed(saver, generate_config("t"), before={"configurable": {"checkpoint_id": "gone"}}) == []


def test_before_pages_across_the_namespaces_of_a_thread(store) -> None:
    with ThreadloomSaver(store) as saver:
        ids = _fill([saver], {"t": {"": 5, "sub:1": 3, "sub:2": 2}})
        whole = {"configurable": {"thread_id": "t"}}
        everything = _listed(saver, whole)
        assert everything == [
            *(("t", "", cp) for cp in reversed(ids["t", ""])),
            *(("t", "sub:1", cp) for cp in reversed(ids["t", "sub:1"])),
            *(("t", "sub:2", cp) for cp in reversed(ids["t", "sub:2"])),
        ]
        for size in (1, 2, 3, 4, 7):
            pages: list[tuple[str, str, str]] = []
            before = None
            while True:
                page = list(saver.list(whole, before=before, limit=size))
                pages += [(t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"],
                           t.checkpoint["id"]) for t in page]  # fmt: skip
                if len(page) < size:
                    break
                before = page[-1].config
            assert pages == everything, size
        gone = generate_config("t", checkpoint_ns="sub:1", checkpoint_id="gone")
        assert _listed(saver, whole, before=gone) == []  # not where before says: nothing, not the rest
        middle = generate_config("t", checkpoint_ns=everything[6][1], checkpoint_id=everything[6][2])
        assert everything[6][1] == "sub:1" and _listed(saver, whole, before=middle) == everything[7:]


def test_listing_every_thread_of_the_tenant(store) -> None:
    mine, theirs = ThreadloomSaver(store, tenant_id="acme"), ThreadloomSaver(store, tenant_id="globex")
    try:
        ids = _fill([mine], {"t1": {"": 3, "sub:1": 2}, "t2": {"": 4}})
        _fill([theirs], {"t3": {"": 5}})
        ids.update(_fill([mine], {"t4": {"": 2}}))  # written last: listed first
        listed = _listed(mine, None)
        order = [key for key, _group in itertools.groupby((t, ns) for t, ns, _ in listed)]
        assert order == [("t4", ""), ("t2", ""), ("t1", ""), ("t1", "sub:1")]
        assert Counter((t, ns) for t, ns, _ in listed) == {
            ("t4", ""): 2, ("t2", ""): 4, ("t1", ""): 3, ("t1", "sub:1"): 2
        }  # fmt: skip
        assert _listed(mine, None, filter={"step": 1}) == [
            ("t4", "", ids["t4", ""][1]), ("t2", "", ids["t2", ""][1]), ("t1", "", ids["t1", ""][1]),
            ("t1", "sub:1", ids["t1", "sub:1"][1]),
        ]  # fmt: skip
        assert _listed(mine, None, filter={"step": 3}, limit=1) == [("t2", "", ids["t2", ""][3])]
        assert _listed(mine, None, limit=3) == listed[:3]
        assert {thread for thread, _ns, _cp in _listed(theirs, None)} == {"t3"}
        with ThreadloomSaver(store) as tenantless:
            assert _listed(tenantless, None) == []  # no tenant-less threads
    finally:
        mine.close()
        theirs.close()



def test_the_store_answers_the_filter_and_hidden_runs_are_paged_past() -> None:
    store = CountingCheckpointer(InMemoryCheckpointer())
    with ThreadloomSaver(store) as saver:
        _fill([saver], {"t": {"": 2300}})
        config = generate_config("t")
        store.calls.clear()
        assert list(saver.list(config, filter={"source": "nothing"})) == []
        # one latest read and one store call per 1000 checkpoints examined; no checkpoint read one by one
        assert store.calls == Counter({"search_history": 3, "latest": 1})
        store.calls.clear()
        found = [t.metadata["step"] for t in saver.list(config, filter={"step": 2299}, limit=1)]
        assert found == [2299] and store.calls["search_history"] == 1
        store.calls.clear()
        assert [t.metadata["step"] for t in saver.list(config, filter={"source": "loop"}, limit=3)] == [
            2299, 2296, 2293
        ]  # fmt: skip
        # one page of matches, then one search for each match that is not the latest: the checkpoint after it
        # (it carries its writes; not a match), and none for late writes (the latest says none is carried)
        assert store.calls["search_history"] == 3
        saver.delete_for_runs(["run-1", "run-2"])  # steps 1, 2 (mod 3): every "loop" and "update" step
        store.calls.clear()
        visible = [t.metadata["step"] for t in saver.list(config, limit=4)]
        assert visible == [2298, 2295, 2292, 2289]  # two of every three hidden: a page of 4, then one of 8
        assert store.calls["history"] == 2 and store.calls["search_history"] == 0  # no filter: history pages
        store.calls.clear()
        assert [t.metadata["step"] for t in saver.list(config, filter={"source": "loop"}, limit=2)] == []
        assert store.calls["search_history"] == 9  # pages of 2, 4, 8 … 512 matches: the hidden ones read in 9
        assert [t.metadata["step"] for t in saver.list(config, filter={"source": "input"}, limit=2)] == [2298, 2295]


def test_a_checkpoint_stored_without_filterable_metadata_is_listed_and_never_matched() -> None:
    """A checkpoint the saver wrote before it kept LangGraph's metadata where the store can compare it."""
    store = InMemoryCheckpointer()
    with ThreadloomSaver(store) as saver:
        ids = _fill([saver], {"t": {"": 2}})["t", ""]
    latest = store.checkpoint("t", ids[1])
    assert latest is not None and latest.metadata["langgraph.meta.source"] == '"loop"'
    assert latest.metadata["langgraph.meta.info"] == '{"a":1,"b":{"c":[1,2]}}'
    assert "langgraph.meta.when" not in latest.metadata
    claim = store.claim("t", ClaimRequest(holder="old", ttl=timedelta(seconds=30)))
    legacy = attrs.evolve(latest, id="legacy", parent=ids[1], metadata={}, fencing_token=None)
    store.commit("t", Commit(token=claim.token, checkpoint=legacy))
    store.release("t", claim.token)
    with ThreadloomSaver(store) as saver:
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(generate_config("t"))]
        assert listed == ["legacy", ids[1], ids[0]]
        matched = saver.list(generate_config("t"), filter={"source": "loop"})
        assert [t.config["configurable"]["checkpoint_id"] for t in matched] == [ids[1]]


def test_alist_filters_like_list(store) -> None:
    with ThreadloomSaver(store) as saver:
        _fill([saver], {"t": {"": 6}})

        async def collect() -> list[int]:
            return [t.metadata["step"] async for t in saver.alist(generate_config("t"), filter={"score": 1}, limit=2)]

        assert asyncio.run(collect()) == [5, 2]


def test_a_copied_thread_is_filtered_like_its_source(store) -> None:
    with ThreadloomSaver(store) as saver:
        _fill([saver], {"src": {"": 7, "sub:1": 3}})
        saver.copy_thread("src", "dst")
        for wanted in ({"source": "loop"}, {"score": 1}, {"step": 2}, {"absent": 1}):
            source = [(ns, cp) for _t, ns, cp in _listed(saver, {"configurable": {"thread_id": "src"}}, filter=wanted)]
            copied = [(ns, cp) for _t, ns, cp in _listed(saver, {"configurable": {"thread_id": "dst"}}, filter=wanted)]
            assert copied == source, wanted


@pytest.mark.parametrize(
    "value",
    ["loop", "", "é ü 中文", "tab\there", "nul\x00inside", "line\nbreak", "lone \ud800 surrogate", 0, -7, 2**70,
     True, False, None, {}, {"b": 1, "a": [1.0, "x"]}, [], 1.0, 2.5],
)
def test_filterable_takes_the_canonical_text_of_each_value_whatever_path_it_takes(value: Any) -> None:
    from threadloom.langgraph import _mapping as m

    metadata = {"key": value, "k\u00e9y": value}  # an ASCII printable key (the short paths) and another
    plain = m._plain(value)
    expected = {} if not plain else {m.METADATA_PREFIX + "key": m.filter_text(value),
                                     m.METADATA_PREFIX + "k\u00e9y": m.filter_text(value)}
    assert m.filterable(metadata) == expected


class _LogState(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def test_a_persistent_subgraph_replayed_from_a_parent_checkpoint_is_as_in_langgraphs_saver(store) -> None:
    """LangGraph's replay lists a ``checkpointer=True`` subgraph's namespace below the parent's checkpoint id
    (``list(ns, before=<parent checkpoint>, limit=1)``); the saver answered nothing there (``before`` had to name a
    checkpoint of the listed namespace), so the replayed subgraph lost its earlier state (found by hostile testing)."""
    from langgraph.graph import END, START, StateGraph

    def run(saver: Any) -> tuple[list[str], int]:
        inner = StateGraph(_LogState)
        inner.add_node("s1", lambda state: {"log": ["s1"]})
        inner.add_edge(START, "s1")
        inner.add_edge("s1", END)
        outer = StateGraph(_LogState)
        outer.add_node("pre", lambda state: {"log": ["pre"]})
        outer.add_node("sub", inner.compile(checkpointer=True))
        outer.add_node("post", lambda state: {"log": ["post"]})
        outer.add_edge(START, "pre")
        outer.add_edge("pre", "sub")
        outer.add_edge("sub", "post")
        outer.add_edge("post", END)
        graph = outer.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "replay"}}
        graph.invoke({"log": ["x"]}, config)
        graph.invoke({"log": ["y"]}, config)
        target = next(s for s in graph.get_state_history(config) if s.next == ("sub",))  # the second run's
        graph.invoke(None, target.config)
        sub = {"configurable": {"thread_id": "replay", "checkpoint_ns": "sub"}}
        root = saver.get_tuple({"configurable": {"thread_id": "replay", "checkpoint_ns": ""}})
        below = list(saver.list(sub, before={"configurable": {"checkpoint_id": root.checkpoint["id"]}}, limit=1))
        return saver.get_tuple(sub).checkpoint["channel_values"]["log"], len(below)

    saver = ThreadloomSaver(store)
    try:
        assert run(saver) == run(InMemorySaver())
    finally:
        saver.close()


class _SubState(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    count: int


class _OuterState(TypedDict, total=False):
    n: int
    log: Annotated[list[str], operator.add]


@pytest.mark.parametrize("scenario", ["travel_with_exit", "travel_from_an_exit_checkpoint"])
def test_a_persistent_subgraph_replayed_with_exit_durability_is_as_in_langgraphs_saver(store, scenario) -> None:
    """Found by fuzzing against ``InMemorySaver``: with ``durability="exit"`` LangGraph's replay of a persistent
    subgraph names a parent checkpoint that was never stored (the run's fork point), or one stored at exit with a
    ``ts`` later than its id's time; the saver answered by the stored checkpoint's ``ts``, so the replayed subgraph
    got the wrong state (its interrupt showed another count than LangGraph's own saver)."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def run(saver: Any) -> list[Any]:
        inner = StateGraph(_SubState)
        inner.add_node("s1", lambda state: {"count": state.get("count", 0) + 1})
        inner.add_node("ask", lambda state: {"log": [interrupt({"count": state["count"]})]})
        inner.add_edge(START, "s1")
        inner.add_edge("s1", "ask")
        inner.add_edge("ask", END)
        outer = StateGraph(_OuterState)
        outer.add_node("pre", lambda state: {"n": state.get("n", 0) + 1})
        outer.add_node("sub", inner.compile(checkpointer=True))
        outer.add_edge(START, "pre")
        outer.add_edge("pre", "sub")
        outer.add_edge("sub", END)
        graph = outer.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": f"exit-{scenario}"}}
        if scenario == "travel_with_exit":
            graph.invoke({"n": 0}, config)
            first = list(graph.get_state_history(config))[-1]  # the input checkpoint
            out = graph.invoke(None, first.config, durability="exit")
        else:
            graph.invoke({"n": 0}, config, durability="exit")
            head = list(graph.get_state_history(config))[0]
            out = graph.invoke(None, head.config)
        return [i.value for i in out["__interrupt__"]]

    saver = ThreadloomSaver(store)
    try:
        assert run(saver) == run(InMemorySaver())
    finally:
        saver.close()
