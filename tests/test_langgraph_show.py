"""``threadloom show`` on a LangGraph saver's thread: the checkpoint's values decoded, never unpickled.

A real LangGraph graph (the tool loop of ``langgraph_agent.py``) runs to its human review on a SQLite store; the
command then runs as a subprocess, with LangGraph and (in one case) with LangGraph hidden as if not installed.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import pickle
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from threadloom import Checkpoint, CheckpointStatus, ClaimRequest, Commit, StoreCorrupt
from threadloom.langgraph import ThreadloomSaver, decode_stored, strict_serde
from threadloom.persistence.sqlite.store import SqliteCheckpointer

AGENT = Path(__file__).with_name("langgraph_agent.py")
_spec = importlib.util.spec_from_file_location("langgraph_agent", AGENT)
agent = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("langgraph_agent", agent)  # LangGraph reads the state's type hints through the module
_spec.loader.exec_module(agent)

_HIDE_LANGGRAPH = textwrap.dedent(
    """
    import sys

    class HideLangGraph:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "langgraph":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, HideLangGraph())
    from threadloom.cli.main import main

    sys.argv = ["threadloom", *sys.argv[1:]]
    main()
    """
)


def _show(tmp_path: Path, db: Path, *args: str, hide_langgraph: bool = False) -> subprocess.CompletedProcess:
    head = [sys.executable, "-c", _HIDE_LANGGRAPH] if hide_langgraph else [sys.executable, "-m", "threadloom"]
    result = subprocess.run(
        [*head, "--store", f"sqlite:///{db}", *args], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def _run_to_review(db: Path) -> None:
    with ThreadloomSaver.from_url(f"sqlite:///{db}") as saver:
        graph = agent.build(saver)
        graph.invoke({"log": ["user:hi"]}, {"configurable": {"thread_id": "t1"}})


def test_the_saver_and_show_decode_with_one_strict_serializer(tmp_path: Path) -> None:
    serde = strict_serde()
    assert serde.pickle_fallback is False
    assert serde._allowed_msgpack_modules is None and serde._allowed_json_modules is None  # noqa: SLF001
    with SqliteCheckpointer.open(str(tmp_path / "s.db")) as store, ThreadloomSaver(store) as saver:
        assert saver.serde.pickle_fallback is False and saver.serde._allowed_msgpack_modules is None  # noqa: SLF001


def test_show_decodes_a_langgraph_checkpoint_and_its_pending_writes(tmp_path: Path) -> None:
    db = tmp_path / "graph.db"
    _run_to_review(db)
    document = json.loads(_show(tmp_path, db, "--json", "show", "t1").stdout)
    decoded = document["langgraph"]
    values = decoded["checkpoint"]["channel_values"]
    assert values["log"] == ["user:hi", "agent:call-0", "tool:1", "agent:call-1", "tool:2", "agent:review"]
    assert values["steps"] == 2
    assert decoded["metadata"]["source"] == "loop" and decoded["metadata"]["step"] == 5
    assert decoded["parent"] == document["checkpoint"]["parent"]
    [interrupt] = [w for w in decoded["pending_writes"] if w["channel"] == "__interrupt__"]
    assert interrupt["value"][0]["value"] == {"question": "approve?", "seen": 6}
    assert document["notes"] == []
    text = _show(tmp_path, db, "show", "t1").stdout
    assert "state (LangGraph checkpoint, decoded)" in text
    assert '"agent:review"' in text and '"approve?"' in text
    assert '"msgpack"' not in text  # no stored value is printed as its encoded bytes


def test_without_langgraph_show_prints_the_stored_values_as_before(tmp_path: Path) -> None:
    db = tmp_path / "graph.db"
    _run_to_review(db)
    document = json.loads(_show(tmp_path, db, "--json", "show", "t1", hide_langgraph=True).stdout)
    assert "langgraph" not in document
    stored = document["checkpoint"]["state"]["checkpoint"]
    assert stored["type"] == "msgpack" and isinstance(stored["data"], str)
    text = _show(tmp_path, db, "show", "t1", hide_langgraph=True).stdout
    assert "state (LangGraph checkpoint, decoded)" not in text and '"msgpack"' in text


class _Marker:
    """Unpickling it creates the file named ``path``: the proof that something was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_show_never_unpickles_a_stored_value(tmp_path: Path) -> None:
    db = tmp_path / "graph.db"
    marker = tmp_path / "unpickled"
    evil = {"type": "pickle", "data": base64.b64encode(pickle.dumps(_Marker(str(marker)))).decode("ascii")}
    state = {"format": "langgraph/1", "checkpoint": evil, "metadata": evil, "parent": None}
    with SqliteCheckpointer.open(str(db)) as store:
        token = store.claim("t1", ClaimRequest(holder="w", ttl=timedelta(seconds=30))).token
        checkpoint = Checkpoint(
            id="c1", parent=None, thread_id="t1", run_id="r", status=CheckpointStatus.COMPLETED,
            created_at=datetime(2026, 1, 1, tzinfo=UTC), state=state, graph_id="langgraph",
        )  # fmt: skip
        store.commit("t1", Commit(token=token, checkpoint=checkpoint))
        store.release("t1", token)
        stored = store.latest("t1")
    assert stored is not None
    document = json.loads(_show(tmp_path, db, "--json", "show", "t1").stdout)
    assert document["langgraph"] is None
    assert any("do not decode" in note and "pickle" in note for note in document["notes"])
    assert document["checkpoint"]["state"]["checkpoint"] == evil
    _show(tmp_path, db, "show", "t1")
    assert not marker.exists()
    with pytest.raises(StoreCorrupt, match="pickle"):
        decode_stored(stored.checkpoint)
    assert not marker.exists()
