"""The whole store contract suite through the async API (:class:`AsyncStore`), once per store: memory, SQLite,
PostgreSQL. Each call is a coroutine driven on an event loop; a ``cancel`` event is task cancellation."""

import pytest

from threadloom.testing.aio_harness import async_harness
from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.harness import MemoryHarness
from threadloom.testing.postgres_harness import PgHarness
from threadloom.testing.sqlite_harness import SqliteHarness


class TestAsyncMemoryContract(CheckpointerContract):
    harness_class = async_harness(MemoryHarness)


class TestAsyncSqliteContract(CheckpointerContract):
    harness_class = async_harness(SqliteHarness)


@pytest.mark.postgres
class TestAsyncPostgresContract(CheckpointerContract):
    harness_class = async_harness(PgHarness)
