"""The SQLite store (the embedded default): store, schema and migrations, run queue."""

from threadloom.persistence.sqlite.store import SqliteCheckpointer

__all__ = ["SqliteCheckpointer"]
