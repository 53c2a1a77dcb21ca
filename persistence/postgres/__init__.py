"""The PostgreSQL store (several machines), by concern:

* :mod:`.store` - :class:`PostgresCheckpointer`, the operations;
* :mod:`.config` - :class:`PostgresCheckpointerConfig` and the call limits;
* :mod:`.conninfo` - connection strings, the schema named in a URL, passwords kept out of text;
* :mod:`.calls` - ``Database``: the one way the package runs a statement (bounded, errors mapped);
* :mod:`.errors` - psycopg's errors as threadloom's kinds (``map_error``);
* :mod:`.watchdog` - client-side deadlines and cancellation;
* :mod:`.listener` - ``LISTEN``/``NOTIFY`` wake-ups of ``await_events_after``;
* :mod:`.schema` and ``migrations/`` - the numbered migrations (``.sql`` files) and the step that applies them;
* :mod:`.sql` - the statements; :mod:`.registry` - ``threads`` and ``incomplete``; :mod:`.queue` - the run queue.

Importing it needs no psycopg; opening a store needs the ``postgres`` extra.
"""

from threadloom.persistence.postgres.config import PostgresCheckpointerConfig
from threadloom.persistence.postgres.store import PostgresCheckpointer

__all__ = ["PostgresCheckpointer", "PostgresCheckpointerConfig"]
