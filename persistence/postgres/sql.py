"""The statements of the PostgreSQL store and its run queue; the schema itself is in ``migrations/``.

Every statement names its tables through the schema placeholder ``{s}``, which
:meth:`~threadloom.persistence.postgres.calls.Database.render` fills with the schema quoted by
``psycopg.sql.Identifier`` (never with raw text). Each write is one call of a PL/pgSQL function of the schema
(one statement, one round trip); each read is one ``SELECT``. This module imports nothing of psycopg.

What the tables hold (see ``migrations/0001_store.sql``):

* ``threads`` holds one row per thread id: event numbering (``first_seq``, ``next_seq``, ``floor``), the claim,
  the tombstone time, metadata and a copy of the latest checkpoint's registry fields. Every write first locks
  this row (``SELECT … FOR UPDATE``; two rows in id order for a fence) and numbers events from it.
* ``checkpoints``, ``pending_writes``, ``events`` and ``effects`` hold the JSON texts the client encoded, with
  the columns the store's indexes need.
* Commit stamps (``committed_at``, ``updated_at``) are the database clock, made non-decreasing per thread
  (``greatest(clock_timestamp(), last stamp)``) so that what retention removes by age is always a prefix of a
  history or log, found through the primary key in time proportional to what it removes.
"""

from __future__ import annotations

SCHEMA_LOCK_CLASS = 1953263471
"""First key of the transaction-level advisory lock migrations hold (``'tloo'``); the second is the schema's hash."""

QUEUE_LOCK_CLASS = 1953263985
"""First key of the transaction-level advisory lock that serializes the queue writes of one thread (``'tlqq'``);
the second is ``hashtext(thread_id)``. Enqueue and finish take it, so a thread's head is decided by one writer
at a time. A hash collision only makes two threads' enqueues wait for each other."""

LISTEN_LOCK_CLASS = 1953262707
"""First key of the transaction-level advisory lock between commits and listeners (``'tlls'``); the second is
``hashtext`` of the schema's channel. A commit with events holds it in share mode; ``tl_listen`` takes it in
exclusive mode, so a listener registers between commits (migrations/functions/listeners.sql)."""

BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.schema_version (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

VERSION = "SELECT coalesce(max(version), 0) FROM {s}.schema_version"

RECORD_VERSION = "INSERT INTO {s}.schema_version (version) VALUES (%s)"

# -- writes: one statement each -------------------------------------------------------------------------------

CLAIM = "SELECT code, token, expires_at, old_holder, old_tenant, latest FROM {s}.tl_claim(%s, %s, %s, %s)"
RENEW = "SELECT code, current, holder, expires_at, tenant FROM {s}.tl_renew(%s, %s, %s)"
RELEASE = "SELECT {s}.tl_release(%s, %s)"
CURRENT_CLAIM = (
    "SELECT claim_holder, claim_token, claim_expires, claim_tenant FROM {s}.threads "
    "WHERE thread_id = %s AND claim_token IS NOT NULL"
)
COMMIT = (
    "SELECT first_seq, current, fence_current, base, duplicate, latest, stamp_pos, stamp_body FROM {s}.tl_commit("
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, "
    "%s::jsonb, %s)"
)
"""Answers the first event number when applied, else NULL and what each commit check read, or the latest checkpoint
to derive a commit's stamp from (functions/commit.sql)."""
DELETE = "SELECT code, n FROM {s}.tl_delete(%s, %s, %s, %s)"
LISTEN_REGISTER = "SELECT {s}.tl_listen()"
"""Registers the session as a listener of the schema (sent with its ``LISTEN``, in one transaction)."""
UNLISTEN = "DELETE FROM {s}.listeners WHERE pid = %s"
"""Removes a closed store's listener registration (its listening session's backend pid)."""
COMPACT = "SELECT {s}.tl_compact(%s, %s)"
PRUNE = "SELECT {s}.tl_prune(%s, %s, %s, %s)"
SWEEP = "SELECT pruned, reclaimed FROM {s}.tl_sweep(%s, %s, %s, %s, %s, %s)"

# -- the run queue: writes are one function call each; reads one statement -------------------------

Q_ENQUEUE = "SELECT * FROM {s}.tl_q_enqueue(%s, %s, %s, %s, %s)"
Q_LEASE = "SELECT * FROM {s}.tl_q_lease(%s, %s, %s)"
Q_RENEW = "SELECT * FROM {s}.tl_q_renew(%s, %s, %s)"
Q_RECORD = "SELECT * FROM {s}.tl_q_record(%s, %s, %s, %s)"
Q_FINISH = "SELECT * FROM {s}.tl_q_finish(%s, %s, %s, %s)"
Q_RELEASE = "SELECT {s}.tl_q_release(%s, %s, %s, %s)"
Q_RETRY = "SELECT * FROM {s}.tl_q_retry(%s)"

_Q_COLUMNS = (
    "q.entry_id, q.thread_id, q.graph_id, q.input, q.tenant_id, q.status, q.attempts, q.leased_by, "
    "q.lease_expires_at, q.available_at, q.enqueued_at, q.finished_at, q.error, "
    "ARRAY(SELECT r.run_id FROM {s}.run_queue_runs r WHERE r.entry_id = q.entry_id ORDER BY r.position), "
    "q.refunded, q.retried_as"
)
"""An entry as the reads return it: the columns of ``tl_q_result`` after ``code, current, previous``, then
``retried_as`` (migration 14), which the queue functions' answers do not carry."""

Q_ENTRY = "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.entry_id = %s"
Q_ENTRIES = "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.entry_id > %s ORDER BY q.entry_id LIMIT %s"
Q_ENTRIES_OF = (
    "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.status = %s AND q.entry_id > %s "
    "ORDER BY q.entry_id LIMIT %s"
)
# take_lease: one UPDATE of the entry's row, locked first (the subquery reads the holder it replaces).
Q_TAKE_LEASE = (
    "UPDATE {s}.run_queue AS q SET attempts = q.attempts + 1, leased_by = %s, "
    "lease_expires_at = clock_timestamp() + %s * interval '1 microsecond' "
    "FROM (SELECT entry_id, leased_by FROM {s}.run_queue WHERE entry_id = %s FOR UPDATE) AS old "
    "WHERE q.entry_id = old.entry_id AND q.status = 'open' "
    "AND (%s OR q.lease_expires_at IS NULL OR q.lease_expires_at <= clock_timestamp()) "
    "RETURNING old.leased_by, " + _Q_COLUMNS
)
# purge: one page of entries by primary key; its finished, old enough entries and their runs deleted. A finished
# entry is never a thread's head and never changes again, so deleting it needs no lock beyond its row's.
Q_PURGE = (
    "WITH page AS (SELECT entry_id FROM {s}.run_queue WHERE entry_id > %s ORDER BY entry_id LIMIT %s), "
    "gone AS (DELETE FROM {s}.run_queue q USING page WHERE q.entry_id = page.entry_id AND q.status <> 'open' "
    "AND q.finished_at <= clock_timestamp() - %s * interval '1 microsecond' RETURNING q.entry_id), "
    "runs AS (DELETE FROM {s}.run_queue_runs r USING gone WHERE r.entry_id = gone.entry_id) "
    "SELECT (SELECT count(*) FROM page), (SELECT max(entry_id) FROM page), "
    "ARRAY(SELECT entry_id FROM gone ORDER BY entry_id)"
)
# depth: the open entries counted on run_queue_status, the oldest one's enqueue time, and the database's clock.
Q_DEPTH = (
    "SELECT count(*), (SELECT o.enqueued_at FROM {s}.run_queue o WHERE o.status = 'open' ORDER BY o.entry_id"
    " LIMIT 1), statement_timestamp() FROM {s}.run_queue q WHERE q.status = 'open'"
)
Q_OPEN_RUNS = (
    "SELECT q.thread_id, r.run_id FROM {s}.run_queue q JOIN {s}.run_queue_runs r ON r.entry_id = q.entry_id "
    "WHERE q.thread_id = ANY (%s::text[]) AND q.status = 'open'"
)

# -- reads: one statement each, in a REPEATABLE READ READ ONLY transaction --------------------------------------

LATEST = """
SELECT (SELECT c.body FROM {s}.checkpoints c WHERE c.thread_id = t.thread_id AND c.pos = t.latest_pos),
       ARRAY(SELECT p.body FROM {s}.pending_writes p WHERE p.thread_id = t.thread_id ORDER BY p.idx)
FROM {s}.threads t
WHERE t.thread_id = %s AND t.latest_pos IS NOT NULL
"""

CHECKPOINT = "SELECT body FROM {s}.checkpoints WHERE thread_id = %s AND id = %s"

HISTORY = "SELECT body FROM {s}.checkpoints WHERE thread_id = %s ORDER BY pos DESC LIMIT %s"

HISTORY_BEFORE = """
SELECT ARRAY(SELECT c.body FROM {s}.checkpoints c
             WHERE c.thread_id = b.thread_id AND c.pos < b.pos ORDER BY c.pos DESC LIMIT %s)
FROM {s}.checkpoints b WHERE b.thread_id = %s AND b.id = %s
"""

# search_history in one statement: the position below which it reads (NULL: ``before`` is not in the history),
# the oldest checkpoint of its window when one older follows (the window's lower edge: the (scan)th and
# (scan + 1)th positions below, read from the primary key alone), and the window's matches, newest first. A match's
# metadata contains the filter (a JSON object of strings: every key with the same string); a row written before
# version 10 is matched on its body's.
SEARCH_HISTORY = """
WITH b AS (
    SELECT CASE WHEN %s::text IS NULL THEN 9223372036854775807
                ELSE (SELECT c.pos FROM {s}.checkpoints c WHERE c.thread_id = %s AND c.id = %s) END AS below
), edge AS (
    SELECT c.pos FROM {s}.checkpoints c, b
    WHERE c.thread_id = %s AND c.pos < b.below ORDER BY c.pos DESC OFFSET %s LIMIT 2
)
SELECT b.below IS NOT NULL,
       (SELECT c.id FROM {s}.checkpoints c
        WHERE c.thread_id = %s AND c.pos = (SELECT max(e.pos) FROM edge e) AND (SELECT count(*) FROM edge) = 2),
       ARRAY(SELECT c.body FROM {s}.checkpoints c
             WHERE c.thread_id = %s AND c.pos < b.below AND c.pos >= coalesce((SELECT max(e.pos) FROM edge e), -1)
               AND coalesce(c.metadata, c.body::jsonb -> 'metadata') @> %s::jsonb
             ORDER BY c.pos DESC LIMIT %s)
FROM b
"""

CHILDREN = """
SELECT c.child FROM {s}.children c JOIN {s}.threads t ON t.thread_id = c.child
WHERE c.parent = %s AND t.origin_parent = c.parent AND t.latest_id IS NOT NULL
ORDER BY c.place LIMIT %s
"""

CHILDREN_AFTER = """
SELECT ARRAY(SELECT c.child FROM {s}.children c JOIN {s}.threads t ON t.thread_id = c.child
             WHERE c.parent = a.parent AND c.place > a.place AND t.origin_parent = a.parent
               AND t.latest_id IS NOT NULL
             ORDER BY c.place LIMIT %s)
FROM {s}.children a WHERE a.parent = %s AND a.child = %s
"""

EVENTS = """
SELECT t.first_seq, t.floor, (SELECT m.mark FROM {s}.meta m WHERE m.id = 1),
       ARRAY(SELECT e.body FROM {s}.events e WHERE e.thread_id = %s AND e.seq > %s ORDER BY e.seq LIMIT %s)
FROM (SELECT 1) AS one LEFT JOIN {s}.threads t ON t.thread_id = %s
"""

EFFECT = "SELECT body FROM {s}.effects WHERE thread_id = %s AND key = %s"

LOOKUP_RUN = """
SELECT c.body FROM unnest(%s::text[]) AS r(run)
CROSS JOIN LATERAL (SELECT k.pos, k.body FROM {s}.checkpoints k
                    WHERE k.thread_id = %s AND k.run_id = r.run ORDER BY k.pos DESC LIMIT 1) c
ORDER BY c.pos DESC LIMIT 1
"""

SWEEP_PAGE = "SELECT thread_id FROM {s}.threads WHERE thread_id > %s ORDER BY thread_id LIMIT %s"

REGISTRY_COLUMNS = (
    "t.thread_id, t.tenant_id, t.latest_status, coalesce(t.claim_expires > statement_timestamp(), false), "
    "t.metadata::text, t.updated_at, t.latest_id, t.latest_run_id, t.graph_id"
)
"""What a registry row reads; liveness is judged by the database clock when the statement arrives."""

# tenants(): tenant keys after a cursor with their root threads counted, and the tenant-less ('' key) count; both
# walk threads_status (whose partial condition is the root threads') by its leading tenant_key.
TENANTS = (
    "SELECT t.tenant_key, count(*) FROM {s}.threads t WHERE t.tenant_key > %s AND t.latest_id IS NOT NULL"
    " AND t.origin_parent IS NULL AND t.graph_id IS DISTINCT FROM 'threadloom.access-walk'"
    " GROUP BY t.tenant_key ORDER BY t.tenant_key LIMIT %s"
)
TENANTLESS = (
    "SELECT count(*) FROM {s}.threads t WHERE t.tenant_key = '' AND t.latest_id IS NOT NULL"
    " AND t.origin_parent IS NULL AND t.graph_id IS DISTINCT FROM 'threadloom.access-walk'"
)
REGISTRY_ROOTS = (
    "t.tenant_key = %s AND t.latest_id IS NOT NULL AND t.origin_parent IS NULL"
    " AND t.graph_id IS DISTINCT FROM 'threadloom.access-walk'"
)

_UNCLAIMED = "NOT t.deleting AND NOT coalesce(t.claim_expires > statement_timestamp(), false)"

REGISTRY_BRANCHES = {
    "idle": f"t.latest_status = 'running' AND {_UNCLAIMED}",
    "suspended": f"t.latest_status = 'suspended' AND {_UNCLAIMED}",
    "completed": f"t.latest_status = 'completed' AND {_UNCLAIMED}",
    "failed": f"t.latest_status = 'failed' AND {_UNCLAIMED}",
    "running": "t.claim_token IS NOT NULL AND NOT t.deleting AND t.claim_expires > statement_timestamp()",
    "deleted": "t.deleting",
}
"""One disjoint branch per registry status (the values of ``ThreadStatus``), each ordered by its own index:
the status index for the four checkpoint statuses, ``threads_claimed`` for RUNNING, ``threads_deleting`` for
DELETED. Each reads at most ``limit + 1`` rows it returns, plus the rows of its index another status took."""


# -- access stamps (README "Access schemas"; functions/access.sql) -----------------------------------------------

STAMP = "SELECT code, fence_current, changed FROM {s}.tl_stamp(%s, %s, %s, %s, %s, %s, %s::jsonb)"
STAMP_WALK = (
    "SELECT code, fence_current, changed FROM {s}.tl_stamp(%s, %s, %s, %s, %s, %s, %s::jsonb), "
    "set_config('synchronous_commit', 'off', true)"
)
"""``STAMP`` fenced by a walk lease: its transaction commits without waiting for its WAL flush (``synchronous_commit``
off for that transaction only), so a walk adds no flush to the live commits' (those with events wait for each other's
while a store listens, PostgreSQL serializing them on its notification queue). The next commit flushed makes the
stamp durable with it: the walk's record of a page, committed synchronously after the page's stamps, always does. A
server crash may lose the last stamps before it; the walk resumes at its recorded cursor and stamps them again, and
reads fail closed on rows without a stamp of the current schema meanwhile."""
HEARTBEAT = "SELECT {s}.tl_heartbeat(%s, %s, %s::jsonb, %s)"

STAMP_SOURCE = """
SELECT t.graph_id, t.latest_pos, c.body FROM {s}.threads t
LEFT JOIN {s}.checkpoints c ON c.thread_id = t.thread_id AND c.pos = t.latest_pos
WHERE t.thread_id = %s
"""
"""The thread's graph kind, latest position and latest checkpoint (what stamp_thread derives from)."""

GRAPH_THREADS = "SELECT thread_id FROM {s}.threads WHERE graph_id = %s AND thread_id > %s ORDER BY thread_id LIMIT %s"

TENANT_THREADS = """
SELECT thread_id FROM {s}.threads
WHERE tenant_key = %s AND latest_id IS NOT NULL AND thread_id > %s
  AND graph_id IS DISTINCT FROM 'threadloom.access-walk'
ORDER BY thread_id LIMIT %s
"""

TOKEN_HIGH_WATER = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {s}.tokens"

MEMBERS = """
SELECT member, serves::text, expires_at FROM {s}.access_members
WHERE grp = %s AND expires_at > statement_timestamp() ORDER BY member
"""


STAMPED_HISTORY = """
SELECT t.graph_id, ARRAY(SELECT ARRAY[c.body, c.access_schema, c.access_tenant, c.access_attrs::text]
                         FROM {s}.checkpoints c WHERE c.thread_id = t.thread_id ORDER BY c.pos DESC LIMIT %s)
FROM {s}.threads t WHERE t.thread_id = %s
"""

STAMPED_HISTORY_BEFORE = """
SELECT (SELECT t.graph_id FROM {s}.threads t WHERE t.thread_id = b.thread_id),
       ARRAY(SELECT ARRAY[c.body, c.access_schema, c.access_tenant, c.access_attrs::text] FROM {s}.checkpoints c
             WHERE c.thread_id = b.thread_id AND c.pos < b.pos ORDER BY c.pos DESC LIMIT %s)
FROM {s}.checkpoints b WHERE b.thread_id = %s AND b.id = %s
"""

STAMPED_EVENTS = """
SELECT t.first_seq, t.floor, (SELECT m.mark FROM {s}.meta m WHERE m.id = 1), t.graph_id,
       ARRAY(SELECT ARRAY[e.body, e.access_schema, e.access_tenant, e.access_attrs::text] FROM {s}.events e
             WHERE e.thread_id = %s AND e.seq > %s ORDER BY e.seq LIMIT %s)
FROM (SELECT 1) AS one LEFT JOIN {s}.threads t ON t.thread_id = %s
"""

STAMPED_THREAD = """
SELECT t.graph_id,
       ARRAY(SELECT ARRAY[c.body, c.access_schema, c.access_tenant, c.access_attrs::text]
             FROM {s}.checkpoints c WHERE c.thread_id = t.thread_id ORDER BY c.pos),
       ARRAY(SELECT ARRAY[p.body, p.access_schema, p.access_tenant, p.access_attrs::text]
             FROM {s}.pending_writes p WHERE p.thread_id = t.thread_id ORDER BY p.idx),
       ARRAY(SELECT ARRAY[e.body, e.access_schema, e.access_tenant, e.access_attrs::text]
             FROM {s}.events e WHERE e.thread_id = t.thread_id ORDER BY e.seq),
       ARRAY(SELECT ARRAY[f.body, f.access_schema, f.access_tenant, f.access_attrs::text]
             FROM {s}.effects f WHERE f.thread_id = t.thread_id ORDER BY f.key)
FROM {s}.threads t WHERE t.thread_id = %s
"""
