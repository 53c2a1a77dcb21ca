-- Version 1: the store. Tables, sequences and indexes of threads, checkpoint histories, pending writes, event
-- logs, effect records, claims and child threads; then the functions of every write, one per operation.
--
-- How these files are read (persistence/postgres/schema.py): {s} is the store's schema and {channel} its
-- notification channel, both quoted by psycopg.sql; literal braces are doubled. A line "\ir functions/x.sql"
-- includes that file (psql's include-relative). Each function is defined once, in its file under functions/,
-- in its current form; a migration that creates or changes a function includes its file. Never edit what a
-- version creates here in a way a database at this version would not already have: add a migration.

CREATE SEQUENCE {s}.tokens AS bigint;
CREATE SEQUENCE {s}.places AS bigint;

CREATE TABLE {s}.meta (
    id integer PRIMARY KEY CHECK (id = 1),
    mark bigint NOT NULL DEFAULT 0
);
INSERT INTO {s}.meta (id, mark) VALUES (1, 0);

CREATE TABLE {s}.threads (
    thread_id text COLLATE "C" PRIMARY KEY,
    first_seq bigint NOT NULL,
    next_seq bigint NOT NULL,
    floor bigint NOT NULL,
    next_pos bigint NOT NULL DEFAULT 1,
    next_pw bigint NOT NULL DEFAULT 1,
    claim_holder text,
    claim_token bigint,
    claim_expires timestamptz,
    claim_tenant text,
    updated_at timestamptz,
    deleted_at timestamptz,
    stamped_at timestamptz,
    metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    deleting boolean GENERATED ALWAYS AS (coalesce((metadata ->> 'threadloom.deleting') = 'true', false)) STORED,
    latest_pos bigint,
    latest_id text COLLATE "C",
    latest_run_id text,
    latest_status text,
    tenant_id text COLLATE "C",
    tenant_key text COLLATE "C" GENERATED ALWAYS AS (coalesce(tenant_id, '')) STORED,
    graph_id text COLLATE "C",
    origin_parent text COLLATE "C"
) WITH (fillfactor = 70);

-- The registry (threads, incomplete) reads root threads with a checkpoint through three partial indexes, in
-- disjoint branches: by latest status (rows no live claim holds and no cascade delete marked), claimed rows
-- (RUNNING while live), and rows a cascade delete marked (DELETED). tenant_key is '' for the tenant-less
-- (ids are never empty), so one equality serves every tenant.
CREATE INDEX threads_status ON {s}.threads (tenant_key, latest_status, updated_at, thread_id)
    WHERE latest_id IS NOT NULL AND origin_parent IS NULL;
CREATE INDEX threads_claimed ON {s}.threads (tenant_key, updated_at, thread_id)
    WHERE latest_id IS NOT NULL AND origin_parent IS NULL AND claim_token IS NOT NULL;
CREATE INDEX threads_deleting ON {s}.threads (tenant_key, updated_at, thread_id)
    WHERE latest_id IS NOT NULL AND origin_parent IS NULL AND deleting;

CREATE TABLE {s}.checkpoints (
    thread_id text COLLATE "C" NOT NULL,
    pos bigint NOT NULL,
    id text COLLATE "C" NOT NULL,
    run_id text COLLATE "C" NOT NULL,
    status text NOT NULL,
    committed_at timestamptz NOT NULL,
    seq_mark bigint NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (thread_id, pos),
    -- id leads, so the planner never takes this index for a thread's (thread_id, pos) lookup on a long history.
    UNIQUE (id, thread_id)
);
-- run_id leads, so the planner never mistakes this index for a (thread_id, pos) lookup on a long history.
CREATE INDEX checkpoints_run ON {s}.checkpoints (run_id, thread_id, pos);
CREATE INDEX checkpoints_settled ON {s}.checkpoints (thread_id, pos) WHERE status IN ('completed', 'failed');

CREATE TABLE {s}.pending_writes (
    thread_id text COLLATE "C" NOT NULL,
    idx bigint NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (thread_id, idx)
);

CREATE TABLE {s}.events (
    thread_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    committed_at timestamptz NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

CREATE TABLE {s}.effects (
    thread_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (thread_id, key)
);

CREATE TABLE {s}.children (
    parent text COLLATE "C" NOT NULL,
    child text COLLATE "C" NOT NULL,
    place bigint NOT NULL,
    PRIMARY KEY (parent, child),
    UNIQUE (parent, place)
);
CREATE INDEX children_child ON {s}.children (child);

-- Bodies above ~2 KB are compressed inline; lz4 costs a fraction of pglz's CPU, where the server has it.
DO $lz4$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE {s}.checkpoints ALTER COLUMN body SET COMPRESSION lz4;
        ALTER TABLE {s}.pending_writes ALTER COLUMN body SET COMPRESSION lz4;
        ALTER TABLE {s}.events ALTER COLUMN body SET COMPRESSION lz4;
        ALTER TABLE {s}.effects ALTER COLUMN body SET COMPRESSION lz4;
    END IF;
END
$lz4$;

\ir functions/claims.sql
\ir functions/commit.sql
\ir functions/deletes.sql
\ir functions/retention.sql
