"""Section ``langgraph``: one compiled LangGraph ``StateGraph`` on ThreadloomSaver against LangGraph's own savers.

* supersteps/s of one compiled graph (a node looping ``STEPS`` supersteps per invoke, on one thread, with LangGraph's
  default durability) on ThreadloomSaver (fencing every write by the thread's claim) against ``SqliteSaver`` on a
  SQLite file in the same directory, and against ``PostgresSaver`` on the same server (a schema each), when
  ``THREADLOOM_BENCH_PG`` names one;
* ``get_tuple`` (the latest) and ``list(limit=100)`` median latency on a thread of 100 and of 10,000 checkpoints
  (``--quick``: 1,000), each against the same call on LangGraph's saver holding the same checkpoints (on
  PostgreSQL after ``VACUUM ANALYZE`` of both schemas: each checkpoint deletes the previous one's pending writes,
  and the dead rows of a fill that just ended slow both savers' reads until autovacuum runs).

The graph rows take ``ROUNDS`` rounds (``--quick``: ``QUICK_ROUNDS``), each measuring both savers one after the
other (which goes first alternates), and show the round whose ratio is the median: both figures are that round's.

LangGraph's savers come from ``langgraph-checkpoint-sqlite`` and ``langgraph-checkpoint-postgres``; without them
(or without LangGraph) the section is skipped with the reason.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from benchlib import Row, Section, SectionUnavailable, Settings, paired_median_us, quiet_logs

PG_ENV = "THREADLOOM_BENCH_PG"
STEPS = 20
"""Supersteps per invoke."""
ROUNDS = 7
"""Rounds of the graph rows (odd: the median is one round's ratio)."""
QUICK_ROUNDS = 3
GOAL = 1.0
"""Our supersteps/s at least this multiple of LangGraph's saver's, while fencing."""
TEXT = "x" * 512


class _State(TypedDict, total=False):
    left: int
    text: str
    log: Annotated[list[str], operator.add]


def _node(state: _State) -> _State:
    return {"left": state["left"] - 1, "text": TEXT, "log": [f"s{state['left']}"]}


def _graph(checkpointer: Any):
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(_State)
    graph.add_node("step", _node)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: "step" if state["left"] > 0 else END, ["step", END])
    return graph.compile(checkpointer=checkpointer)


def _supersteps(checkpointer: Any, seconds: float) -> float:
    """Supersteps/s of invokes of ``STEPS`` supersteps each, on fresh threads, for about ``seconds``."""
    graph = _graph(checkpointer)
    graph.invoke({"left": 2, "log": []}, {"configurable": {"thread_id": f"warm-{uuid.uuid4().hex}"}})
    done = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or done == 0:
        config = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex}"}}
        graph.invoke({"left": STEPS, "log": []}, config)
        done += STEPS
    return done / (time.perf_counter() - began)


def _fill(saver: Any, thread_id: str, count: int) -> dict:
    """Puts ``count`` checkpoints (each with one write) on ``thread_id``; returns the last config."""
    from langgraph.checkpoint.base import empty_checkpoint

    config: dict = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    version: Any = None
    for step in range(count):
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"text": TEXT, "left": step}
        checkpoint["channel_versions"] = {"text": version, "left": version}
        config = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}},
                           {"text": version, "left": version})
        saver.put_writes(config, [("log", f"w{step}")], f"task-{step}")
    return config


def _rates(ours: Any, theirs: Any, seconds: float, rounds: int) -> tuple[float, float]:
    """Supersteps/s of each saver from the round whose ratio (ours / theirs) is the median of ``rounds`` rounds.

    Each round measures both savers for ``seconds`` each, one after the other, the first alternating between
    rounds: load from elsewhere touches both alike, and a burst of it spoils one round's ratio, not the figure.
    ``rounds`` is odd, so the median is one round's, and both figures shown are that round's own.
    """
    pairs = []
    for index in range(rounds):
        if index % 2 == 0:
            mine = _supersteps(ours, seconds)
            other = _supersteps(theirs, seconds)
        else:
            other = _supersteps(theirs, seconds)
            mine = _supersteps(ours, seconds)
        pairs.append((mine / other, mine, other))
    pairs.sort()
    _ratio, mine, other = pairs[len(pairs) // 2]
    return mine, other


def _latency_rows(
    label: str, ours: Any, theirs: Any, their_label: str, settings: Settings,
    settle: Callable[[], None] = lambda: None,
) -> list[Row]:
    rows = []
    sizes = (100, 1_000 if settings.quick else 10_000)
    samples = 30 if settings.quick else 200
    medians: dict[tuple[str, int], float] = {}
    for size in sizes:
        thread = f"lat-{size}-{uuid.uuid4().hex[:8]}"
        _fill(ours, thread, size)
        _fill(theirs, thread, size)
        settle()
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        calls: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "get_tuple": (lambda c=config: ours.get_tuple(c), lambda c=config: theirs.get_tuple(c)),
            "list(limit=100)": (lambda c=config: list(ours.list(c, limit=100)),
                                lambda c=config: list(theirs.list(c, limit=100))),
        }
        for name, (mine, other) in calls.items():
            value, baseline = paired_median_us(mine, other, samples, budget_s=2.0 if settings.quick else 10.0)
            medians[(name, size)] = value
            rows.append(Row(
                section="langgraph", measure=f"{name} median, {size:,} checkpoints ({label})", value=value,
                baseline=baseline, baseline_label=their_label, unit="µs",
                note="latency rows: one thread of N checkpoints, each with one pending write, in both savers",
            ))
    for name in ("get_tuple", "list(limit=100)"):
        small, large = medians[(name, sizes[0])], medians[(name, sizes[1])]
        rows.append(Row(
            section="langgraph", measure=f"{name}: {sizes[1]:,} vs 100 checkpoints ({label}, ours)", value=large,
            baseline=small, baseline_label="ours at 100 checkpoints", unit="µs", goal="≤ 1.5× (flat)",
            met=large / small <= 1.5 if small else None,
        ))
    return rows


def _step_row(label: str, ours_saver: Any, theirs_saver: Any, their_label: str, settings: Settings) -> Row:
    rounds = QUICK_ROUNDS if settings.quick else ROUNDS
    ours, theirs = _rates(ours_saver, theirs_saver, settings.seconds / 2, rounds)
    return Row(
        section="langgraph", measure=f"graph supersteps/s ({label})", value=ours, baseline=theirs,
        baseline_label=their_label, unit="/s", goal=f"≥ {GOAL}×", met=ours / theirs >= GOAL if theirs else None,
        note=f"graph rows: one compiled StateGraph, {STEPS} supersteps per invoke on a fresh thread, default "
             "durability; ours claims each thread at its first write (fencing) and releases it when idle; "
             f"{rounds} rounds of both savers in turn (which goes first alternates), the round with the median "
             "ratio shown",
    )


def _sqlite_rows(settings: Settings) -> list[Row]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from threadloom.langgraph import ThreadloomSaver

    ours = ThreadloomSaver.from_url(f"sqlite:///{settings.workdir / 'lg-ours.db'}")
    conn = sqlite3.connect(settings.workdir / "lg-theirs.db", check_same_thread=False)
    theirs = SqliteSaver(conn)
    theirs.setup()
    try:
        rows = [_step_row("sqlite", ours, theirs, "LangGraph SqliteSaver", settings)]
        return rows + _latency_rows("sqlite", ours, theirs, "LangGraph SqliteSaver", settings)
    finally:
        ours.close()
        conn.close()
        for name in ("lg-ours.db", "lg-ours.db-wal", "lg-ours.db-shm", "lg-theirs.db"):
            (settings.workdir / name).unlink(missing_ok=True)


def _postgres_rows(settings: Settings, url: str) -> list[Row]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import sql
    from psycopg.rows import dict_row

    from threadloom.langgraph import ThreadloomSaver
    from threadloom.persistence.postgres.config import PostgresCheckpointerConfig

    stem = f"tl_bench_lg_{uuid.uuid4().hex[:10]}"
    ours_schema, their_schema = stem, f"{stem}_lg"
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(their_schema)))
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row, connect_timeout=10,
                           options=f"-c search_path={their_schema}")
    ours = None
    try:
        theirs = PostgresSaver(conn)
        theirs.setup()
        ours = ThreadloomSaver.from_url(url, config=PostgresCheckpointerConfig(schema=ours_schema))
        rows = [_step_row("postgres", ours, theirs, "LangGraph PostgresSaver", settings)]

        def vacuum() -> None:
            # Each checkpoint replaces the previous one's pending writes in both savers: measure the steady state
            # autovacuum keeps, not the dead rows of a fill that just ended.
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
                for schema in (ours_schema, their_schema):
                    tables = admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
                    for (table,) in tables.fetchall():
                        admin.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(sql.Identifier(schema),
                                                                             sql.Identifier(table)))

        return rows + _latency_rows("postgres", ours, theirs, "LangGraph PostgresSaver", settings, vacuum)
    finally:
        if ours is not None:
            ours.close()
        conn.close()
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as admin:
            for schema in (ours_schema, their_schema):
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def run(settings: Settings) -> list[Row]:
    """The section's rows (SQLite always; PostgreSQL when ``THREADLOOM_BENCH_PG`` is set)."""
    try:
        import langgraph.checkpoint.sqlite  # noqa: F401
        import langgraph.graph  # noqa: F401
    except ImportError as error:
        raise SectionUnavailable(
            f"needs LangGraph and langgraph-checkpoint-sqlite (pip install -e '.[langgraph]' "
            f"langgraph-checkpoint-sqlite): {error}"
        ) from None
    restore = quiet_logs()
    try:
        rows = _sqlite_rows(settings)
        url = os.environ.get(PG_ENV, "").strip()
        if url:
            try:
                import langgraph.checkpoint.postgres  # noqa: F401
            except ImportError:
                return rows
            rows += _postgres_rows(settings, url)
        return rows
    finally:
        restore()


SECTION = Section(
    name="langgraph",
    title="one compiled LangGraph StateGraph: ThreadloomSaver vs SqliteSaver / PostgresSaver; get_tuple, list",
    run=run,
    order=60,
)
