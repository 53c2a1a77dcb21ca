"""The store contract suite against PostgreSQL: one store, two stores on one schema, and a store over the
caller's pool (DESIGN §3 "Stores").

The database decides time, so the harnesses set ``database_clock`` and time-dependent cases wait real ticks.
"""

import pytest

from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.postgres_harness import (
    PgCallerPoolHarness,
    PgHarness,
    PgPairHarness,
)

pytestmark = pytest.mark.postgres


class TestPostgresContract(CheckpointerContract):
    harness_class = PgHarness


class TestPostgresPairContract(CheckpointerContract):
    harness_class = PgPairHarness


class TestPostgresCallerPoolContract(CheckpointerContract):
    harness_class = PgCallerPoolHarness
