"""Section ``postgres``: fenced commits/s against LangGraph's ``PostgresSaver`` and raw INSERTs; wake latency; reads.

Runs only when ``THREADLOOM_BENCH_PG`` names a PostgreSQL database (a ``postgresql://`` URL) the benchmark may
create schemas in. Everything it writes lives in throwaway schemas of its own (``tl_bench_<random>`` and two
siblings), dropped at the end.

**Commits.** A *commit* is the SQLite section's: a new checkpoint on the writer's thread (about 2.5 KB of JSON
state), one pending write and one event, fenced by the writer's claim, through ``PostgresCheckpointer``. Writers:
1 (a pool of one connection) and 8 threads each committing to a thread of its own (a pool of 8). Two baselines,
each in the same run and alternated with ours:

* LangGraph's ``PostgresSaver`` persisting the same step the way LangGraph does: ``put`` of a checkpoint whose
  channels hold the same state (all three channels new, so their values are written as blobs) and
  ``put_writes`` of one write. 1 writer: one saver on one connection (as ``from_conn_string`` makes it). 8
  writers: the better of one saver over a ``ConnectionPool`` of 8 (LangGraph's documented way to share one) and
  8 savers on a connection each (the most it can do). When ``langgraph.checkpoint.postgres`` is not importable
  the row says so and the section goes on.
* Raw psycopg: one ``INSERT`` of a 2.5 KB text row per transaction (autocommit: one round trip and one
  ``COMMIT``, the cheapest durable write), on 1 connection and on 8.

**Wake latency.** Two stores on one schema, as two processes would be: a waiter on store B blocks in
``await_events_after``; store A commits a step with one event; the latency is from the start of A's ``commit``
to B's waiter returning the event (p50 and p99). Baseline: the floor of any ``LISTEN``/``NOTIFY`` design, on raw
connections: one statement inserting a row and calling ``pg_notify`` on connection A, the listener on
connection B receiving the notification and selecting the row.

**Reads.** The median of ``latest`` and of ``history(limit=100)`` on a thread of 10,000 checkpoints (2,000 with
``--quick``) against one of 100; the goal is a flat ratio. The long history is written with
``synchronous_commit=off`` on the filling session (durability does not matter for data the benchmark drops).
Every commit rewrites the thread's row and replaces its pending writes, so that burst of commits leaves as many
dead row versions behind until autovacuum comes by: ``latest`` is first measured right after the burst (reported),
then both reads after ``VACUUM (ANALYZE)`` of the schema, the state autovacuum keeps a database in (goal: flat).
``history(limit=100)`` is also put against the raw ``SELECT body … ORDER BY pos DESC LIMIT 100`` of the same rows
on a plain psycopg connection (the text fetched, nothing decoded), at 100 and at 10,000 checkpoints (goal ≤ 2×),
and the same raw SELECT followed by a JSON parse of each body into plain values is reported against it (the floor
of any reader that builds Python values of the rows). A checkpoint read decodes its state only when ``state`` is
first read, so ``history(limit=100)`` followed by reading all 100 states is reported against the raw SELECT too.
"""

from __future__ import annotations

import math
import os
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from bench_sqlite import RAW_ROW, LangGraphStep, committer
from benchlib import Row, Section, SectionUnavailable, Settings, paired_median_us, quiet_logs, throughput

PG_ENV = "THREADLOOM_BENCH_PG"
"""The PostgreSQL URL the section runs against; unset, the section is skipped."""
LANGGRAPH_GOAL = 1.5
"""Our commits/s at least this multiple of LangGraph's steps/s."""
RAW_GOAL = 0.6
"""Our commits/s at least this share of raw INSERT+COMMIT/s."""
WAKE_P99_GOAL_US = 10_000.0
"""Cross-store wake latency p99 at most this (µs)."""
FLAT_GOAL = 1.5
RAW_READ_GOAL = 2.0
"""``history(limit=100)`` at most this multiple of the raw ``SELECT … LIMIT 100`` of the same rows."""
RAW_HISTORY = "SELECT body FROM checkpoints WHERE thread_id = %s ORDER BY pos DESC LIMIT 100"
WRITERS = (1, 8)
ROUNDS = 2
LANGGRAPH_MISSING = "not installed (pip install langgraph-checkpoint-postgres)"


def _url() -> str:
    url = os.environ.get(PG_ENV, "").strip()
    if not url:
        raise SectionUnavailable(f"set {PG_ENV}=postgresql://… to run it (it uses throwaway schemas)")
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as error:
        raise SectionUnavailable(f"the postgres extra is not installed ({error})") from error
    return url


def _scrub(url: str, text: str) -> str:
    """``text`` without the URL's password (a driver's message may quote the connection string)."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password, unquote(password)} if password else ():
        text = text.replace(secret, "***")
    return text


def _connect(url: str, schema: str | None = None, **kwargs):
    import psycopg

    if schema is not None:
        kwargs["options"] = f"-c search_path={schema}"  # our own generated identifier (see _schemas)
    return psycopg.connect(url, connect_timeout=10, **kwargs)


def _drop(url: str, schemas: list[str]) -> None:
    from psycopg import sql

    with _connect(url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _create(url: str, schema: str) -> None:
    from psycopg import sql

    with _connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


# -- the three writers -----------------------------------------------------------------------------------------


def open_ours(url: str, schema: str, connections: int):
    """A ``PostgresCheckpointer`` on ``schema`` over a pool of ``connections`` connections (opened up front)."""
    from threadloom import PostgresCheckpointer, PostgresCheckpointerConfig

    config = PostgresCheckpointerConfig(schema=schema, min_size=connections, max_size=connections,
                                        connect_timeout=timedelta(seconds=30))
    return PostgresCheckpointer.open(url, config)


def raw_writer(url: str, schema: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """A raw autocommit connection and an operation inserting one 2.5 KB row; returns ``(op, close)``."""
    conn = _connect(url, schema, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS bench (id bigserial PRIMARY KEY, body text NOT NULL)")

    def op() -> None:
        conn.execute("INSERT INTO bench (body) VALUES (%s)", (RAW_ROW,))

    return op, conn.close


def langgraph_available() -> bool:
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        return False
    return True


def _langgraph_connection(url: str, schema: str):
    from psycopg.rows import dict_row

    # What PostgresSaver.from_conn_string opens, in the benchmark's schema.
    return _connect(url, schema, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def langgraph_savers(url: str, schema: str, writers: int, shared: bool):
    """``writers`` operations over PostgresSaver(s) on ``schema``, and what closes them.

    ``shared``: one saver over a ``ConnectionPool`` of ``writers`` connections; else one saver per connection.
    """
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    closers: list[Callable[[], None]] = []
    if shared:
        pool = ConnectionPool(
            url, min_size=writers, max_size=writers, open=True, timeout=30,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row,
                    "options": f"-c search_path={schema}", "connect_timeout": 10},
        )
        pool.wait(timeout=30)
        closers.append(pool.close)
        saver = PostgresSaver(pool)
        savers = [saver] * writers
    else:
        savers = []
        for _ in range(writers):
            conn = _langgraph_connection(url, schema)
            closers.append(conn.close)
            savers.append(PostgresSaver(conn))
    return savers, lambda: [close() for close in closers]


def langgraph_setup(url: str, schema: str) -> None:
    """Creates LangGraph's tables in ``schema`` (``PostgresSaver.setup``)."""
    from langgraph.checkpoint.postgres import PostgresSaver

    with _langgraph_connection(url, schema) as conn:
        PostgresSaver(conn).setup()


# -- commit rows -----------------------------------------------------------------------------------------------


class _Run:
    """One benchmark run's schemas and names (fresh threads per measurement)."""

    def __init__(self, url: str) -> None:
        self.url = url
        stem = f"tl_bench_{uuid.uuid4().hex[:12]}"
        self.ours, self.langgraph, self.raw = stem, f"{stem}_lg", f"{stem}_raw"
        self._names = iter(range(1_000_000))

    def name(self, kind: str) -> str:
        return f"{kind}-{next(self._names)}"


def _ours_rate(run: _Run, writers: int, seconds: float) -> float:
    store = open_ours(run.url, run.ours, writers)
    try:
        prefix = run.name("w")
        return throughput(writers, seconds, lambda i: committer(store, f"{prefix}-{i}"))
    finally:
        store.close()


def _raw_rate(run: _Run, writers: int, seconds: float) -> float:
    closers: list[Callable[[], None]] = []

    def make(_i: int) -> Callable[[], None]:
        op, close = raw_writer(run.url, run.raw)
        closers.append(close)
        return op

    try:
        return throughput(writers, seconds, make)
    finally:
        for close in closers:
            close()


def _langgraph_rate(run: _Run, writers: int, seconds: float, shared: bool) -> float:
    savers, close = langgraph_savers(run.url, run.langgraph, writers, shared)
    try:
        prefix = run.name("lg")
        return throughput(writers, seconds, lambda i: LangGraphStep(savers[i], f"{prefix}-{i}"))
    finally:
        close()


def _commit_rows(run: _Run, settings: Settings) -> list[Row]:
    have_langgraph = langgraph_available()
    _create(run.url, run.raw)
    if have_langgraph:
        _create(run.url, run.langgraph)
        langgraph_setup(run.url, run.langgraph)
    rows: list[Row] = []
    for writers in WRITERS:
        sides: dict[str, Callable[[], float]] = {
            "ours": lambda w=writers: _ours_rate(run, w, settings.seconds),
            "raw": lambda w=writers: _raw_rate(run, w, settings.seconds),
        }
        if have_langgraph:
            sides["lg-own"] = lambda w=writers: _langgraph_rate(run, w, settings.seconds, shared=False)
            if writers > 1:
                sides["lg-shared"] = lambda w=writers: _langgraph_rate(run, w, settings.seconds, shared=True)
        best = dict.fromkeys(sides, 0.0)
        for round_ in range(ROUNDS):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for side in order:
                best[side] = max(best[side], sides[side]())
        ours = best["ours"]
        who = _plural(writers, "writer")
        note = (
            f"postgres commits: a checkpoint with {len(RAW_ROW):,} B of JSON state + 1 pending write + 1 event, "
            f"fenced; LangGraph: put (the same state as 3 channels, written as blobs) + put_writes (1 write); raw: "
            f"one {len(RAW_ROW):,} B text row per autocommit INSERT. Best of {ROUNDS} alternating rounds of "
            f"{settings.seconds:g} s; 8 writers = 8 threads, each on a thread of its own."
        )
        if have_langgraph:
            if writers == 1:
                lg, lg_label = best["lg-own"], "LangGraph PostgresSaver put+put_writes, 1 connection"
            else:
                lg = max(best["lg-own"], best["lg-shared"])
                how = "8 savers × 1 connection" if best["lg-own"] >= best["lg-shared"] else "1 saver on a pool of 8"
                lg_label = (f"LangGraph PostgresSaver put+put_writes, {who} (best: {how}; other "
                            f"{min(best['lg-own'], best['lg-shared']):,.0f}/s)")
            rows.append(Row(
                section="postgres", measure=f"fenced commits/s, {who}", value=ours, baseline=lg,
                baseline_label=lg_label, unit="/s", goal=f"≥ {LANGGRAPH_GOAL}×",
                met=ours / lg >= LANGGRAPH_GOAL if lg else None, note=note,
            ))
        else:
            rows.append(Row(
                section="postgres", measure=f"fenced commits/s, {who}", value=ours, baseline=math.nan,
                baseline_label=f"LangGraph PostgresSaver: {LANGGRAPH_MISSING}", unit="/s",
                goal=f"≥ {LANGGRAPH_GOAL}×", met=None, note=note,
            ))
        rows.append(Row(
            section="postgres", measure=f"fenced commits/s, {who}", value=ours, baseline=best["raw"],
            baseline_label=f"raw psycopg INSERT+COMMIT, {_plural(writers, 'connection')}", unit="/s",
            goal=f"≥ {RAW_GOAL}×", met=ours / best["raw"] >= RAW_GOAL if best["raw"] else None, note=note,
        ))
    return rows


# -- wake latency ----------------------------------------------------------------------------------------------


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


class _Waiter:
    """A thread that runs ``wait(arg)`` for each request and reports the ``perf_counter_ns`` it returned at."""

    def __init__(self, wait: Callable[[object], object]) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()
        self._wait = wait
        self._thread = threading.Thread(target=self._loop, name="bench-waiter", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            arg = self._requests.get()
            if arg is None:
                return
            try:
                result = self._wait(arg)
                self._answers.put((time.perf_counter_ns(), result, None))
            except BaseException as error:  # noqa: BLE001 - handed to the measuring thread
                self._answers.put((time.perf_counter_ns(), None, error))

    def ask(self, arg: object) -> None:
        self._requests.put(arg)

    def answer(self, timeout: float = 30.0) -> tuple[int, object]:
        at, result, error = self._answers.get(timeout=timeout)
        if error is not None:
            raise error
        return at, result

    def stop(self) -> None:
        self._requests.put(None)
        self._thread.join(10)


SETTLE_S = 0.003
"""How long the measuring thread lets the waiter settle into its wait before it commits."""


def _wake_ours(run: _Run, samples: int, *, metered: bool = False) -> list[float]:
    """Latencies (µs) from the start of a commit on store A to the waiter on store B returning its event.

    With ``metered``, both stores are wrapped in ``MeteredCheckpointer`` (issue: the wrapper keeps the wake-up).
    """
    a, b = open_ours(run.url, run.ours, 1), open_ours(run.url, run.ours, 1)
    if metered:
        from threadloom.persistence.metrics.meter import InMemoryMeter
        from threadloom.persistence.metrics.metered import MeteredCheckpointer

        meter = InMemoryMeter()
        a, b = MeteredCheckpointer(a, meter), MeteredCheckpointer(b, meter)
    thread_id = run.name("wake-metered" if metered else "wake")
    op = committer(a, thread_id)
    seq = [0]

    def wait(after: object) -> object:
        found = b.await_events_after(thread_id, int(after), 10, timedelta(seconds=10))
        if not found:
            raise RuntimeError("the waiter on store B was not woken within 10 s")
        return found[-1].seq

    waiter = _Waiter(wait)
    try:
        latencies = []
        for index in range(samples + 5):  # the first 5 warm up (the listener connects on the first wait)
            waiter.ask(seq[0])
            time.sleep(SETTLE_S)
            began = time.perf_counter_ns()
            op()
            at, last = waiter.answer()
            seq[0] = int(last)
            if index >= 5:
                latencies.append((at - began) / 1000)
        return latencies
    finally:
        waiter.stop()
        a.close()
        b.close()


def _wake_raw(run: _Run, samples: int) -> list[float]:
    """Latencies (µs) from an INSERT + pg_notify statement on connection A to connection B holding the row."""
    from psycopg import sql

    channel = f"{run.raw}_wake"
    writer = _connect(run.url, run.raw, autocommit=True)
    listener = _connect(run.url, run.raw, autocommit=True)
    writer.execute("CREATE TABLE IF NOT EXISTS wake (id bigserial PRIMARY KEY, body text NOT NULL)")
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    insert = ("WITH row AS (INSERT INTO wake (body) VALUES (%s) RETURNING id) "
              "SELECT pg_notify(%s, id::text) FROM row")

    def wait(_arg: object) -> object:
        notes = list(listener.notifies(timeout=10, stop_after=1))  # the generator holds the connection: end it first
        if not notes:
            raise RuntimeError("the raw listener was not notified within 10 s")
        return listener.execute("SELECT body FROM wake WHERE id = %s", (int(notes[-1].payload),)).fetchone()

    waiter = _Waiter(wait)
    try:
        latencies = []
        for index in range(samples + 5):
            waiter.ask(index)
            time.sleep(SETTLE_S)
            began = time.perf_counter_ns()
            writer.execute(insert, (RAW_ROW, channel))
            at, _row = waiter.answer()
            if index >= 5:
                latencies.append((at - began) / 1000)
        return latencies
    finally:
        waiter.stop()
        writer.close()
        listener.close()


def _wake_rows(run: _Run, settings: Settings) -> list[Row]:
    samples = 60 if settings.quick else 300
    ours, raw = _wake_ours(run, samples), _wake_raw(run, samples)
    note = (
        f"postgres wake: {samples} samples; from the start of a commit (1 event) on store A to await_events_after "
        "returning it on store B (same schema, as two processes); raw: one INSERT…pg_notify statement on "
        "connection A to LISTEN on connection B receiving it and SELECTing the row."
    )
    p50, p99 = (statistics.median(ours), _percentile(ours, 0.99))
    raw50, raw99 = (statistics.median(raw), _percentile(raw, 0.99))
    # The metered wrapper must keep the store's own LISTEN wake-up: measured right after the bare store.
    metered = _wake_ours(run, samples, metered=True)
    m50, m99 = statistics.median(metered), _percentile(metered, 0.99)
    return [
        Row(section="postgres", measure="wake latency p50, metered store A → metered waiter on B", value=m50,
            baseline=p50, baseline_label="the bare stores, p50 (same run)", unit="µs",
            goal="≤ 1.1×", met=m50 <= 1.1 * p50, note=note),
        Row(section="postgres", measure="wake latency p99, metered store A → metered waiter on B", value=m99,
            baseline=p99, baseline_label="the bare stores, p99 (same run)", unit="µs",
            goal="report", note=note),
        Row(section="postgres", measure="wake latency p50, commit on store A → waiter on store B", value=p50,
            baseline=raw50, baseline_label="raw INSERT+pg_notify → LISTEN+SELECT, p50", unit="µs",
            goal="report", note=note),
        Row(section="postgres", measure="wake latency p99, commit on store A → waiter on store B", value=p99,
            baseline=raw99, baseline_label="raw INSERT+pg_notify → LISTEN+SELECT, p99", unit="µs",
            goal=f"p99 ≤ {WAKE_P99_GOAL_US / 1000:g} ms", met=p99 <= WAKE_P99_GOAL_US, note=note),
    ]


# -- reads -----------------------------------------------------------------------------------------------------


def _fill(run: _Run, sizes: dict[str, int]) -> None:
    """Commits ``sizes[thread]`` checkpoints to each thread, on a session with ``synchronous_commit=off``."""
    from psycopg_pool import ConnectionPool

    from threadloom import PostgresCheckpointer, PostgresCheckpointerConfig

    pool = ConnectionPool(run.url, min_size=1, max_size=1, open=True, timeout=30,
                          kwargs={"autocommit": True, "options": "-c synchronous_commit=off", "connect_timeout": 10})
    try:
        with PostgresCheckpointer.create(pool, PostgresCheckpointerConfig(schema=run.ours)) as store:
            for thread_id, size in sizes.items():
                op = committer(store, thread_id)
                for _ in range(size):
                    op()
    finally:
        pool.close()


def _vacuum(run: _Run) -> None:
    """``VACUUM (ANALYZE)`` of every table in the store's schema: the state autovacuum keeps a database in."""
    from psycopg import sql

    with _connect(run.url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (run.ours,)
        ).fetchall()]
        for table in tables:
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}.{}").format(sql.Identifier(run.ours), sql.Identifier(table)))


def _latency_rows(run: _Run, settings: Settings) -> list[Row]:
    from threadloom.persistence.codec import loads

    small, big = 100, (2_000 if settings.quick else 10_000)
    samples = 200 if settings.quick else 1_000
    short, long_ = run.name("short"), run.name("long")
    _fill(run, {short: small, long_: big})
    reads = (("latest", lambda store, t: store.latest(t)),
             ("history(limit=100)", lambda store, t: store.history(t, limit=100)))
    rows = []
    store = open_ours(run.url, run.ours, 1)
    try:
        fast, slow = paired_median_us(lambda: store.latest(short), lambda: store.latest(long_), samples,
                                      budget_s=2 * settings.seconds)
        rows.append(Row(
            section="postgres", measure=f"latest median, {big:,}-checkpoint thread, just written (before VACUUM)",
            value=slow, baseline=fast, baseline_label=f"latest median, {small}-checkpoint thread, just written",
            unit="µs", goal="report",
            note=(
                "postgres reads: every commit rewrites the thread's row and replaces its pending writes, so a burst "
                f"of {big:,} commits on one thread leaves as many dead row versions until (auto)vacuum; the flat "
                "rows are measured after VACUUM (ANALYZE) of the schema, the state autovacuum keeps it in."
            ),
        ))
        _vacuum(run)
        for name, read in reads:
            fast, slow = paired_median_us(
                lambda r=read: r(store, short), lambda r=read: r(store, long_), samples, budget_s=2 * settings.seconds
            )
            rows.append(Row(
                section="postgres", measure=f"{name} median, {big:,}-checkpoint thread", value=slow, baseline=fast,
                baseline_label=f"{name} median, {small}-checkpoint thread", unit="µs", goal=f"flat (≤ {FLAT_GOAL}×)",
                met=slow / fast <= FLAT_GOAL if fast else None,
            ))
        with _connect(run.url, run.ours, autocommit=True) as raw:
            for thread_id, size in ((short, small), (long_, big)):
                ours, baseline = paired_median_us(
                    lambda t=thread_id: store.history(t, limit=100),
                    lambda t=thread_id: raw.execute(RAW_HISTORY, (t,)).fetchall(),
                    samples, budget_s=2 * settings.seconds,
                )
                rows.append(Row(
                    section="postgres", measure=f"history(limit=100) median, {size:,}-checkpoint thread",
                    value=ours, baseline=baseline, unit="µs", goal=f"≤ {RAW_READ_GOAL:g}×",
                    baseline_label=f"raw SELECT body … LIMIT 100 (psycopg, no decoding), {size:,}-checkpoint thread",
                    met=ours <= RAW_READ_GOAL * baseline if baseline else None,
                ))
            every, baseline = paired_median_us(  # what the lazily decoded states cost once a caller reads them all
                lambda: [cp.state for cp in store.history(long_, limit=100)],
                lambda: raw.execute(RAW_HISTORY, (long_,)).fetchall(),
                samples, budget_s=2 * settings.seconds,
            )
            rows.append(Row(
                section="postgres",
                measure=f"history(limit=100) + reading every state, {big:,}-checkpoint thread",
                value=every, baseline=baseline, unit="µs", goal="report",
                baseline_label=f"raw SELECT body … LIMIT 100 (psycopg, no decoding), {big:,}-checkpoint thread",
                note=("postgres reads: a checkpoint read keeps its state as the stored JSON text and decodes it when "
                      "state is first read; the + reading every state row reads each of the 100 (what the "
                      "history(limit=100) rows leave out)."),
            ))
            parsed, baseline = paired_median_us(  # the floor of any reader building Python values of the rows
                lambda: [loads(row[0]) for row in raw.execute(RAW_HISTORY, (long_,)).fetchall()],
                lambda: raw.execute(RAW_HISTORY, (long_,)).fetchall(),
                samples, budget_s=2 * settings.seconds,
            )
            rows.append(Row(
                section="postgres",
                measure=f"raw SELECT … LIMIT 100 + JSON parse of each body, {big:,}-checkpoint thread",
                value=parsed, baseline=baseline, unit="µs", goal="report",
                baseline_label=f"raw SELECT body … LIMIT 100 (psycopg, no decoding), {big:,}-checkpoint thread",
                note=("postgres reads: the JSON parse row is the store's own C reader (codec.loads) building plain "
                      "values of the 100 bodies, no checkpoint: the floor under history(limit=100)'s ratio."),
            ))
    finally:
        store.close()
    return rows


def run(settings: Settings) -> list[Row]:
    """The PostgreSQL section's rows: commits/s (1 and 8 writers) against LangGraph and raw, wake latency, reads."""
    url = _url()
    bench = _Run(url)
    try:
        _create(url, bench.ours)
    except Exception as error:  # noqa: BLE001 - reported as the reason the section cannot run
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        reason = _scrub(url, f"{type(error).__name__}: {first[:200]}")
        raise SectionUnavailable(f"cannot reach the PostgreSQL server {PG_ENV} names ({reason})") from None
    restore = quiet_logs()
    try:
        return _commit_rows(bench, settings) + _wake_rows(bench, settings) + _latency_rows(bench, settings)
    finally:
        restore()
        _drop(url, [bench.ours, bench.langgraph, bench.raw])


SECTION = Section(
    name="postgres",
    title="fenced commits/s vs LangGraph's PostgresSaver and raw INSERTs; wake latency; latest/history latency",
    run=run,
    order=20,
)
