"""The store contract suite against every SQLite arrangement (DESIGN §3 "Stores").

One store over a file; two stores over one file with calls alternating between them; and a store that opens the
file afresh for every call (so everything the contract promises must live in the file).
"""

from threadloom.testing.contract import CheckpointerContract
from threadloom.testing.sqlite_harness import SqliteHarness, SqlitePairHarness, SqliteReopeningHarness


class TestSqliteContract(CheckpointerContract):
    harness_class = SqliteHarness


class TestSqlitePairContract(CheckpointerContract):
    harness_class = SqlitePairHarness


class TestSqliteReopeningContract(CheckpointerContract):
    harness_class = SqliteReopeningHarness
