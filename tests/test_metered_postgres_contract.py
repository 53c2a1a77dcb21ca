"""The whole store contract suite through MeteredCheckpointer over PostgreSQL (skips, or fails in CI, exactly as
the other PostgreSQL tests do: the harness's ``postgres_dsn`` decides)."""

import pytest

from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.metered_harness import metered_harness
from threadloom.testing.postgres_harness import PgHarness

pytestmark = pytest.mark.postgres


class TestMeteredPostgresContract(CheckpointerContract):
    harness_class = metered_harness(PgHarness)
