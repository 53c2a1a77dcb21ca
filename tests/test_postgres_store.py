"""PostgresCheckpointer beyond the contract suite: configuration, construction, migrations, the database clock,
LISTEN/NOTIFY wake-ups, error mapping and query plans (seeds 003; DESIGN §3 "Stores").

Everything runs against the real server named by THREADLOOM_TEST_PG (skipped loudly when unreachable, failed
under CI=true), except the configuration and error-mapping cases, which need no server.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import quote

import attrs
import psycopg
import psycopg_pool
import pytest
import structlog

from threadloom import (
    CancelledError,
    Checkpoint,
    CheckpointStatus,
    ClaimRequest,
    Commit,
    EventDraft,
    OutcomeUnknown,
    PostgresCheckpointer,
    PostgresCheckpointerConfig,
    ProcessingError,
    StaleClaim,
    StoreClosed,
    StoreCorrupt,
    StoreUnavailable,
    ThreadDeleted,
    ThreadloomError,
    ThreadQuery,
    ThreadStatus,
    ValidationError,
    open_store,
)
from threadloom.persistence.postgres.errors import map_error
from threadloom.testing.postgres_harness import (
    PgHarness,
    drop_schema,
    new_schema_name,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def harness():
    harness = PgHarness()
    try:
        yield harness
    finally:
        harness.cleanup()


def checkpoint(thread_id: str, cp_id: str, parent: str | None, *, run: str = "run-1", **fields) -> Checkpoint:
    return Checkpoint(
        id=cp_id, parent=parent, thread_id=thread_id, run_id=run, status=CheckpointStatus.RUNNING, created_at=NOW,
        **fields,
    )


def event(kind: str = "step", run: str = "run-1") -> EventDraft:
    return EventDraft(run_id=run, type=kind, timestamp=NOW, payload={"kind": kind})


def claim(store, thread_id: str, holder: str = "run-1", tenant: str | None = None):
    return store.claim(thread_id, ClaimRequest(holder=holder, ttl=timedelta(minutes=5), tenant_id=tenant))


# -- configuration (no server) --------------------------------------------------------------------------------------


def test_config_defaults_match_the_design() -> None:
    config = PostgresCheckpointerConfig()
    assert (config.schema, config.min_size, config.max_size) == ("threadloom", 1, 10)
    assert config.connect_timeout == timedelta(seconds=5)
    assert config.call_timeout == timedelta(seconds=10)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"schema": "x; DROP TABLE y"}, "config.schema"),
        ({"schema": '"quoted"'}, "config.schema"),
        ({"schema": "1abc"}, "config.schema"),
        ({"schema": "pg_catalog"}, "config.schema"),
        ({"schema": "PG_Toast"}, "config.schema"),
        # Found by hostile testing: the store's tables were created in the system schema.
        ({"schema": "information_schema"}, "config.schema"),
        ({"schema": "Information_Schema"}, "config.schema"),
        ({"schema": "a" * 64}, "config.schema"),
        ({"schema": ""}, "config.schema"),
        ({"schema": 7}, "config.schema"),
        ({"min_size": -1}, "config.min_size"),
        ({"max_size": 0}, "config.max_size"),
        ({"min_size": 5, "max_size": 2}, "config.max_size"),
        ({"min_size": True}, "config.min_size"),
        ({"connect_timeout": timedelta(0)}, "config.connect_timeout"),
        ({"call_timeout": 10}, "config.call_timeout"),
        # Found by hostile testing: the server takes the call limits in int4 milliseconds (about 24.8 days), and
        # a call timeout of a microsecond made open an unknown outcome.
        ({"call_timeout": timedelta.max}, "config.call_timeout"),
        ({"call_timeout": timedelta(days=1, microseconds=1)}, "config.call_timeout"),
        ({"call_timeout": timedelta(days=25)}, "config.call_timeout"),
        ({"call_timeout": timedelta(microseconds=1)}, "config.call_timeout"),
        ({"call_timeout": timedelta(milliseconds=9)}, "config.call_timeout"),
        ({"connect_timeout": timedelta(minutes=10, microseconds=1)}, "config.connect_timeout"),
        ({"connect_timeout": timedelta.max}, "config.connect_timeout"),
        ({"connect_timeout": timedelta(microseconds=1)}, "config.connect_timeout"),
    ],
)
def test_config_refuses_bad_fields_naming_them(changes, field) -> None:
    with pytest.raises(ValidationError) as info:
        PostgresCheckpointerConfig(**changes)
    assert info.value.field == field


def test_config_takes_the_timeouts_at_their_bounds() -> None:
    from threadloom.persistence.postgres.config import (
        MAX_CALL_TIMEOUT,
        MAX_CONNECT_TIMEOUT,
        MIN_CALL_TIMEOUT,
        MIN_CONNECT_TIMEOUT,
    )

    assert (MIN_CALL_TIMEOUT, MAX_CALL_TIMEOUT) == (timedelta(milliseconds=10), timedelta(days=1))
    assert (MIN_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT) == (timedelta(milliseconds=10), timedelta(minutes=10))
    for call, connect in ((MIN_CALL_TIMEOUT, MIN_CONNECT_TIMEOUT), (MAX_CALL_TIMEOUT, MAX_CONNECT_TIMEOUT)):
        config = PostgresCheckpointerConfig(call_timeout=call, connect_timeout=connect)
        assert (config.call_timeout, config.connect_timeout) == (call, connect)
    settings = PostgresCheckpointer.session_settings(PostgresCheckpointerConfig(call_timeout=MAX_CALL_TIMEOUT))
    assert "statement_timeout = 86400000;" in settings  # fits the server's int4 milliseconds


def test_the_longest_call_timeout_is_taken_by_the_server(harness: PgHarness) -> None:
    store = harness.open_pg(call_timeout=timedelta(days=1), connect_timeout=timedelta(minutes=10))
    token = claim(store, "t").token
    assert [e.seq for e in store.commit("t", Commit(token=token, events=[event()]))] == [1]
    with store.pool.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1d",)


def test_channel_is_derived_from_the_schema_and_fits_an_identifier() -> None:
    assert PostgresCheckpointerConfig(schema="app").channel == "threadloom.app"
    long = PostgresCheckpointerConfig(schema="s" * 63).channel
    assert len(long.encode()) <= 63 and long != PostgresCheckpointerConfig(schema="t" * 63).channel


def test_module_imports_without_psycopg() -> None:
    """``from threadloom import PostgresCheckpointer`` works without the postgres extra; open names the extra."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None
        sys.modules["psycopg_pool"] = None
        import threadloom
        from threadloom import PostgresCheckpointer, PostgresCheckpointerConfig, ProcessingError
        assert "PostgresCheckpointer" in threadloom.__all__ and "PostgresCheckpointerConfig" in threadloom.__all__
        PostgresCheckpointerConfig(schema="ok")
        try:
            PostgresCheckpointer.open("postgresql://nobody@127.0.0.1:1/x")
        except ProcessingError as error:
            assert "postgres extra" in str(error), error
        else:
            raise AssertionError("open without psycopg must fail")
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


# -- the one error-mapping function (no server) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, write, aborted, expected, words",
    [
        (psycopg.errors.LockNotAvailable("lock timeout"), True, None, StoreUnavailable, "lock"),
        (psycopg.errors.QueryCanceled("canceling statement"), True, None, StoreUnavailable, "cancelled the call"),
        (psycopg.errors.SerializationFailure("could not serialize"), True, None, StoreUnavailable, "conflicting"),
        (psycopg.errors.DeadlockDetected("deadlock"), True, None, StoreUnavailable, "conflicting"),
        (psycopg.errors.UndefinedTable("relation does not exist"), False, None, StoreCorrupt, "missing"),
        (psycopg.errors.InvalidSchemaName("schema does not exist"), False, None, StoreCorrupt, "missing"),
        (psycopg.errors.DiskFull("no space"), True, None, StoreUnavailable, "53100"),
        (psycopg.errors.AdminShutdown("terminating connection"), True, None, OutcomeUnknown, "lost"),
        (psycopg.errors.AdminShutdown("terminating connection"), False, None, StoreUnavailable, "lost"),
        (psycopg.errors.ConnectionFailure("connection failure"), True, None, OutcomeUnknown, "lost"),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True, None, OutcomeUnknown, "lost"),
        (psycopg.OperationalError("server closed the connection unexpectedly"), False, None, StoreUnavailable, "lost"),
        (psycopg.OperationalError("consuming input failed"), True, "timeout", OutcomeUnknown, "within 2 s"),
        (psycopg.OperationalError("consuming input failed"), False, "timeout", StoreUnavailable, "within 2 s"),
        (psycopg.OperationalError("consuming input failed"), False, "cancel", CancelledError, ""),
        (psycopg_pool.PoolTimeout("couldn't get a connection"), False, None, StoreUnavailable, "no database connection"),
        (psycopg_pool.PoolClosed("the pool is closed"), False, None, StoreClosed, "pool is closed"),
        (psycopg.errors.DataCorrupted("invalid page in block 0"), False, None, StoreCorrupt, "damaged"),
        (psycopg.errors.RaiseException("something else"), True, None, ProcessingError, "P0001"),
    ],
)
def test_map_error_classifies_by_sqlstate(error, write, aborted, expected, words) -> None:
    mapped = map_error(
        error, operation="commit", thread_id="t-1", write=write, aborted=aborted, call_timeout=timedelta(seconds=2)
    )
    assert type(mapped) is expected
    assert mapped.operation == "commit"
    if expected is not CancelledError:
        assert "'t-1'" in mapped.message and words in mapped.message


@pytest.mark.parametrize(
    "error, write, broken, answered, expected, words",
    [
        # Found by hostile testing: a value the driver could not convert was reported as a lost connection.
        (psycopg.DataError("timestamp too large (after year 10K)"), True, False, False, ProcessingError,
         "nothing was sent"),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL"), False, False, False, ProcessingError,
         "refused"),
        (psycopg.ProgrammingError("query has 2 placeholders but 1 parameters"), True, False, False, ProcessingError,
         "nothing was sent"),
        (psycopg.InterfaceError("cursor already closed"), True, False, False, ProcessingError, "nothing was sent"),
        (OverflowError("date value out of range"), True, None, False, ProcessingError, "nothing was sent"),
        (psycopg.DataError("timestamp too large (after year 10K)"), True, None, False, ProcessingError, "refused"),
        (psycopg.DataError("timestamp too large (after year 10K)"), False, False, True, StoreCorrupt,
         "could not be read"),
        (psycopg.DataError("timestamp too large (after year 10K)"), True, False, True, OutcomeUnknown,
         "answer could not be read"),
        (psycopg.OperationalError("consuming input failed"), True, True, False, OutcomeUnknown, "lost"),
        (psycopg.OperationalError("consuming input failed"), False, True, True, StoreUnavailable, "lost"),
        (psycopg.InterfaceError("the connection is lost"), True, True, False, OutcomeUnknown, "lost"),
        (psycopg.errors.UndefinedFunction("function tl_claim(text, numeric) does not exist"), True, False, False,
         StoreCorrupt, "do not match this version"),
        (psycopg.errors.UndefinedColumn("column x does not exist"), False, False, False, StoreCorrupt,
         "do not match this version"),
    ],
)
def test_map_error_tells_a_client_side_error_from_a_lost_connection(
    error, write, broken, answered, expected, words
) -> None:
    mapped = map_error(
        error, operation="commit", thread_id="t-1", write=write, broken=broken, answered=answered,
        call_timeout=timedelta(seconds=2),
    )  # fmt: skip
    assert type(mapped) is expected, mapped
    assert "'t-1'" in mapped.message and words in mapped.message, mapped.message
    if "lost" not in words:
        assert "lost" not in mapped.message and "dropped" not in mapped.message


def test_map_error_passes_our_errors_through_and_scrubs_secrets() -> None:
    ours = StaleClaim("t", 1, 2)
    assert map_error(ours, operation="commit", thread_id="t", write=True) is ours
    leaked = psycopg.errors.InternalError("password hunter2 was wrong")
    mapped = map_error(
        leaked, operation="claim", thread_id="t", write=True, scrub=lambda text: text.replace("hunter2", "***")
    )
    assert "hunter2" not in str(mapped) and "***" in str(mapped)


# -- construction ----------------------------------------------------------------------------------------------


def test_open_store_url_builds_a_postgres_store(harness: PgHarness) -> None:
    store = open_store(harness.dsn, config=harness.config())
    try:
        assert isinstance(store, PostgresCheckpointer)
        token = claim(store, "t").token
        assert [e.seq for e in store.commit("t", Commit(token=token, events=[event()]))] == [1]
    finally:
        store.close()


def test_create_over_the_callers_pool_leaves_it_open_and_as_it_was(harness: PgHarness) -> None:
    pool = psycopg_pool.ConnectionPool(harness.dsn, min_size=1, max_size=2, open=True)  # manual-commit connections
    try:
        store = PostgresCheckpointer.create(pool, harness.config())
        token = claim(store, "t").token
        store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
        assert store.latest("t").checkpoint.id == "c1"
        assert store.pool is pool
        store.close()
        with pool.connection() as conn:
            assert conn.autocommit is False
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(ProcessingError, match="closed"):
            store.latest("t")
    finally:
        pool.close()


@pytest.mark.skipif(
    tuple(int(part) for part in psycopg_pool.__version__.split(".")[:2]) < (3, 3),
    reason="psycopg_pool takes callable conninfo and kwargs from 3.3",
)
def test_create_over_a_pool_whose_conninfo_and_kwargs_are_callables(harness: PgHarness) -> None:
    pool = psycopg_pool.ConnectionPool(
        lambda: harness.dsn, kwargs=lambda: {"application_name": "callables"}, min_size=1, max_size=2, open=True
    )
    try:
        store = PostgresCheckpointer.create(pool, harness.config())
        token = claim(store, "t").token
        assert [e.seq for e in store.commit("t", Commit(token=token, events=[event()]))] == [1]
        store.close()
    finally:
        pool.close()


def test_create_refuses_what_is_not_a_pool() -> None:
    with pytest.raises(ValidationError) as info:
        PostgresCheckpointer.create("postgresql://x")  # type: ignore[arg-type]
    assert info.value.field == "pool"


def test_open_refuses_a_conninfo_that_is_not_text() -> None:
    with pytest.raises(ValidationError) as info:
        PostgresCheckpointer.open(b"postgresql://x")  # type: ignore[arg-type]
    assert info.value.field == "conninfo"


def test_a_mixed_case_schema_is_quoted(harness: PgHarness) -> None:
    schema = "Tl_Mixed_" + new_schema_name()[-8:]
    try:
        store = harness.open_pg(schema=schema)
        token = claim(store, "t").token
        store.commit("t", Commit(token=token, events=[event()]))
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() == (1,)
        store.close()
    finally:
        drop_schema(harness.dsn, schema)


# -- migrations -------------------------------------------------------------------------------------------------


def test_migrations_are_numbered_and_applied_once(harness: PgHarness) -> None:
    harness.open()
    harness.sibling()
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        versions = conn.execute(f'SELECT version FROM "{harness.schema}".schema_version').fetchall()
    # 2: the run queue; 3: bigint retention counts; 4: commit texts; 5: a retract turn's parent is the latest;
    # 6: queue refunds; 7: access stamps; 8: the tenant indexes hold stamped rows only; 9: a commit without a
    # checkpoint re-stamps its thread in its own transaction; 10: checkpoint metadata in a column; 11: pending writes
    # numbered per checkpoint; 12: a commit's notification carries its events when they fit; 13: commits notify only
    # while a listener is registered; 14: a failed queue entry records the entry its retry enqueued
    assert versions == [(version,) for version in range(1, 15)]


def test_a_schema_newer_than_this_code_is_refused(harness: PgHarness) -> None:
    harness.open().close()
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{harness.schema}".schema_version (version) VALUES (999)')
    with pytest.raises(StoreCorrupt, match="newer"):
        harness.open_pg()


def _functions(dsn: str, schema: str) -> set[tuple[str, str, str]]:
    """Each function of ``schema``: its name, parameters and definition (the schema's name taken out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            """SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s""",
            (schema,),
        ).fetchall()
    return {tuple(text.replace(schema, "S") for text in row) for row in rows}


def test_each_function_is_defined_once_and_no_migration_repeats_another() -> None:
    import re
    from importlib import resources

    from threadloom.persistence.postgres.schema import migrations

    folder = resources.files("threadloom.persistence.postgres").joinpath("migrations")
    files = {entry.name: entry.read_text() for entry in folder.iterdir() if entry.name.endswith(".sql")}
    functions = {
        entry.name: entry.read_text() for entry in folder.joinpath("functions").iterdir() if entry.name.endswith(".sql")
    }
    assert sorted(files) == [
        "0001_store.sql", "0002_run_queue.sql", "0003_retention_counts.sql", "0004_commit_texts.sql",
        "0005_retract_parent.sql", "0006_queue_refunds.sql", "0007_access_stamps.sql",
        "0008_stamped_tenant_indexes.sql", "0009_commit_restamps.sql", "0010_checkpoint_metadata.sql",
        "0011_pending_write_numbers.sql", "0012_commit_notes.sql", "0013_listeners.sql",
        "0014_queue_retries.sql",
    ]  # fmt: skip
    assert [(m.version, m.name) for m in migrations()] == [(int(name[:4]), name) for name in sorted(files)]
    for name, text in files.items():  # a numbered migration defines no function: it includes the function's file
        assert not re.search(r"CREATE (OR REPLACE )?FUNCTION", text), name
    defined = [match for text in functions.values() for match in re.findall(r"FUNCTION \{s\}\.(\w+)\(", text)]
    assert len(defined) == len(set(defined)) >= 17, defined
    included = {name for text in files.values() for name in re.findall(r"^\\ir functions/(\S+)$", text, re.M)}
    assert included == set(functions)


# The forms functions had before the migration (the key) that changed their parameters: a database an earlier
# threadloom left at a lower version holds them (their bodies do not matter: the migration drops them).
REPLACED_FORMS = {
    3: [
        "tl_prune(text, bigint, integer, bigint) RETURNS boolean",
        "tl_sweep(text[], jsonb, bigint, integer, bigint, bigint) RETURNS void",
        "tl_prune_row({s}.threads, timestamptz, bigint, integer, bigint, text[]) RETURNS boolean",
    ],
    4: [
        "tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text, boolean, text[], "
        "text[], text, text[], text[], text[], jsonb) RETURNS void"
    ],
    6: ["tl_q_release(bigint, bigint, bigint) RETURNS integer"],
    9: [
        "tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text, boolean, text[], "
        "text[], text[], text[], text[], jsonb, text, text, jsonb) RETURNS record"
    ],
    10: [
        "tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text, boolean, text[], "
        "text[], text[], text[], text[], jsonb, text, text, jsonb, jsonb, bigint) RETURNS record"
    ],
}


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
def test_a_schema_an_earlier_version_created_migrates_to_what_a_new_one_holds(
    harness: PgHarness, monkeypatch, version: int
) -> None:
    from threadloom.persistence.postgres import schema as postgres_schema

    fresh = harness.open()
    steps = postgres_schema.migrations()
    earlier = new_schema_name()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(postgres_schema, "migrations", lambda: steps[:version])
            PostgresCheckpointer.open(harness.dsn, harness.config(schema=earlier)).close()
        quoted = f'"{earlier}"'
        with psycopg.connect(harness.dsn, autocommit=True) as conn:
            for replaced_by, forms in REPLACED_FORMS.items():
                for form in forms if replaced_by > version else ():
                    body = "SELECT" if form.endswith("void") else f"SELECT NULL::{form.rsplit(' ', 1)[-1]}"
                    conn.execute(f"CREATE FUNCTION {quoted}.{form.format(s=quoted)} LANGUAGE sql AS '{body}'")
        store = PostgresCheckpointer.open(harness.dsn, harness.config(schema=earlier))
        token = claim(store, "t").token
        records = store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
        assert [r.seq for r in records] == [1] and store.latest("t").checkpoint.fencing_token == token
        store.close()
        got = {(name, args.replace(earlier, "S"), body.replace(earlier, "S")) for name, args, body in
               _functions(harness.dsn, earlier)}  # fmt: skip
        assert got == _functions(harness.dsn, fresh.config.schema)
    finally:
        drop_schema(harness.dsn, earlier)


# -- encode once: a commit writes the texts encoded once ---------------------------------------------------------


def test_a_commit_writes_the_encoded_texts_as_they_are(harness: PgHarness) -> None:
    from threadloom import EffectRecord, PendingWrite
    from threadloom.persistence.encoded import encode_commit

    store = harness.open()
    token = claim(store, "t").token
    store.commit("t", Commit(token=token, events=[event("before")]))
    commit = Commit(
        token=token,
        checkpoint=checkpoint("t", "c1", None, state={"text": "é \u2028 \"q\"", "n": [1, 2.5, None]}),
        pending_writes=[PendingWrite(checkpoint_id="c1", task_id="task", node_id="n", payload={"k": "v"})],
        events=[event("a"), event("b")],
        effects=[EffectRecord(key="k", run_id="run-1", recorded_at=NOW, result=["r"])],
    )
    encoded = encode_commit("t", commit)
    records = store.commit("t", commit)
    assert records == [encoded.events[0].record(2), encoded.events[1].record(3)]
    assert store.events_after("t", 1, 10) == records
    s = f'"{harness.schema}"'
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT body FROM {s}.checkpoints").fetchall() == [(encoded.checkpoint.text,)]
        assert conn.execute(f"SELECT body FROM {s}.pending_writes").fetchall() == [(encoded.pending_writes[0].text,)]
        assert conn.execute(f"SELECT seq, body FROM {s}.events WHERE seq > 1 ORDER BY seq").fetchall() == [
            (2, encoded.events[0].text(2)), (3, encoded.events[1].text(3))
        ]  # fmt: skip
        assert conn.execute(f"SELECT body FROM {s}.effects").fetchall() == [(encoded.effects[0].text,)]


def test_a_refusal_no_check_explains_is_a_corrupt_store_not_a_commit(harness: PgHarness) -> None:
    """The commit function answers what its checks read and the store raises through the one commit rule; a
    function that refuses what every check passes (not this version's) is StoreCorrupt, and nothing is written."""
    store = harness.open()
    token = claim(store, "t").token
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(
            f"""CREATE OR REPLACE FUNCTION "{harness.schema}".tl_commit(
                    p_thread text, p_token bigint, p_fence text, p_fence_token bigint, p_cp_id text, p_cp_parent text,
                    p_cp_run text, p_cp_status text, p_cp_tenant text, p_cp_graph text, p_cp_origin text,
                    p_cp_body text, p_cp_metadata jsonb, p_retract boolean, p_pw_cps text[], p_pw_bodies text[],
                    p_ev_bodies text[],
                    p_fx_keys text[], p_fx_bodies text[], p_metadata jsonb, p_access_schema text,
                    p_access_tenant text, p_access_attrs jsonb, p_schemas jsonb, p_stamp_pos bigint,
                    OUT first_seq bigint, OUT current bigint, OUT fence_current bigint, OUT base text,
                    OUT duplicate boolean, OUT latest text, OUT stamp_pos bigint, OUT stamp_body text)
                LANGUAGE plpgsql AS $$ BEGIN current := p_token; duplicate := false; END $$"""
        )
    with pytest.raises(StoreCorrupt) as caught:
        store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
    assert caught.value.operation == "commit" and "'t'" in caught.value.message
    assert store.latest("t") is None and store.events_after("t", 0, 10) == []


# -- the database decides time (seeds 003) -------------------------------------------------------------------


def server_now(dsn: str) -> datetime:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0].astimezone(UTC)


def test_claim_expiry_and_updated_at_come_from_the_database_clock(harness: PgHarness) -> None:
    store = harness.open()
    ttl = timedelta(minutes=3)
    before = server_now(harness.dsn)
    granted = store.claim("t", ClaimRequest(holder="run-1", ttl=ttl, tenant_id="acme"))
    store.commit("t", Commit(token=granted.token, checkpoint=checkpoint("t", "c1", None, tenant_id="acme")))
    after = server_now(harness.dsn)
    assert before + ttl <= granted.expires_at <= after + ttl
    assert granted.expires_at.tzinfo == UTC
    (summary,) = store.threads(ThreadQuery(tenant_id="acme")).items
    assert before <= summary.updated_at <= after
    assert summary.status is ThreadStatus.RUNNING


def test_retention_age_ignores_the_producers_created_at(harness: PgHarness) -> None:
    """A checkpoint whose producer clock says 1970 is young by the database clock, so max_age keeps it."""
    from threadloom import RetentionPolicy

    store = harness.open()
    token = claim(store, "t").token
    old = datetime(1970, 1, 2, tzinfo=UTC)
    store.commit(
        "t",
        Commit(
            token=token,
            checkpoint=Checkpoint(
                id="c1", parent=None, thread_id="t", run_id="run-1", status=CheckpointStatus.COMPLETED, created_at=old
            ),
            events=[EventDraft(run_id="run-1", type="old", timestamp=old)],
        ),
    )
    store.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c2", "c1")))
    store.prune("t", RetentionPolicy(max_age=timedelta(hours=1)))
    assert [cp.id for cp in store.history("t", limit=10)] == ["c2", "c1"]
    assert [e.type for e in store.events_after("t", 0, 10)] == ["old"]


# -- LISTEN/NOTIFY ------------------------------------------------------------------------------------------------


def wait_in_thread(store, thread_id: str, after_seq: int, timeout: timedelta, cancel=None):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = store.await_events_after(thread_id, after_seq, 100, timeout, cancel=cancel)
        except ThreadloomError as error:
            box["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return worker, box


def listening(store: PostgresCheckpointer) -> bool:
    return store._listener.ready.wait(5)  # noqa: SLF001 - the test looks at the store's listener


def test_await_wakes_on_a_commit_through_another_store(harness: PgHarness) -> None:
    waiter, writer = harness.open(), harness.sibling()
    token = claim(writer, "t").token
    worker, box = wait_in_thread(waiter, "t", 0, timedelta(seconds=20))
    time.sleep(0.3)
    assert listening(waiter)
    writer.commit("t", Commit(token=token, events=[event("a"), event("b")]))
    worker.join(15)
    assert not worker.is_alive(), "still waiting: the notification did not wake it (its timeout is 20 s)"
    assert [e.type for e in box["value"]] == ["a", "b"]


def test_await_wakes_on_a_commit_through_a_store_over_the_callers_pool(harness: PgHarness) -> None:
    """A commit through a store over a caller's pool wakes waiters on another store."""
    waiter = harness.open()
    pool = psycopg_pool.ConnectionPool(harness.dsn, min_size=1, max_size=2, open=True)
    try:
        writer = PostgresCheckpointer.create(pool, harness.config())
        token = claim(writer, "t").token
        worker, box = wait_in_thread(waiter, "t", 0, timedelta(seconds=20))
        time.sleep(0.3)
        assert listening(waiter)
        writer.commit("t", Commit(token=token, checkpoint=checkpoint("t", "c1", None), events=[event("a")]))
        worker.join(15)
        assert not worker.is_alive(), "still waiting: the notification did not wake it (its timeout is 20 s)"
        assert [e.type for e in box["value"]] == ["a"]
        writer.close()
    finally:
        pool.close()


def test_pending_writes_are_numbered_per_checkpoint(harness: PgHarness) -> None:
    """A new checkpoint numbers its pending writes from 1 again (its commit's delete of the old ones then meets no
    index entry of writes deleted before), and the latest's pending writes keep commit order."""
    from threadloom import PendingWrite

    store = harness.open()
    token = claim(store, "t").token
    parent = None
    for n in range(1, 4):
        cp = f"c{n}"
        writes = [PendingWrite(checkpoint_id=cp, task_id=f"{cp}-{i}", node_id="n", payload=i) for i in range(2)]
        store.commit("t", Commit(token=token, checkpoint=checkpoint("t", cp, parent), pending_writes=writes))
        store.commit("t", Commit(token=token, pending_writes=[
            PendingWrite(checkpoint_id=cp, task_id=f"{cp}-late", node_id="n", payload="late")
        ]))
        parent = cp
    latest = store.latest("t")
    assert [w.task_id for w in latest.pending_writes] == ["c3-0", "c3-1", "c3-late"]
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        idx = conn.execute(f'SELECT idx FROM "{harness.schema}".pending_writes ORDER BY idx').fetchall()
        next_pw = conn.execute(f'SELECT next_pw FROM "{harness.schema}".threads').fetchone()[0]
    assert idx == [(1,), (2,), (3,)] and next_pw == 4


def test_await_wakes_on_a_delete_through_another_store(harness: PgHarness) -> None:
    waiter, writer = harness.open(), harness.sibling()
    token = claim(writer, "t").token
    writer.commit("t", Commit(token=token, events=[event("a")]))
    worker, box = wait_in_thread(waiter, "t", 1, timedelta(seconds=20))
    time.sleep(0.3)
    writer.delete_thread("t", token)
    worker.join(15)
    assert not worker.is_alive(), "still waiting: the delete did not wake it (its timeout is 20 s)"
    assert isinstance(box.get("error"), ThreadDeleted)


def test_await_does_not_read_while_it_waits(harness: PgHarness, monkeypatch) -> None:
    store = harness.open()
    reads = []
    original = store._read_events  # noqa: SLF001
    monkeypatch.setattr(store, "_read_events", lambda *args: reads.append(args) or original(*args))
    assert store.await_events_after("quiet", 0, 10, timedelta(seconds=1)) == []
    assert len(reads) <= 2, "one read, and one more when the listener came up; none while waiting"


def test_the_listener_comes_back_after_its_backend_is_killed(harness: PgHarness) -> None:
    waiter, writer = harness.open(), harness.sibling()
    waiter.await_events_after("t", 0, 10, timedelta(milliseconds=10))
    assert waiter.await_events_after("t", 0, 10, timedelta(milliseconds=200)) == []
    assert listening(waiter)
    old_pid = waiter._listener.backend_pid  # noqa: SLF001
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
    deadline = time.monotonic() + 10
    while (waiter._listener.backend_pid == old_pid or not waiter._listener.ready.is_set()) and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.02)
    assert waiter._listener.backend_pid != old_pid  # noqa: SLF001
    token = claim(writer, "t").token
    worker, box = wait_in_thread(waiter, "t", 0, timedelta(seconds=20))
    time.sleep(0.3)
    writer.commit("t", Commit(token=token, events=[event("after")]))
    worker.join(15)
    assert not worker.is_alive(), "still waiting: the re-established listener did not wake it"
    assert [e.type for e in box["value"]] == ["after"]


def test_cancel_ends_a_wait_promptly_and_leaks_no_connection(harness: PgHarness) -> None:
    store = harness.open_pg(min_size=0, max_size=2)
    cancel = threading.Event()
    worker, box = wait_in_thread(store, "t", 0, timedelta(seconds=30), cancel=cancel)
    time.sleep(0.3)
    cancel.set()
    worker.join(10)
    assert not worker.is_alive(), "cancel did not end the wait (its timeout is 30 s)"
    assert isinstance(box.get("error"), CancelledError)
    stats = store.pool.get_stats()
    assert stats.get("pool_size", 0) == stats.get("pool_available", 0), stats
    token = claim(store, "t").token  # the store keeps working
    assert [e.seq for e in store.commit("t", Commit(token=token, events=[event()]))] == [1]


# -- the largest valid values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("caller_pool", [False, True], ids=["own-pool", "caller-pool"])
def test_every_call_takes_the_largest_valid_numbers_and_durations(harness: PgHarness, caller_pool: bool) -> None:
    """Found by hostile testing: a valid value at the edge of its range (2**63 - 1, 100 years) must be kept or
    answered, never refused by the driver or the server (bigint, interval and timestamp arithmetic)."""
    from threadloom import RetentionPolicy, SweepPolicy
    from threadloom.domain.validation import MAX_DURATION, MAX_INT

    if caller_pool:
        pool = psycopg_pool.ConnectionPool(harness.dsn, min_size=1, max_size=3, open=True)
        harness._opened.append(store := PostgresCheckpointer.create(pool, harness.config()))
    else:
        pool = None
        store = harness.open_pg(max_size=3)
    try:
        held = store.claim("t", ClaimRequest(holder="run-1", ttl=MAX_DURATION))
        assert held.expires_at - datetime.now(UTC) > MAX_DURATION - timedelta(days=1)
        renewed = store.renew("t", held.token, MAX_DURATION)
        assert renewed.expires_at >= held.expires_at
        store.commit("t", Commit(token=held.token, checkpoint=checkpoint("t", "c1", None), events=[event()]))
        for call, thread_id in (
            (lambda: store.commit("t", Commit(token=MAX_INT, events=[event()])), "t"),
            (lambda: store.commit("t", Commit(token=held.token, fence=("other", MAX_INT), events=[event()])), "other"),
            (lambda: store.delete_thread("t", MAX_INT), "t"),
            (lambda: store.delete_thread("t", held.token, fence=("other", MAX_INT)), "other"),
        ):
            with pytest.raises(StaleClaim) as stale:
                call()
            assert (stale.value.thread_id, stale.value.token) == (thread_id, MAX_INT)
        assert store.events_after("t", MAX_INT, 10_000) == []
        assert store.await_events_after("t", MAX_INT, 10_000, timedelta(0)) == []
        huge = RetentionPolicy(max_checkpoints=MAX_INT, max_events=MAX_INT, max_age=MAX_DURATION)
        store.prune("t", huge)
        page = store.sweep(SweepPolicy(retention=huge, tombstone_age=MAX_DURATION, batch_size=10_000), None)
        assert page.visited == ("t",) and page.pruned == () and page.reclaimed == ()
        assert store.latest("t").checkpoint.id == "c1" and [e.seq for e in store.events_after("t", 0, 10)] == [1]
        store.compact_events("t", MAX_INT)  # every event so far
        assert store.events_after("t", 1, 10) == []
        # A wait of 100 years: a commit wakes it, and its cancel ends it.
        worker, box = wait_in_thread(store, "t", 1, MAX_DURATION)
        time.sleep(0.2)
        store.commit("t", Commit(token=held.token, events=[event("late")]))
        worker.join(10)
        assert not worker.is_alive() and [e.seq for e in box.get("value", [])] == [2], box
        cancel = threading.Event()
        worker, box = wait_in_thread(store, "t", 2, MAX_DURATION, cancel=cancel)
        time.sleep(0.2)
        cancel.set()
        worker.join(10)
        assert not worker.is_alive() and isinstance(box.get("error"), CancelledError), box
        # The latest and earliest instants a datetime holds round-trip; one past them is refused up front.
        last, first = datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)
        edges = [EventDraft(run_id="run-1", type="edge", timestamp=when) for when in (last, first)]
        latest = attrs.evolve(checkpoint("t", "c2", "c1"), created_at=last)
        records = store.commit("t", Commit(token=held.token, checkpoint=latest, events=edges))
        assert [r.timestamp for r in records] == [last, first]
        assert [e.timestamp for e in store.events_after("t", 2, 10)] == [last, first]
        assert store.latest("t").checkpoint.created_at == last
        for beyond in (datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
                       datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))):  # fmt: skip
            with pytest.raises(ValidationError) as caught:
                EventDraft(run_id="run-1", type="edge", timestamp=beyond)
            assert caught.value.field == "event.timestamp"
        store.release("t", held.token)
        again = store.claim("t", ClaimRequest(holder="run-2", ttl=MAX_DURATION))
        assert again.token > held.token
    finally:
        if pool is not None:
            store.close()
            pool.close()


# -- secrets -----------------------------------------------------------------------------------------------------


def test_a_dsn_password_never_reaches_an_error_or_a_log(harness: PgHarness, caplog) -> None:
    secret = "Sup3r-S3cret-pw"
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as captured:
        with pytest.raises(ProcessingError) as unreachable:
            PostgresCheckpointer.open(
                f"postgresql://postgres:{secret}@127.0.0.1:1/postgres",
                PostgresCheckpointerConfig(schema=harness.schema, connect_timeout=timedelta(seconds=1)),
            )
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(harness.dsn)
        parts["password"] = secret  # the test server trusts loopback, so the password is carried but unused
        store = PostgresCheckpointer.open(make_conninfo(**parts), harness.config())
        drop_schema(harness.dsn, harness.schema)
        with pytest.raises(ProcessingError) as broken:
            store.latest("t")
        text = " ".join([str(unreachable.value), repr(unreachable.value), str(broken.value), repr(store)])
        store.close()
    assert "missing" in str(broken.value)
    assert secret not in text
    assert secret not in caplog.text
    assert secret not in repr(captured)


SECRET = "S3cretPW"

# Found by hostile testing: a password holding '/', '#' or '?', given in the query or in a key=value string, was
# shown in "cannot connect to PostgreSQL at …"; a malformed string was retried for the whole connect timeout and
# logged by psycopg_pool, password included.
REACHABLE_NOWHERE = [
    f"postgresql://user:ab%2F{SECRET}@127.0.0.1:1/db",
    f"postgresql://user:ab#{SECRET}@127.0.0.1:1/db",
    f"postgresql://user:ab?{SECRET}@127.0.0.1:1/db",
    f"postgresql://user@127.0.0.1:1/db?password={SECRET}",
    f"postgresql://user@127.0.0.1:1/db?sslmode=disable&password={SECRET}&schema=tl_x",
    f"host=127.0.0.1 port=1 user=user password={SECRET} dbname=db",
    f"host=127.0.0.1 port=1 user=user password='a b {SECRET}' dbname=db",
]
REFUSED_UP_FRONT = [
    f"postgresql://user:ab/{SECRET}@127.0.0.1:1/db",  # libpq would read the password as host, port and database
    f"postgresql://user:a@b{SECRET}@127.0.0.1:1/db",
    f"postgresql://user:{SECRET}@[::1",
    f"postgresql://user:{SECRET}@127.0.0.1:1/db?bogus=1",
    f"host=127.0.0.1 password='{SECRET}",
    f"host=127.0.0.1 password={SECRET} schema=tl_x",
    f"postgresql://user:{SECRET}@127.0.0.1:1/db?schema=tl_x&schema=tl_y",
]


def _shown(error: BaseException) -> str:
    return " ".join([str(error), repr(error)])


@pytest.mark.parametrize("conninfo", REACHABLE_NOWHERE)
def test_a_password_never_reaches_a_connect_error_whatever_its_characters(conninfo: str, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    config = PostgresCheckpointerConfig(schema="tl_nowhere", connect_timeout=timedelta(milliseconds=300))
    with structlog.testing.capture_logs() as captured, pytest.raises(ProcessingError) as caught:
        PostgresCheckpointer.open(conninfo, config)
    assert "cannot connect to PostgreSQL at " in caught.value.message
    assert "127.0.0.1:1/db" in caught.value.message or "127.0.0.1:1/" in caught.value.message
    assert SECRET not in _shown(caught.value)
    assert SECRET not in caplog.text and SECRET not in repr(captured)


@pytest.mark.parametrize("conninfo", REFUSED_UP_FRONT)
def test_a_malformed_conninfo_is_refused_before_any_connection_without_echoing_it(conninfo: str, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ValidationError) as caught:
        PostgresCheckpointer.open(conninfo, PostgresCheckpointerConfig(schema="tl_nowhere"))
    assert caught.value.field == "conninfo"
    assert SECRET not in _shown(caught.value) and "127.0.0.1" not in _shown(caught.value)
    assert not [record for record in caplog.records if record.name.startswith("psycopg")], "no connection was tried"
    assert SECRET not in caplog.text


BAD_OPTION_VALUES = [
    ({"sslmode": "bogus"}, 'invalid sslmode value: "bogus"'),
    ({"port": "99999"}, 'invalid port number: "99999"'),
    ({"keepalives": "often"}, 'invalid integer value "often" for connection option "keepalives"'),
    ({"options": "-c TimeZone=Nowhere/Bogus"}, 'invalid value for parameter "TimeZone": "Nowhere/Bogus"'),
    # found by hostile testing: these were still a retryable StoreUnavailable
    ({"ssl_min_protocol_version": "TLSv9"}, 'invalid "ssl_min_protocol_version" value: "TLSv9"'),
    ({"options": "-c search_path"}, "-c search_path requires a value"),
    ({"service": "nosuch"}, 'definition of service "nosuch" not found'),
]


@pytest.mark.parametrize(
    "parts",
    [{"dbname": "invalid value"}, {"host": "/nonexistent/invalid value"}],
    ids=["database", "socket-directory"],
)
def test_a_name_that_reads_like_a_refused_option_is_not_taken_for_one(harness: PgHarness, parts: dict) -> None:
    """The refusal is recognised in libpq's reason, never in the names it quotes (found by hostile testing: a
    socket directory named "invalid value" made a missing server a bad option, exit 2)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    options = {**conninfo_to_dict(harness.dsn), **parts, "connect_timeout": "2"}
    with pytest.raises(ProcessingError) as caught:
        PostgresCheckpointer.open(make_conninfo(**options), harness.config(schema=new_schema_name()))
    assert not isinstance(caught.value, ValidationError)


def _with_password_and(dsn: str, options: dict[str, str]) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(dsn)
    parts.update(password=SECRET, **options)  # the trusting test server ignores the password
    return make_conninfo(**parts)


# Found by hostile testing: libpq's or the server's refusal of an option value was a retryable StoreUnavailable
# ("...; retry later"), which no retry heals.
@pytest.mark.parametrize(("options", "reason"), BAD_OPTION_VALUES)
def test_a_bad_option_value_is_a_validation_error_naming_conninfo(
    harness: PgHarness, options: dict[str, str], reason: str, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    schema = new_schema_name()
    with structlog.testing.capture_logs() as captured, pytest.raises(ValidationError) as caught:
        PostgresCheckpointer.open(_with_password_and(harness.dsn, options), harness.config(schema=schema))
    assert caught.value.field == "conninfo"
    assert reason in str(caught.value) and "check the connection string" in str(caught.value)
    assert SECRET not in _shown(caught.value)
    assert SECRET not in caplog.text and SECRET not in repr(captured)
    assert _schemas(harness.dsn, schema) == set(), "nothing was created"


@pytest.mark.parametrize(("options", "reason"), BAD_OPTION_VALUES)
def test_the_cli_refuses_a_store_url_with_a_bad_option_value_with_status_2(
    harness: PgHarness, options: dict[str, str], reason: str, tmp_path
) -> None:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(_with_password_and(harness.dsn, options))
    query = "&".join(
        f"{key}={quote(str(value), safe='')}"
        for key, value in parts.items()
        if key not in ("user", "password", "host", "port", "dbname")
    )
    url = (
        f"postgresql://{parts.get('user') or ''}:{SECRET}@{parts.get('host') or 'localhost'}:"
        f"{parts.get('port') or 5432}/{parts.get('dbname') or ''}?{query}"
    )
    result = subprocess.run(
        [sys.executable, "-m", "threadloom", "--store", url, "--log-level", "debug", "threads"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after psycopg's debug lines
    assert last.startswith("threadloom: error: ") and "Traceback" not in result.stderr, result.stderr
    assert "invalid conninfo" in last and reason in last and "check the connection string" in last
    assert SECRET not in result.stdout + result.stderr


# Found by hostile testing: ``?connect_timeout=abc`` was accepted and silently ignored (the store's own bound replaced
# it, and psycopg skips a value it cannot read), and so was any valid value.
@pytest.mark.parametrize(
    ("value", "says"),
    [("abc", "must be a whole number of seconds, got 'abc'"), ("1.5", "whole number of seconds, got '1.5'"),
     ("-3", "whole number of seconds, got '-3'"), ("", "whole number of seconds, got ''"),
     ("0", "must be greater than zero"), ("601", "must be at most 600 s")],
    ids=["letters", "fraction", "negative", "empty", "zero", "too-long"],
)  # fmt: skip
def test_a_url_connect_timeout_that_is_not_whole_seconds_in_bounds_is_refused_naming_it(
    harness: PgHarness, value: str, says: str
) -> None:
    from psycopg.conninfo import make_conninfo

    schema = new_schema_name()
    with pytest.raises(ValidationError) as caught:
        PostgresCheckpointer.open(make_conninfo(harness.dsn, connect_timeout=value), harness.config(schema=schema))
    assert caught.value.field == "conninfo"
    assert "its connect_timeout parameter" in str(caught.value) and says in str(caught.value)
    assert _schemas(harness.dsn, schema) == set(), "nothing was created"


def test_a_url_connect_timeout_overrides_the_configs(harness: PgHarness) -> None:
    from psycopg.conninfo import make_conninfo

    store = PostgresCheckpointer.open(
        make_conninfo(harness.dsn, connect_timeout="3"), harness.config(connect_timeout=timedelta(seconds=9))
    )
    try:
        assert store.config.connect_timeout == timedelta(seconds=3)
    finally:
        store.close()


def test_the_target_shows_only_user_host_port_and_database(harness: PgHarness) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(harness.dsn)
    parts.update(password=f"x/{SECRET}#?@", application_name="probe")  # carried, unused by the trusting server
    store = PostgresCheckpointer.open(make_conninfo(**parts), harness.config())
    try:
        host, port = parts.get("host") or "localhost", parts.get("port") or "5432"
        user = f"{parts['user']}@" if parts.get("user") else ""
        assert repr(store) == (
            f"PostgresCheckpointer(target='{user}{host}:{port}/{parts.get('dbname') or ''}', "
            f"schema='{harness.schema}')"
        )
    finally:
        store.close()


# -- the schema named in the URL ---------------------------------------------------------------------------------


def _with_query(dsn: str, query: str) -> str:
    if not dsn.startswith(("postgresql://", "postgres://")):
        pytest.skip("needs the test server as a postgresql:// URL")
    return f"{dsn}{'&' if '?' in dsn.rpartition('@')[2] else '?'}{query}"


def _schemas(dsn: str, *names: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (list(names),)).fetchall()
    return {row[0] for row in rows}


def test_a_schema_named_in_the_url_overrides_the_configs(harness: PgHarness) -> None:
    other = new_schema_name()
    encoded = harness.schema.replace("_", "%5F")  # percent-decoded as libpq decodes the other parameters
    url = _with_query(harness.dsn, f"application_name=tl_probe&schema={encoded}")
    store = PostgresCheckpointer.open(url, harness.config(schema=other))
    try:
        assert store.config.schema == harness.schema and f"schema='{harness.schema}'" in repr(store)
        token = claim(store, "t").token
        store.commit("t", Commit(token=token, events=[event()]))
        with store.pool.connection() as conn:  # the rest of the query reached libpq
            assert conn.execute("SHOW application_name").fetchone() == ("tl_probe",)
        assert _schemas(harness.dsn, harness.schema, other) == {harness.schema}
        via = open_store(_with_query(harness.dsn, f"schema={harness.schema}"))
        try:
            assert via.config.schema == harness.schema and [e.seq for e in via.events_after("t", 0, 10)] == [1]
        finally:
            via.close()
    finally:
        store.close()
        drop_schema(harness.dsn, other)  # only there if the URL's schema was ignored


@pytest.mark.parametrize("value", ["", "bad-name", "pg_mine", "1abc", "a" * 64, "x%3B%20DROP%20TABLE%20y"])
def test_a_schema_in_the_url_is_checked_like_the_configs(harness: PgHarness, value: str, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ValidationError) as caught:
        PostgresCheckpointer.open(_with_query(harness.dsn, f"schema={value}"), harness.config())
    assert caught.value.field == "conninfo" and "schema" in str(caught.value)
    assert not [record for record in caplog.records if record.name.startswith("psycopg")], "no connection was tried"


# -- plans: every bounded read is index-backed ---------------------------------------------------------------


def test_reads_use_indexes_not_scans(harness: PgHarness) -> None:
    """EXPLAIN of each bounded read on a store of a few thousand threads: no sequential scan of a table.

    With ``enable_seqscan`` off the planner still falls back to a scan where no index serves a query, so a
    ``Seq Scan`` in a plan means a missing index.
    """
    from threadloom import RetentionPolicy, SweepPolicy, ThreadCursor

    store = harness.open()
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        s = f'"{harness.schema}"'
        conn.execute(
            f"""INSERT INTO {s}.threads (thread_id, first_seq, next_seq, floor, next_pos, updated_at, stamped_at,
                    latest_pos, latest_id, latest_run_id, latest_status, tenant_id, graph_id, claim_token,
                    claim_expires, origin_parent)
                SELECT 'x' || i, 1, 1, 1, 2, now(), now(), 1, 'c' || i, 'r' || i,
                       (ARRAY['running','completed'])[1 + i % 2], 'acme', 'g',
                       CASE WHEN i % 3 = 0 THEN i END, CASE WHEN i % 3 = 0 THEN now() END,
                       CASE WHEN i % 4 = 0 THEN 'parent' END
                FROM generate_series(1, 3000) i"""
        )
        conn.execute(
            f"""INSERT INTO {s}.checkpoints SELECT 'x' || i, 1, 'c' || i, 'r' || i, 'running', now(), 1,
                    json_build_object('id', 'c' || i, 'parent', NULL, 'thread_id', 'x' || i, 'run_id', 'r' || i,
                        'status', 'running', 'created_at', 0, 'state', json_build_object(), 'graph_id', 'g',
                        'tenant_id', 'acme', 'fencing_token', NULL, 'origin', NULL, 'metadata', json_build_object()
                    )::text
                FROM generate_series(1, 3000) i"""
        )
        conn.execute(f"INSERT INTO {s}.children SELECT 'parent', 'x' || i, i FROM generate_series(4, 3000, 4) i")
        conn.execute(f"ANALYZE {s}.threads; ANALYZE {s}.checkpoints; ANALYZE {s}.children")
    captured: list[tuple[str, str, list]] = []
    original = store._db.call  # noqa: SLF001

    def capture(operation, thread_id, statement, params, **kwargs):
        if not kwargs.get("write"):
            captured.append((operation, statement, list(params)))
        return original(operation, thread_id, statement, params, **kwargs)

    store._db.call = capture  # noqa: SLF001
    store.latest("x8")
    store.history("x8", limit=10)
    store.history("x8", limit=10, before="c8")
    store.children("parent", limit=10)
    store.children("parent", limit=10, after="x8")
    store.events_after("x8", 0, 10)
    store.effect("x8", "k")
    store.lookup_run("x8", ["r8", "r9"])
    store.threads(ThreadQuery(tenant_id="acme"))
    store.threads(ThreadQuery(tenant_id="acme", statuses={ThreadStatus.IDLE, ThreadStatus.RUNNING}))
    store.threads(ThreadQuery(tenant_id=None, after=ThreadCursor(updated_at=NOW, thread_id="x1")))
    store.incomplete("acme", limit=10)
    store.tenants(limit=10)  # both statements: the named tenants' page, then the tenant-less count
    store.tenants(limit=10, after="a")
    store.sweep(SweepPolicy(retention=RetentionPolicy(max_checkpoints=3)), None, after="x5")
    store.graph_threads("g", after="x5", limit=10)
    assert [cp.id for cp in store.tenant_history("x8", "acme", limit=10)] == ["c8"]  # the follower stamped it
    store.tenant_history("x8", "acme", limit=10, before="c8")
    store.tenant_events_after("x8", "acme", 0, 10)
    assert len(store.export_tenant("acme", after="x5", limit=3).threads) == 3
    store.members("g#access")
    store._db.call = original  # noqa: SLF001
    assert {operation for operation, _, _ in captured} >= {
        "latest", "history", "children", "events_after", "effect", "lookup_run", "threads", "incomplete", "sweep",
        "tenants",
        "graph_threads", "tenant_history", "tenant_events_after", "export_tenant", "members", "stamp_thread",
    }
    assert sum(operation == "tenants" for operation, _, _ in captured) == 4
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        cursor = psycopg.ClientCursor(conn)
        for operation, statement, params in captured:
            plan = "\n".join(
                row[0] for row in conn.execute("EXPLAIN " + cursor.mogrify(statement, params)).fetchall()
            )
            assert "Seq Scan" not in plan, f"{operation} scans a table:\n{plan}"
            if operation == "tenants":  # counted from a registry index by tenant, never from the table
                assert "threads_status" in plan or "threads_tenant" in plan, plan
            if operation in ("latest", "history"):  # a thread's history is reached by (thread_id, pos) only
                assert "checkpoints_pkey" in plan and "Filter: (pos" not in plan, plan


# -- a schema with no store is not created on request ------------------------------------------------------------


def test_a_config_that_creates_nothing_refuses_a_schema_with_no_store(harness: PgHarness) -> None:
    missing = new_schema_name()
    with pytest.raises(ProcessingError, match=f"schema '{missing}' at .* is not a threadloom store .nothing was created"):
        PostgresCheckpointer.open(harness.dsn, harness.config(schema=missing, create=False))
    assert _schemas(harness.dsn, missing) == set()
    harness.open().close()  # a store that exists opens as ever
    store = PostgresCheckpointer.open(harness.dsn, harness.config(create=False))
    store.close()
    with pytest.raises(ValidationError, match="config.create"):
        harness.config(create="no")


def test_a_config_that_creates_nothing_never_migrates_an_older_schema(harness: PgHarness) -> None:
    """A reader (``create=False``) refuses a store of an older version instead of migrating it."""
    import psycopg

    harness.open().close()
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        latest = conn.execute(f'SELECT max(version) FROM "{harness.schema}".schema_version').fetchone()[0]
        conn.execute(f'DELETE FROM "{harness.schema}".schema_version WHERE version = %s', (latest,))
    with pytest.raises(ProcessingError, match=f"version {latest - 1}, older than .* nothing was migrated"):
        PostgresCheckpointer.open(harness.dsn, harness.config(create=False))
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        assert conn.execute(f'SELECT max(version) FROM "{harness.schema}".schema_version').fetchone()[0] == latest - 1


@pytest.mark.parametrize(
    "command",
    [["threads"], ["show", "x"], ["history", "x"], ["events", "x"], ["stats"], ["sweep"], ["check"]],
    ids=lambda command: command[0],
)
def test_the_cli_never_creates_a_schema_it_only_reads(harness: PgHarness, command: list[str]) -> None:
    """As for a mistyped SQLite path: a mistyped schema creates nothing (found by a new user's trial)."""
    from click.testing import CliRunner

    from threadloom.cli.main import EXIT_FAILED, cli

    missing = new_schema_name()
    url = _with_query(harness.dsn, f"schema={missing}")
    result = CliRunner().invoke(cli, ["--store", url, *command])
    assert result.exit_code == EXIT_FAILED, result.output
    assert f"schema '{missing}' at" in result.output and "is not a threadloom store" in result.output
    assert _schemas(harness.dsn, missing) == set()


# -- check: the invariants on a real schema -----------------------------------------------------------------------


def test_check_passes_on_a_sound_schema_and_finds_planted_damage(harness: PgHarness) -> None:
    store = harness.open_pg()
    for name in ("a", "b", "gone"):
        token = store.claim(name, ClaimRequest(holder="run-1", ttl=timedelta(minutes=5))).token
        parent = None
        for step in range(3):
            cp = checkpoint(name, f"{name}-{step}", parent)
            store.commit(name, Commit(token=token, checkpoint=cp, events=[EventDraft(
                run_id="run-1", type="step", timestamp=NOW)] * 2))
            parent = cp.id
        if name == "gone":
            store.delete_thread(name, token)
        else:
            store.release(name, token)
    store.compact_events("a", 3)
    report = store.check()
    assert report.ok, report.problems
    assert (report.threads, report.checkpoints, report.events) == (3, 6, 10)
    s = harness.schema
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{s}".events WHERE thread_id = \'b\' AND seq = 3')
        conn.execute(f'UPDATE "{s}".checkpoints SET body = \'{{\' WHERE thread_id = \'a\' AND pos = 1')
        conn.execute(f'UPDATE "{s}".threads SET latest_id = \'b-0\' WHERE thread_id = \'b\'')
        conn.execute(f'INSERT INTO "{s}".effects VALUES (\'ghost\', \'k\', \'{{}}\')')
    found = {(p.check, p.thread_id) for p in store.check().problems}
    assert found == {("events", "b"), ("decode", "a"), ("registry", "b"), ("orphan", "ghost")}
    # Found by a tester: an unknown status in the registry row passed check, then `threads` and `show` failed.
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{s}".threads SET latest_status = \'weird\' WHERE thread_id = \'a\'')
        conn.execute(f'UPDATE "{s}".threads SET latest_status = \'failed\' WHERE thread_id = \'gone\'')
    problems = store.check().problems
    assert any(p.check == "decode" and p.thread_id == "a" and "'weird'" in p.detail for p in problems), problems
    assert any(p.check == "registry" and p.thread_id == "gone" and "'failed'" in p.detail for p in problems), problems

    from click.testing import CliRunner

    from threadloom.cli.main import EXIT_FAILED, cli

    result = CliRunner().invoke(cli, ["--store", _with_query(harness.dsn, f"schema={s}"), "--json", "check"])
    assert result.exit_code == EXIT_FAILED and not json.loads(result.stdout)["ok"]


# -- checkpoint metadata column (migration 10) -----------------------------------------------------------------------


def test_search_history_reads_the_metadata_of_rows_written_before_version_10(harness: PgHarness) -> None:
    store = harness.open()
    token = claim(store, "t").token
    parent = None
    for index, metadata in enumerate([{"k": "a"}, {"k": "b"}, {}, {"k": "a", "j": "x"}]):
        store.commit("t", Commit(token=token, checkpoint=checkpoint("t", f"c{index}", parent, metadata=metadata)))
        parent = f"c{index}"
    s = f'"{harness.schema}"'
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        assert conn.execute(f"SELECT id, metadata FROM {s}.checkpoints ORDER BY pos").fetchall() == [
            ("c0", {"k": "a"}), ("c1", {"k": "b"}), ("c2", {}), ("c3", {"k": "a", "j": "x"})
        ]  # fmt: skip
        # as a schema migrated from version 9 holds them: no column value, the metadata in the body only
        conn.execute(f"UPDATE {s}.checkpoints SET metadata = NULL WHERE id IN ('c0', 'c2', 'c3')")
    assert [cp.id for cp in store.search_history("t", metadata={"k": "a"}, limit=10).items] == ["c3", "c0"]
    assert [cp.id for cp in store.search_history("t", metadata={"k": "a", "j": "x"}, limit=10).items] == ["c3"]
    assert [cp.id for cp in store.search_history("t", metadata={"k": "b"}, limit=10).items] == ["c1"]
    assert len(store.search_history("t", metadata={}, limit=10).items) == 4
