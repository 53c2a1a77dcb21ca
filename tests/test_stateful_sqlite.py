"""The stateful comparison machine against SQLite (issue [1] item 6): random claims, commits, releases, clock
advances, deletes, prunes, compactions, sweeps and reads on a SQLite store and on the in-memory reference, with one
shared clock; every answer (value, or error class and fields) must be the same.

One store over a file, and two stores over one file with calls alternating. A few hundred examples in all.
"""

from __future__ import annotations

from threadloom.testing.sqlite_harness import SqliteHarness
from threadloom.testing.stateful import make_state_machine

TestSqliteMatchesReference = make_state_machine(SqliteHarness, max_examples=200, step_count=30).TestCase
TestSqlitePairMatchesReference = make_state_machine(SqliteHarness, pair=True, max_examples=100, step_count=30).TestCase
