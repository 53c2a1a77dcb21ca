"""The SQLite store's schema: its numbered migrations, every SQL statement it runs, and opening a file.

Times are integer microseconds since the Unix epoch (UTC), stamped by the store's clock. Every statement is fixed
text, so sqlite3 prepares it once per connection and reuses it from its statement cache; the registry's queries
(:func:`threads_statement`, :func:`incomplete_statement`) are assembled from fixed pieces. Every call is answered
through one of the indexes of :data:`MIGRATIONS` (the README's "Bounded calls"); the tests read each statement's
query plan from :data:`STATEMENTS`.

Migrations are numbered and recorded in ``schema_version``; :func:`migrate` applies those a file lacks under
``BEGIN IMMEDIATE``, so any number of processes may open a new file at once, and a file of an earlier version is
migrated forward when it is opened. A file of a newer version is refused (``StoreCorrupt``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from threadloom.domain.clock import to_micros
from threadloom.domain.errors import ProcessingError, StoreCorrupt
from threadloom.domain.values import ThreadCursor, ThreadQuery
from threadloom.persistence.sqlite.errors import is_busy
from threadloom.persistence.sqlite.queue import QUEUE_MIGRATION

JOURNAL_MODE = "WAL"
"""The journal mode the store puts its file in (persistent in the file)."""

JOURNAL_RETRY_FIRST_PAUSE_S = 0.002
"""First pause, in seconds, before retrying ``PRAGMA journal_mode`` that met another opener (doubles each time)."""

JOURNAL_RETRY_MAX_PAUSE_S = 0.05
"""Longest pause, in seconds, between retries of ``PRAGMA journal_mode`` (retries end at the busy timeout)."""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the whole schema. Every call's query is answered through one of these indexes.
    (
        # The store-wide row: the token counter and the reclamation mark.
        "CREATE TABLE store ("
        " id INTEGER PRIMARY KEY CHECK (id = 1),"
        " last_token INTEGER NOT NULL,"
        " mark INTEGER NOT NULL)",
        "INSERT INTO store (id, last_token, mark) VALUES (1, 0, 0)",
        # One row per thread the store holds (tombstones included): its claim, numbering, metadata, and its
        # latest checkpoint's registry fields, denormalized so the registry never reads a checkpoint body.
        "CREATE TABLE threads ("
        " thread_id TEXT PRIMARY KEY NOT NULL,"
        " claim_holder TEXT, claim_token INTEGER, claim_expires INTEGER, claim_tenant TEXT,"
        " first_seq INTEGER NOT NULL, next_seq INTEGER NOT NULL, floor INTEGER NOT NULL,"
        " n_checkpoints INTEGER NOT NULL DEFAULT 0,"
        " n_pending INTEGER NOT NULL DEFAULT 0,"
        " metadata TEXT,"
        " deleting INTEGER NOT NULL DEFAULT 0,"
        " updated_at INTEGER, deleted_at INTEGER,"
        " latest_id TEXT, latest_position INTEGER, latest_status TEXT, latest_run_id TEXT,"
        " latest_tenant TEXT, latest_graph_id TEXT, origin_parent TEXT"
        ") WITHOUT ROWID",
        # threads(): a tenant's root threads by (updated_at, thread_id).
        "CREATE INDEX threads_registry ON threads (latest_tenant, updated_at, thread_id)"
        " WHERE origin_parent IS NULL AND latest_id IS NOT NULL",
        # incomplete(): a tenant's root threads whose latest checkpoint is RUNNING and no cascade delete began.
        "CREATE INDEX threads_incomplete ON threads (latest_tenant, updated_at, thread_id)"
        " WHERE origin_parent IS NULL AND latest_status = 'running' AND deleting = 0",
        # Tables keyed by (thread, ...) are WITHOUT ROWID: the key's b-tree holds the row, so a write touches
        # one b-tree fewer (fewer WAL frames per commit); secondary indexes carry the key's columns.
        # The history: position increases with each commit of a checkpoint to the thread.
        "CREATE TABLE checkpoints ("
        " thread_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, run_id TEXT NOT NULL,"
        " settled INTEGER NOT NULL, committed_at INTEGER NOT NULL, seq_mark INTEGER NOT NULL,"
        " body TEXT NOT NULL, PRIMARY KEY (thread_id, position)) WITHOUT ROWID",
        "CREATE UNIQUE INDEX checkpoints_id ON checkpoints (thread_id, id)",
        "CREATE INDEX checkpoints_run ON checkpoints (thread_id, run_id, position)",
        "CREATE INDEX checkpoints_age ON checkpoints (thread_id, committed_at, position)",
        "CREATE INDEX checkpoints_settled ON checkpoints (thread_id, position) WHERE settled = 1",
        # The latest checkpoint's pending writes, in commit order.
        "CREATE TABLE pending ("
        " thread_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, idx)) WITHOUT ROWID",
        "CREATE TABLE events ("
        " thread_id TEXT NOT NULL, seq INTEGER NOT NULL, committed_at INTEGER NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, seq)) WITHOUT ROWID",
        "CREATE INDEX events_age ON events (thread_id, committed_at, seq)",
        "CREATE TABLE effects ("
        " thread_id TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL,"
        " PRIMARY KEY (thread_id, key)) WITHOUT ROWID",
        # Each child's place among a parent's children (the order of its first commit with that origin);
        # ``listed`` is 1 while the child's latest checkpoint names the parent.
        "CREATE TABLE children ("
        " place INTEGER PRIMARY KEY, parent TEXT NOT NULL, child TEXT NOT NULL, listed INTEGER NOT NULL)",
        "CREATE UNIQUE INDEX children_pair ON children (parent, child)",
        "CREATE INDEX children_child ON children (child)",
        "CREATE INDEX children_listed ON children (parent, place) WHERE listed = 1",
    ),
    # 2: the durable run queue: tables run_queue and run_queue_runs, see
    # :mod:`threadloom.persistence.sqlite.queue` for the columns and the call each index answers.
    QUEUE_MIGRATION,
    # 3: when the claim was last granted or renewed, by the clock of the process that did it: another process
    # reading it in its own future finds a skewed clock (persistence/sqlite/skew.py).
    ("ALTER TABLE threads ADD COLUMN claim_stamped INTEGER",),
    # 4: how many of an entry's leases were handed back with a refund (a worker that stopped): they do not count
    # as tries against ServePolicy.max_attempts (persistence/queue.py, release_lease).
    ("ALTER TABLE run_queue ADD COLUMN refunded INTEGER NOT NULL DEFAULT 0",),
    # 5: access stamps (README "Access schemas"): every row kind carries the schema hash, the tenant and the
    # declared attributes (JSON text) of its thread when it was written or last stamped; rows written before are
    # NULL. The thread row keeps its latest checkpoint's stamp (a commit without a checkpoint reuses it). Indexes:
    # each row table by tenant (per-tenant export, erase), threads by graph kind (the walks' pages) and by tenant
    # (export_tenant's pages). Membership of the walks' groups, with expiry by the store's clock.
    tuple(
        f"ALTER TABLE {table} ADD COLUMN {column} TEXT"
        for table in ("checkpoints", "pending", "events", "effects", "threads")
        for column in ("access_schema", "access_tenant", "access_attrs")
    )
    + tuple(
        f"CREATE INDEX {table}_access_tenant ON {table} (access_tenant, thread_id)"
        for table in ("checkpoints", "pending", "events", "effects")
    )
    + (
        "CREATE INDEX threads_graph ON threads (latest_graph_id, thread_id) WHERE latest_graph_id IS NOT NULL",
        "CREATE INDEX threads_tenant ON threads (latest_tenant, thread_id) WHERE latest_id IS NOT NULL",
        "CREATE TABLE access_members ("
        " grp TEXT NOT NULL, member TEXT NOT NULL, serves TEXT NOT NULL, expires_at INTEGER NOT NULL,"
        " PRIMARY KEY (grp, member)) WITHOUT ROWID",
    ),
    # 6: fewer index entries per commit. The tenant indexes of the row tables hold stamped rows only (a store
    # with no access schema writes none: NULL tenants were one index entry per row, never read), and
    # threads_tenant's condition is one the commit of a checkpoint does not change (latest_graph_id is set and
    # cleared with latest_id), so a commit that keeps the thread's tenant and graph leaves it alone.
    tuple(
        statement
        for table in ("checkpoints", "pending", "events", "effects")
        for statement in (
            f"DROP INDEX {table}_access_tenant",
            f"CREATE INDEX {table}_access_tenant ON {table} (access_tenant, thread_id)"
            " WHERE access_tenant IS NOT NULL",
        )
    )
    + (
        "DROP INDEX threads_tenant",
        "CREATE INDEX threads_tenant ON threads (latest_tenant, thread_id) WHERE latest_graph_id IS NOT NULL",
    ),
    # 7: each checkpoint's metadata (a JSON object) in a column of its own, which search_history reads instead
    # of the whole body. Rows written before are NULL: search_history reads their metadata from the body.
    ("ALTER TABLE checkpoints ADD COLUMN metadata TEXT",),
    # 8: fewer index entries per commit. A commit stamps its checkpoint and events no earlier than the thread's
    # last stamp (``stamped_at``), so the stamps never decrease along a history or a log: what retention removes
    # by age is a prefix of each, found through the primary key from the oldest row in time proportional to what
    # it removes, and the (thread_id, committed_at) indexes, one entry each per commit, go.
    # The runs' index holds the first checkpoint of each run's stretch of a history only (``run_start`` is 1 when
    # the checkpoint before it, by position, is of another run or there is none): a step of the same run writes
    # no entry. A run's newest checkpoint is the newest before the next stretch's start (checkpoints_start).
    (
        "ALTER TABLE threads ADD COLUMN stamped_at INTEGER",
        "DROP INDEX checkpoints_age",
        "DROP INDEX events_age",
        "ALTER TABLE checkpoints ADD COLUMN run_start INTEGER",
        "UPDATE checkpoints SET run_start = 1 WHERE (SELECT p.run_id FROM checkpoints AS p"
        " WHERE p.thread_id = checkpoints.thread_id AND p.position < checkpoints.position"
        " ORDER BY p.position DESC LIMIT 1) IS NOT run_id",
        "DROP INDEX checkpoints_run",
        "CREATE INDEX checkpoints_run ON checkpoints (thread_id, run_id, position) WHERE run_start = 1",
        "CREATE INDEX checkpoints_start ON checkpoints (thread_id, position) WHERE run_start = 1",
    ),
    # 9: one registry index instead of two. Every commit of a checkpoint moves ``updated_at``, which both
    # threads_registry and threads_incomplete held, so each commit rewrote an entry (and a page) of each. One index
    # now answers both calls: its second column is 1 for a root thread whose latest checkpoint is RUNNING and whose
    # cascade delete has not begun (what incomplete() lists, a range of it), else 0; threads() merges the two
    # ranges of a tenant by (updated_at, thread_id) (:func:`threads_statement`).
    (
        "DROP INDEX threads_incomplete",
        "DROP INDEX threads_registry",
        "CREATE INDEX threads_registry ON threads (latest_tenant, (latest_status = 'running' AND deleting = 0),"
        " updated_at, thread_id) WHERE origin_parent IS NULL AND latest_id IS NOT NULL",
    ),
    # 10: the entry a retry of a FAILED run-queue entry enqueued (RunQueue.retry: at most once per entry);
    # NULL while it was not retried.
    ("ALTER TABLE run_queue ADD COLUMN retried_as INTEGER",),
)
"""Numbered migrations: ``MIGRATIONS[n - 1]`` takes the schema from version ``n - 1`` to ``n``."""

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes; a file of a newer version is refused."""

# -- statements, by the operation that runs them -----------------------------------------------------------------

TOKEN = "UPDATE store SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token, mark"
CLAIM_READ = (
    "SELECT claim_holder, claim_token, claim_expires, claim_tenant, latest_id, claim_stamped, updated_at,"
    " latest_run_id FROM threads WHERE thread_id = ?"
)
CLAIM_WRITE = (
    "INSERT INTO threads (thread_id, claim_holder, claim_token, claim_expires, claim_tenant,"
    " first_seq, next_seq, floor, claim_stamped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id) DO UPDATE SET claim_holder = excluded.claim_holder,"
    " claim_token = excluded.claim_token, claim_expires = excluded.claim_expires,"
    " claim_tenant = excluded.claim_tenant, claim_stamped = excluded.claim_stamped"
)
TOKEN_OF = "SELECT claim_token FROM threads WHERE thread_id = ?"
RENEW_READ = "SELECT claim_holder, claim_token, claim_tenant FROM threads WHERE thread_id = ?"
RENEW = "UPDATE threads SET claim_expires = ?, claim_stamped = ? WHERE thread_id = ?"
CURRENT_CLAIM = (
    "SELECT claim_holder, claim_token, claim_expires, claim_tenant FROM threads"
    " WHERE thread_id = ? AND claim_token IS NOT NULL"
)
RELEASE_READ = (
    "SELECT claim_token, latest_id, n_pending, metadata, deleted_at, first_seq, next_seq FROM threads"
    " WHERE thread_id = ?"
)
RELEASE = (
    "UPDATE threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL"
    " WHERE thread_id = ?"
)
FORGETTABLE = (
    "SELECT (SELECT mark FROM store WHERE id = 1),"
    " EXISTS (SELECT 1 FROM effects WHERE thread_id = ?1),"
    " EXISTS (SELECT 1 FROM children WHERE child = ?1)"
)
FORGET = "DELETE FROM threads WHERE thread_id = ?"
COMMIT_READ = (
    "SELECT claim_token, next_seq, n_checkpoints, n_pending, metadata, deleting, updated_at,"
    " latest_id, latest_position, latest_status, latest_run_id, latest_tenant, latest_graph_id, origin_parent,"
    " stamped_at, access_schema, access_tenant, access_attrs FROM threads WHERE thread_id = ?"
)
# INDEXED BY: else the planner may walk the history backwards from the latest until a settled checkpoint.
NEWEST_SETTLED = (
    "SELECT position, id FROM checkpoints INDEXED BY checkpoints_settled WHERE thread_id = ? AND settled = 1"
    " ORDER BY position DESC LIMIT 1"
)
HAS_CHECKPOINT = "SELECT 1 FROM checkpoints WHERE thread_id = ? AND id = ?"
CUT_HISTORY = "DELETE FROM checkpoints WHERE thread_id = ? AND position > ?"
# The run of the newest checkpoint at or below a position (what a checkpoint inserted above it follows).
RUN_AT = "SELECT run_id FROM checkpoints WHERE thread_id = ? AND position <= ? ORDER BY position DESC LIMIT 1"
# The insert is also the duplicate check of commit rule 3: the (thread_id, id) unique index refuses an id the
# history holds, and the caller reads a rowcount of 0 as "already in the history".
INSERT_CHECKPOINT = (
    "INSERT INTO checkpoints (thread_id, position, id, run_id, settled, committed_at, seq_mark, body, metadata,"
    " run_start, access_schema, access_tenant, access_attrs)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (thread_id, id) DO NOTHING"
)
DROP_PENDING = "DELETE FROM pending WHERE thread_id = ?"
# A new checkpoint's pending writes take the old latest's places 0, 1, ... in place (an update of the row, not a
# delete and an insert); only the old writes past the new ones are deleted (DROP_PENDING_FROM).
PUT_PENDING = (
    "INSERT INTO pending (thread_id, idx, body, access_schema, access_tenant, access_attrs) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, idx) DO UPDATE SET body = excluded.body, access_schema = excluded.access_schema,"
    " access_tenant = excluded.access_tenant, access_attrs = excluded.access_attrs"
)
DROP_PENDING_FROM = "DELETE FROM pending WHERE thread_id = ? AND idx >= ?"
INSERT_EVENT = (
    "INSERT INTO events (thread_id, seq, committed_at, body, access_schema, access_tenant, access_attrs)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
INSERT_EFFECT = (
    "INSERT INTO effects (thread_id, key, body, access_schema, access_tenant, access_attrs) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (thread_id, key) DO NOTHING"
)
UNLIST_CHILD = "UPDATE children SET listed = 0 WHERE parent = ? AND child = ?"
LIST_CHILD = (
    "INSERT INTO children (parent, child, listed) VALUES (?, ?, 1)"
    " ON CONFLICT (parent, child) DO UPDATE SET listed = 1"
)
# A commit with neither checkpoint nor metadata leaves the registry's indexed columns alone: this narrower
# statement does not rewrite their index entries.
COMMIT_WRITE_LOG = "UPDATE threads SET next_seq = ?, n_pending = ?, stamped_at = ? WHERE thread_id = ?"
COMMIT_WRITE = (
    "UPDATE threads SET next_seq = ?, n_checkpoints = ?, n_pending = ?, metadata = ?, deleting = ?,"
    " updated_at = ?, latest_id = ?, latest_position = ?, latest_status = ?, latest_run_id = ?,"
    " latest_tenant = ?, latest_graph_id = ?, origin_parent = ?, stamped_at = ?, access_schema = ?,"
    " access_tenant = ?, access_attrs = ? WHERE thread_id = ?"
)
# The commit of a checkpoint that keeps the thread's tenant, graph and origin (every step of a run): the columns
# it leaves out are in threads_graph, threads_tenant and children's listing, whose entries then stay untouched.
COMMIT_WRITE_STEP = (
    "UPDATE threads SET next_seq = ?, n_checkpoints = ?, n_pending = ?, metadata = ?, deleting = ?,"
    " updated_at = ?, latest_id = ?, latest_position = ?, latest_status = ?, latest_run_id = ?, stamped_at = ?,"
    " access_schema = ?, access_tenant = ?, access_attrs = ? WHERE thread_id = ?"
)
# The latest checkpoint's body, to derive a stamp when the thread's is of another schema (an older node's commit).
LATEST_BODY = "SELECT body FROM checkpoints WHERE thread_id = ? AND position = ?"
# The latest checkpoint (kind 0) and its pending writes (kind 1) in one statement: one snapshot, no transaction.
LATEST = (
    "SELECT 0, 0, body FROM (SELECT body FROM checkpoints WHERE thread_id = ?1 ORDER BY position DESC LIMIT 1)"
    " UNION ALL SELECT 1, idx, body FROM pending WHERE thread_id = ?1"
)
CHECKPOINT = "SELECT body FROM checkpoints WHERE thread_id = ? AND id = ?"
POSITION_OF = "SELECT position FROM checkpoints WHERE thread_id = ? AND id = ?"
# search_history: the window's checkpoints below position ?2, newest first (?4: the window's size plus one, to
# learn whether older ones follow), each with its body when it holds every key of the filter ?3 (a JSON object of
# strings) with the same string, else NULL. The caller stops reading once it has enough matches. A row written
# before migration 7 has no metadata column: its body's is read.
SEARCH_HISTORY = (
    "SELECT c.id, CASE WHEN NOT EXISTS (SELECT 1 FROM json_each(?3) AS f WHERE NOT EXISTS ("
    "SELECT 1 FROM json_each(coalesce(c.metadata, json_extract(c.body, '$.metadata'))) AS m"
    " WHERE m.key = f.key AND m.value = f.value)) THEN c.body END"
    " FROM checkpoints AS c WHERE c.thread_id = ?1 AND c.position < ?2 ORDER BY c.position DESC LIMIT ?4"
)
HISTORY = "SELECT body FROM checkpoints WHERE thread_id = ? ORDER BY position DESC LIMIT ?"
HISTORY_BEFORE = (
    "SELECT body FROM checkpoints WHERE thread_id = ? AND position < ? ORDER BY position DESC LIMIT ?"
)
PLACE_OF = "SELECT place FROM children WHERE parent = ? AND child = ?"
CHILDREN = "SELECT child FROM children WHERE parent = ? AND listed = 1 AND place > ? ORDER BY place LIMIT ?"
# The thread's numbering (seq NULL) and its events after ``after_seq`` in one statement. Every stored event has
# seq >= floor >= first_seq, so ``seq > after_seq`` selects what ``seq > read_start(...)`` would.
EVENTS = (
    "SELECT NULL, t.first_seq, t.floor, s.mark FROM store AS s LEFT JOIN threads AS t ON t.thread_id = ?1"
    " WHERE s.id = 1"
    " UNION ALL SELECT * FROM (SELECT seq, NULL, NULL, body FROM events WHERE thread_id = ?1 AND seq > ?2"
    " ORDER BY seq LIMIT ?3)"
)
COMPACT_READ = "SELECT floor, next_seq FROM threads WHERE thread_id = ?"
SET_FLOOR = "UPDATE threads SET floor = ? WHERE thread_id = ?"
DROP_EVENTS_BEFORE = "DELETE FROM events WHERE thread_id = ? AND seq < ?"
DELETE_READ = "SELECT claim_token, first_seq, next_seq, origin_parent FROM threads WHERE thread_id = ?"
DELETE_CHECKPOINTS = "DELETE FROM checkpoints WHERE thread_id = ?"
DELETE_EVENTS = "DELETE FROM events WHERE thread_id = ?"
DELETE_EFFECTS = "DELETE FROM effects WHERE thread_id = ?"
TOMBSTONE = (
    "UPDATE threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL,"
    " first_seq = coalesce(?1, first_seq), next_seq = coalesce(?1, next_seq), floor = coalesce(?1, floor),"
    " n_checkpoints = 0, n_pending = 0, metadata = NULL, deleting = 0, updated_at = NULL, deleted_at = ?2,"
    " latest_id = NULL, latest_position = NULL, latest_status = NULL, latest_run_id = NULL,"
    " latest_tenant = NULL, latest_graph_id = NULL, origin_parent = NULL, access_schema = NULL,"
    " access_tenant = NULL, access_attrs = NULL WHERE thread_id = ?3"
)
EFFECT = "SELECT body FROM effects WHERE thread_id = ? AND key = ?"
# The newest checkpoint (by position) of each run of a JSON array (NULL: none): the newest start of a stretch of
# the run (checkpoints_run), then the newest checkpoint before the next stretch's start (checkpoints_start).
_RUN_NEWEST = (
    "SELECT (SELECT max(e.position) FROM checkpoints AS e WHERE e.thread_id = ?1 AND e.position >= s.p"
    " AND e.position < coalesce((SELECT min(n.position) FROM checkpoints AS n INDEXED BY checkpoints_start"
    " WHERE n.thread_id = ?1 AND n.run_start = 1 AND n.position > s.p), 9223372036854775807)) AS q"
    " FROM (SELECT (SELECT max(position) FROM checkpoints INDEXED BY checkpoints_run"
    " WHERE thread_id = ?1 AND run_id = j.value AND run_start = 1) AS p FROM json_each(?2) AS j) AS s"
)
# The newest checkpoint (by position) of any of the runs in a JSON array: a few index probes per run.
LOOKUP_RUN = (
    "SELECT body FROM checkpoints WHERE thread_id = ?1 AND position = (SELECT max(q) FROM (" + _RUN_NEWEST + "))"
)
PROTECTED_POSITIONS = _RUN_NEWEST
PRUNE_READ = (
    "SELECT claim_token, first_seq, next_seq, floor, n_checkpoints, latest_position, n_pending, metadata,"
    " deleted_at FROM threads WHERE thread_id = ?"
)
COUNT_CUTOFF = "SELECT position FROM checkpoints WHERE thread_id = ? ORDER BY position LIMIT 1 OFFSET ?"
# Retention by age (stamps never decrease along a history or a log, see migration 8): the oldest checkpoint's
# position and the oldest position stamped after the threshold; the scan from the oldest row passes only the
# expired ones, which the prune then removes (or the kept newest checkpoints of protected runs).
AGE_CUTOFF = (
    "SELECT (SELECT position FROM checkpoints WHERE thread_id = ?1 ORDER BY position LIMIT 1),"
    " (SELECT position FROM checkpoints WHERE thread_id = ?1 AND committed_at > ?2 ORDER BY position LIMIT 1)"
)
OLDEST_KEPT = (
    "SELECT seq_mark, position FROM checkpoints WHERE thread_id = ? AND position >= ? ORDER BY position LIMIT 1"
)
PRUNE_BEFORE = "DELETE FROM checkpoints WHERE thread_id = ? AND position < ?"
PRUNE_BEFORE_KEEP = (
    "DELETE FROM checkpoints WHERE thread_id = ? AND position < ? AND position NOT IN (SELECT value FROM json_each(?))"
)
# After a prune: the checkpoints at or below a position (the oldest the policy kept, and the kept ones of protected
# runs before it) start a run's stretch when the one before them is of another run or there is none.
RESTART_RUNS = (
    "UPDATE checkpoints SET run_start = CASE WHEN (SELECT p.run_id FROM checkpoints AS p WHERE p.thread_id = ?1"
    " AND p.position < checkpoints.position ORDER BY p.position DESC LIMIT 1) IS NOT run_id THEN 1 END"
    " WHERE thread_id = ?1 AND position <= ?2"
)
# The newest event stamped at or before the threshold: the one before the oldest stamped after it (the scan from
# the oldest event passes only expired events, which the prune then removes).
NEWEST_EXPIRED_EVENT = (
    "SELECT max(seq) FROM events WHERE thread_id = ?1 AND seq < coalesce("
    "(SELECT seq FROM events WHERE thread_id = ?1 AND committed_at > ?2 ORDER BY seq LIMIT 1), 9223372036854775807)"
)
PRUNED = "UPDATE threads SET floor = ?, n_checkpoints = ? WHERE thread_id = ?"
# Thread ids are never empty, so ``after = ''`` starts at the first thread.
SWEEP_PAGE = "SELECT thread_id FROM threads WHERE thread_id > ? ORDER BY thread_id LIMIT ?"
HAS_EFFECTS = "SELECT 1 FROM effects WHERE thread_id = ? LIMIT 1"
RAISE_MARK = "UPDATE store SET mark = max(mark, ?) WHERE id = 1"
RECLAIM_CHILD = "DELETE FROM children WHERE child = ?"
REGISTRY_SELECT = (
    "SELECT thread_id, latest_tenant, latest_status, claim_token, claim_expires, metadata, updated_at, latest_id,"
    " latest_run_id, latest_graph_id FROM threads"
)
# ThreadStatus as rules.thread_status decides it, for filtering in SQL (``:now`` is the store clock's reading).
STATUS_CASE = (
    "(CASE WHEN deleting = 1 THEN 'deleted'"
    " WHEN claim_token IS NOT NULL AND claim_expires > :now THEN 'running'"
    " WHEN latest_status = 'running' THEN 'idle' ELSE latest_status END)"
)
# threads_registry's second column (migration 9): 1 for a thread whose latest checkpoint is RUNNING and whose
# cascade delete has not begun, else 0 (a registry row always has a latest status). The queries compare this very
# text to 0 or 1 and name neither column alone besides: a plain ``latest_status = 'running'`` term would let SQLite
# substitute the constant into the expression, which then no longer matches the index's.
OPEN = "(latest_status = 'running' AND deleting = 0)"
OPEN_STATUSES = frozenset({"running", "idle"})
"""What STATUS_CASE makes of a row with OPEN = 1; a row with OPEN = 0 is never ``idle``."""
INCOMPLETE_SELECT = (
    REGISTRY_SELECT + f" WHERE latest_tenant IS :tenant AND {OPEN} = 1 AND origin_parent IS NULL"
    " AND latest_id IS NOT NULL AND (claim_token IS NULL OR claim_expires <= :now)"
    " AND latest_graph_id IS NOT 'threadloom.access-walk'"
)

# -- access (README "Access schemas") --------------------------------------------------------------------------------
# The stamp columns of a row: (access_schema, access_tenant, access_attrs), ?1..?3; the thread ?4.
_RESTAMP = (
    " SET access_schema = ?1, access_tenant = ?2, access_attrs = ?3 WHERE thread_id = ?4"
    " AND (access_schema IS NOT ?1 OR access_tenant IS NOT ?2 OR access_attrs IS NOT ?3)"
)
STAMP_READ = "SELECT latest_graph_id, latest_position FROM threads WHERE thread_id = ?"
RESTAMP_CHECKPOINTS = "UPDATE checkpoints" + _RESTAMP
RESTAMP_PENDING = "UPDATE pending" + _RESTAMP
RESTAMP_EVENTS = "UPDATE events" + _RESTAMP
RESTAMP_EFFECTS = "UPDATE effects" + _RESTAMP
RESTAMP_THREAD = "UPDATE threads SET access_schema = ?, access_tenant = ?, access_attrs = ? WHERE thread_id = ?"
GRAPH_THREADS = (
    "SELECT thread_id FROM threads WHERE latest_graph_id = ? AND thread_id > ? ORDER BY thread_id LIMIT ?"
)
TENANT_THREADS = (
    "SELECT thread_id FROM threads WHERE latest_tenant IS ? AND latest_graph_id IS NOT NULL AND thread_id > ?"
    " AND latest_graph_id IS NOT 'threadloom.access-walk' ORDER BY thread_id LIMIT ?"
)
TOKEN_HIGH_WATER = "SELECT last_token FROM store WHERE id = 1"
EXPIRE_MEMBERS = "DELETE FROM access_members WHERE grp = ? AND expires_at <= ?"
HEARTBEAT = (
    "INSERT INTO access_members (grp, member, serves, expires_at) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (grp, member) DO UPDATE SET serves = excluded.serves, expires_at = excluded.expires_at"
)
MEMBERS = "SELECT member, serves, expires_at FROM access_members WHERE grp = ? AND expires_at > ? ORDER BY member"
THREAD_GRAPH = "SELECT latest_graph_id FROM threads WHERE thread_id = ?"
STAMPED_HISTORY = (
    "SELECT body, access_schema, access_tenant, access_attrs FROM checkpoints WHERE thread_id = ?"
    " ORDER BY position DESC LIMIT ?"
)
STAMPED_HISTORY_BEFORE = (
    "SELECT body, access_schema, access_tenant, access_attrs FROM checkpoints WHERE thread_id = ? AND position < ?"
    " ORDER BY position DESC LIMIT ?"
)
EVENTS_HEADER = (
    "SELECT t.first_seq, t.floor, s.mark, t.latest_graph_id FROM store AS s LEFT JOIN threads AS t"
    " ON t.thread_id = ? WHERE s.id = 1"
)
STAMPED_EVENTS = (
    "SELECT body, access_schema, access_tenant, access_attrs FROM events WHERE thread_id = ? AND seq > ?"
    " ORDER BY seq LIMIT ?"
)
ALL_CHECKPOINTS = (
    "SELECT body, access_schema, access_tenant, access_attrs FROM checkpoints WHERE thread_id = ? ORDER BY position"
)
ALL_PENDING = "SELECT body, access_schema, access_tenant, access_attrs FROM pending WHERE thread_id = ? ORDER BY idx"
ALL_EVENTS = "SELECT body, access_schema, access_tenant, access_attrs FROM events WHERE thread_id = ? ORDER BY seq"
ALL_EFFECTS = "SELECT body, access_schema, access_tenant, access_attrs FROM effects WHERE thread_id = ? ORDER BY key"


# tenants(): the registry's tenants in order after a cursor, with their root threads counted, and the count of the
# tenant-less root threads; both walk a range of threads_registry (its partial condition is the root threads').
TENANTS = (
    "SELECT latest_tenant, count(*) FROM threads INDEXED BY threads_registry"
    " WHERE latest_tenant > ? AND origin_parent IS NULL AND latest_id IS NOT NULL"
    " AND latest_graph_id IS NOT 'threadloom.access-walk'"
    " GROUP BY latest_tenant ORDER BY latest_tenant LIMIT ?"
)
TENANTLESS = (
    "SELECT count(*) FROM threads INDEXED BY threads_registry"
    " WHERE latest_tenant IS NULL AND origin_parent IS NULL AND latest_id IS NOT NULL"
    " AND latest_graph_id IS NOT 'threadloom.access-walk'"
)


STATEMENTS: Mapping[str, str] = {
    name: text
    for name, text in dict(globals()).items()
    if name.isupper() and isinstance(text, str) and text.startswith(("SELECT", "INSERT", "UPDATE", "DELETE"))
    and name not in ("REGISTRY_SELECT", "INCOMPLETE_SELECT")
}
"""Every fixed statement of the store by name (the registry's pieces excepted; the tests read their query plans)."""


# -- the registry's queries -----------------------------------------------------------------------------------------


def threads_statement(query: ThreadQuery, now_us: int) -> tuple[str, dict[str, Any]] | None:
    """The statement and parameters of ``threads(query)`` at the store time ``now_us``: a tenant's root threads,
    newest ``updated_at`` first, at most ``query.limit + 1`` rows; None when ``query.statuses`` is empty.

    threads_registry holds a tenant's root threads in two ranges by :data:`OPEN` (0, then 1), each in
    ``(updated_at, thread_id)`` order: the statement reads each range that may hold a wanted status, newest first,
    and merges them (``UNION ALL`` with an ``ORDER BY``, which SQLite answers by merging the ranges as they are
    read), so it reads at most ``limit + 1`` index entries from each range besides those the filters skip."""
    where = [
        " AND origin_parent IS NULL AND latest_id IS NOT NULL AND latest_graph_id IS NOT 'threadloom.access-walk'"
    ]
    params: dict[str, Any] = {"tenant": query.tenant_id, "now": now_us, "limit": query.limit + 1}
    if query.after is not None:
        where.append(" AND (updated_at, thread_id) < (:after_at, :after_id)")
        params["after_at"] = to_micros(query.after.updated_at)
        params["after_id"] = query.after.thread_id
    if query.updated_since is not None:
        where.append(" AND updated_at >= :since")
        params["since"] = to_micros(query.updated_since)
    if query.graph_id is not None:
        where.append(" AND latest_graph_id = :graph")
        params["graph"] = query.graph_id
    ranges: tuple[int, ...] = (0, 1)
    if query.statuses is not None:
        names = sorted(status.value for status in query.statuses)
        if not names:
            return None
        where.append(f" AND {STATUS_CASE} IN ({', '.join(f':s{i}' for i in range(len(names)))})")
        params.update({f"s{i}": name for i, name in enumerate(names)})
        ranges = tuple(
            value for value in (0, 1) if (OPEN_STATUSES & set(names) if value else set(names) - {"idle"})
        )
    rest = "".join(where)
    arms = [f"{REGISTRY_SELECT} WHERE latest_tenant IS :tenant AND {OPEN} = {value}{rest}" for value in ranges]
    return " UNION ALL ".join(arms) + " ORDER BY updated_at DESC, thread_id DESC LIMIT :limit", params


def incomplete_statement(
    tenant_id: str | None, limit: int, after: ThreadCursor | None, now_us: int
) -> tuple[str, dict[str, Any]]:
    """The statement and parameters of ``incomplete(...)`` at the store time ``now_us``: a tenant's idle root
    threads, oldest ``updated_at`` first, at most ``limit + 1`` rows."""
    params: dict[str, Any] = {"tenant": tenant_id, "now": now_us, "limit": limit + 1}
    sql = INCOMPLETE_SELECT
    if after is not None:
        sql += " AND (updated_at, thread_id) > (:after_at, :after_id)"
        params["after_at"] = to_micros(after.updated_at)
        params["after_id"] = after.thread_id
    return sql + " ORDER BY updated_at, thread_id LIMIT :limit", params


# -- opening a file -------------------------------------------------------------------------------------------------


def migrate(conn: sqlite3.Connection, *, path: str, now_us: int, busy_s: float) -> None:
    """Puts the file in WAL mode and applies the numbered migrations it lacks, in one ``BEGIN IMMEDIATE``.

    Args:
        conn: a connection to the file, in autocommit mode (no transaction open).
        path: the file (named in errors).
        now_us: the store clock's reading, recorded as each migration's ``applied_at``.
        busy_s: how long, in seconds, to retry switching the journal mode while other openers hold the file.

    Raises:
        StoreCorrupt: the file's schema is newer than this code's.
        ProcessingError: the file cannot use WAL journaling (a filesystem without shared memory).
        sqlite3.Error: as the driver raised it (the caller maps it).
    """
    mode = _set_journal_mode(conn, busy_s)
    if str(mode).upper() != JOURNAL_MODE:
        raise ProcessingError(
            "open", f"the SQLite file {path!r} cannot use {JOURNAL_MODE} journaling (it stays {mode!r}); "
            "put it on a local filesystem"
        )
    if _schema_version(conn, path) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)"
    )
    current = _schema_version(conn, path)
    for version in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[version - 1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (version, now_us))
    conn.execute("COMMIT")


def _set_journal_mode(conn: sqlite3.Connection, busy_s: float) -> Any:
    """``PRAGMA journal_mode = WAL``, retried while another opener holds the file, for up to ``busy_s`` seconds.

    Switching a new file into WAL needs an exclusive lock; SQLite answers ``SQLITE_BUSY`` at once, without its busy
    handler, when another connection holds a lock meanwhile (several processes opening a new file at once). The
    statement is idempotent, so it is retried with a short backoff; any other error is raised.
    """
    deadline = time.monotonic() + busy_s
    pause = JOURNAL_RETRY_FIRST_PAUSE_S
    while True:
        try:
            return conn.execute(f"PRAGMA journal_mode = {JOURNAL_MODE}").fetchone()[0]
        except sqlite3.OperationalError as error:
            if not is_busy(error) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, JOURNAL_RETRY_MAX_PAUSE_S)


def _schema_version(conn: sqlite3.Connection, path: str) -> int:
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if exists is None:
        return 0
    version = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreCorrupt(
            "open",
            f"the SQLite file {path!r} has schema version {version}, newer than this threadloom's "
            f"{SCHEMA_VERSION}; upgrade threadloom to open it",
        )
    return version


__all__ = [
    "JOURNAL_MODE",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "STATEMENTS",
    "incomplete_statement",
    "migrate",
    "threads_statement",
]
