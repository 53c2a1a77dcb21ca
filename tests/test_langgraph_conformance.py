"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) over ThreadloomSaver on every store.

Each store must pass every base and every extended capability (``passed_all``, nothing skipped): put, put_writes,
get_tuple, list, delete_thread, delete_for_runs, copy_thread, prune. The suite builds a fresh saver per
capability: a fresh in-memory store, a fresh SQLite file, a fresh PostgreSQL schema.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from threadloom.langgraph import ThreadloomSaver
from threadloom.persistence.memory.store import InMemoryCheckpointer
from threadloom.persistence.sqlite.store import SqliteCheckpointer

_count = itertools.count()


def _check(registered) -> None:
    report = asyncio.run(validate(registered))
    failures = {name: result.failures for name, result in report.results.items() if result.failures}
    assert not failures, failures
    assert report.passed_all(), report.results
    assert {name for name, result in report.results.items() if result.detected and result.passed} == {
        capability.value for capability in ALL_CAPABILITIES
    }
    assert sum(result.tests_passed for result in report.results.values()) >= 80


def test_conformance_memory() -> None:
    @checkpointer_test(name="threadloom-memory")
    async def factory():
        saver = ThreadloomSaver(InMemoryCheckpointer())
        yield saver
        saver.close()

    _check(factory)


def test_conformance_sqlite(tmp_path) -> None:
    @checkpointer_test(name="threadloom-sqlite")
    async def factory():
        saver = ThreadloomSaver(SqliteCheckpointer.open(tmp_path / f"conformance-{next(_count)}.db"))
        yield saver
        saver.close()
        saver.store.close()

    _check(factory)


@pytest.mark.postgres
def test_conformance_postgres() -> None:
    from threadloom.testing.postgres_harness import PgHarness

    harnesses: list[PgHarness] = []

    @checkpointer_test(name="threadloom-postgres")
    async def factory():
        harness = PgHarness()
        harnesses.append(harness)
        saver = ThreadloomSaver(harness.open_pg())
        yield saver
        saver.close()

    try:
        _check(factory)
    finally:
        for harness in harnesses:
            harness.cleanup()


# The same suite through savers built on an AsyncStore: the async methods run on its pool.


def test_conformance_memory_async_store() -> None:
    @checkpointer_test(name="threadloom-memory-async-store")
    async def factory():
        saver = await ThreadloomSaver.afrom_url("memory://")
        yield saver
        await saver.aclose()

    _check(factory)


def test_conformance_sqlite_async_store(tmp_path) -> None:
    from threadloom.persistence.aio import open_async_store

    @checkpointer_test(name="threadloom-sqlite-async-store")
    async def factory():
        astore = await open_async_store(f"sqlite:///{tmp_path / f'conformance-aio-{next(_count)}.db'}")
        saver = ThreadloomSaver(astore)
        yield saver
        await saver.aclose()
        await astore.close()

    _check(factory)


@pytest.mark.postgres
def test_conformance_postgres_async_store() -> None:
    from threadloom.persistence.aio import AsyncStore
    from threadloom.testing.postgres_harness import PgHarness

    harnesses: list[PgHarness] = []

    @checkpointer_test(name="threadloom-postgres-async-store")
    async def factory():
        harness = PgHarness()
        harnesses.append(harness)
        astore = AsyncStore(harness.open_pg(), max_workers=4)
        saver = ThreadloomSaver(astore)
        yield saver
        await saver.aclose()
        await astore.close()

    try:
        _check(factory)
    finally:
        for harness in harnesses:
            harness.cleanup()
