"""The SQLite store (the embedded default), by concern.

- :mod:`~threadloom.persistence.sqlite.store`: :class:`SqliteCheckpointer`, the store's operations;
- :mod:`~threadloom.persistence.sqlite.queue`: its run queue (``store.queue``);
- :mod:`~threadloom.persistence.sqlite.schema`: migrations, every SQL statement, opening a file;
- :mod:`~threadloom.persistence.sqlite.connection`: the pool, group commit and transactions both share;
- :mod:`~threadloom.persistence.sqlite.errors`: sqlite3 errors mapped to threadloom's;
- :mod:`~threadloom.persistence.sqlite.retention`: ``prune`` and ``sweep`` in SQL.
"""

from threadloom.persistence.sqlite.store import SqliteCheckpointer

__all__ = ["SqliteCheckpointer"]
