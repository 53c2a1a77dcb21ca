"""The PostgreSQL store (several machines): store, configuration, migrations, run queue.

Importing it needs no psycopg; opening a store needs the ``postgres`` extra.
"""

from threadloom.persistence.postgres.store import PostgresCheckpointer, PostgresCheckpointerConfig

__all__ = ["PostgresCheckpointer", "PostgresCheckpointerConfig"]
