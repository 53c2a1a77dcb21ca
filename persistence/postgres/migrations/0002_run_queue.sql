-- Version 2: the durable run queue, see persistence/postgres/queue.py. Retention keeps the runs of
-- open entries from this version on (functions/retention.sql reads run_queue; version 3 re-creates it).

-- The durable run queue (DESIGN §4). run_queue: one row per entry; entry_id comes from an identity (a sequence),
-- so an id is never reused. thread_head is true while the entry is open and no older entry of its thread is
-- open: set by the enqueue (no open entry of the thread yet) and by the finish of the thread's previous head,
-- cleared by the entry's own finish; only a head is leasable (one thread's inputs run in enqueue order).
-- Neither available_at nor lease_expires_at is indexed, so a lease, a renewal, a recorded run and a release
-- are HOT updates (fillfactor 70 leaves them room); only an enqueue and a finish touch the indexes.
CREATE TABLE {s}.run_queue (
    entry_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id text COLLATE "C" NOT NULL,
    graph_id text COLLATE "C" NOT NULL,
    input text NOT NULL,
    tenant_id text,
    status text NOT NULL CHECK (status IN ('open', 'completed', 'failed')),
    thread_head boolean NOT NULL,
    attempts bigint NOT NULL DEFAULT 0,
    leased_by text,
    lease_expires_at timestamptz,
    available_at timestamptz NOT NULL,
    enqueued_at timestamptz NOT NULL,
    finished_at timestamptz,
    error text
) WITH (fillfactor = 70);

-- The lease: the oldest open head, in entry_id order; the index holds only the open head of each thread, so the
-- walk passes only heads that are leased, delayed or of another graph kind (never finished entries, nor entries
-- queued behind their thread's head).
CREATE INDEX run_queue_leasable ON {s}.run_queue (entry_id) WHERE status = 'open' AND thread_head;
-- A thread's open entries: the enqueue's head test, the finish's next head, the runs retention keeps.
CREATE INDEX run_queue_thread ON {s}.run_queue (thread_id, entry_id) WHERE status = 'open';
-- entries(status=…), paged by entry_id.
CREATE INDEX run_queue_status ON {s}.run_queue (status, entry_id);

-- The RunIds each entry recorded, by position (0, 1, …).
CREATE TABLE {s}.run_queue_runs (
    entry_id bigint NOT NULL,
    position integer NOT NULL,
    run_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (entry_id, position),
    UNIQUE (entry_id, run_id)
);

DO $lz4$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE {s}.run_queue ALTER COLUMN input SET COMPRESSION lz4;
    END IF;
END
$lz4$;

-- What every queue function answers: a code (0 done; else see each function), the current attempt for a stale
-- one, the holder an expired lease had, then the entry as it is now (NULL fields when there is none).
CREATE TYPE {s}.tl_q_result AS (
    code integer,
    current bigint,
    previous text,
    entry_id bigint,
    thread_id text,
    graph_id text,
    input text,
    tenant_id text,
    status text,
    attempts bigint,
    leased_by text,
    lease_expires_at timestamptz,
    available_at timestamptz,
    enqueued_at timestamptz,
    finished_at timestamptz,
    error text,
    run_ids text[]
);

\ir functions/run_queue.sql
