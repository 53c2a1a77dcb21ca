"""Checking a PostgreSQL store's invariants (README "Backup, restore and check").

:func:`check` reads one REPEATABLE READ READ ONLY transaction (one snapshot, writers go on) and hands each thread's
rows to :func:`threadloom.persistence.check.audit_thread`. The database's own storage is the server's business
(``amcheck``, ``pg_dump`` reading every row); this checks threadloom's invariants on the rows.
"""

from __future__ import annotations

from typing import Any

from threadloom.persistence.check import CheckReport, Collector, ThreadRows, audit_thread, orphans
from threadloom.persistence.postgres.calls import Database

_THREADS = (
    "SELECT thread_id, first_seq, next_seq, floor, claim_holder, claim_token, claim_expires, deleted_at, latest_id,"
    " latest_pos, metadata::text, latest_status, latest_run_id FROM {s}.threads ORDER BY thread_id"
)
_CHECKPOINTS = "SELECT pos, id, body FROM {s}.checkpoints WHERE thread_id = %s ORDER BY pos"
_PENDING = "SELECT idx, body FROM {s}.pending_writes WHERE thread_id = %s ORDER BY idx"
_EVENTS = "SELECT seq, body FROM {s}.events WHERE thread_id = %s ORDER BY seq"
_EFFECTS = "SELECT key, body FROM {s}.effects WHERE thread_id = %s ORDER BY key"
_ORPHANS = " UNION ALL ".join(
    f"SELECT '{kind}', thread_id FROM (SELECT DISTINCT thread_id FROM {{s}}.{table}) AS r"
    " WHERE NOT EXISTS (SELECT 1 FROM {s}.threads AS t WHERE t.thread_id = r.thread_id)"
    for kind, table in (("checkpoints", "checkpoints"), ("pending writes", "pending_writes"), ("events", "events"),
                        ("effect records", "effects"))
)
_THREADS_PER_FETCH = 500


def check(db: Database) -> CheckReport:
    """The store's invariants on one snapshot of its schema (see :mod:`threadloom.persistence.check`).

    Raises:
        ProcessingError: the database failed or could not be reached (mapped); nothing was written.
    """
    found = Collector()
    conn, restore = db.checkout("check", None)
    discard = True
    try:
        with conn.transaction():
            cur = db.cursor(conn)
            # One snapshot for the whole check; each statement is small, but the check as a whole is not a call.
            cur.execute(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; SET LOCAL statement_timeout = 0;"
                " SET LOCAL idle_in_transaction_session_timeout = 0"
            )
            cur.execute(db.render("SELECT last_value, is_called FROM {s}.tokens"))
            last_value, is_called = cur.fetchone()
            counter = last_value if is_called else 0
            threads = conn.cursor(name="threadloom_check")  # server-side: thread rows are fetched in pages
            threads.itersize = _THREADS_PER_FETCH
            threads.execute(db.render(_THREADS))
            statements = {name: db.render(text) for name, text in
                          (("cp", _CHECKPOINTS), ("pw", _PENDING), ("ev", _EVENTS), ("ef", _EFFECTS))}
            for row in threads:
                audit_thread(_thread_rows(cur, statements, row), counter, found)
            threads.close()
            cur.execute(db.render(_ORPHANS))
            orphans(found, iter(cur.fetchall()))
        discard = False
    except Exception as error:
        broken = bool(conn.closed or conn.broken)
        raise db.error(error, "check", None, write=False, aborted=None, broken=broken) from None
    finally:
        db.give_back(conn, discard=discard, restore=restore)
    return found.report()


def _thread_rows(cur: Any, statements: dict[str, str], row: tuple[Any, ...]) -> ThreadRows:
    (tid, first_seq, next_seq, floor, holder, token, expires, deleted_at, latest_id, latest_pos, metadata,
     latest_status, latest_run_id) = row

    def rows(name: str) -> list[Any]:
        cur.execute(statements[name], (tid,))
        return list(cur.fetchall())

    return ThreadRows(
        thread_id=tid, first_seq=first_seq, next_seq=next_seq, floor=floor,
        claim_holder=holder, claim_token=token, claim_expires=expires,
        deleted=deleted_at is not None, latest_id=latest_id, latest_position=latest_pos,
        n_checkpoints=None, n_pending=None, metadata=None if metadata in (None, "{}") else metadata,
        checkpoints=rows("cp"), pending=rows("pw"), events=rows("ev"), effects=rows("ef"),
        latest_status=latest_status, latest_run_id=latest_run_id,
    )


__all__ = ["check"]
