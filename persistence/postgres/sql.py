"""The SQL of :class:`~threadloom.persistence.postgres.PostgresCheckpointer`: numbered migrations and queries.

Every statement names its tables through the schema placeholder ``{s}``, which the store fills with the schema
quoted by ``psycopg.sql.Identifier`` (never with raw text); the notification channel is filled in as a quoted
literal. This module imports nothing of psycopg, so the package imports without the ``postgres`` extra.

Design (DESIGN §3 "Stores", seeds 003):

* ``threads`` holds one row per thread id: event numbering (``first_seq``, ``next_seq``, ``floor``), the claim,
  the tombstone time, metadata and a copy of the latest checkpoint's registry fields. Every write first locks
  this row (``SELECT … FOR UPDATE``; two rows in id order for a fence) and allocates event numbers from it.
* Each write is one server-side PL/pgSQL function called in one statement (one round trip): it checks token,
  fence and parent, reads ``clock_timestamp()`` once it holds its locks, writes, and ``pg_notify``-s the
  schema's channel with the thread id when it numbered events or deleted the thread.
* The run queue (migration 2, :data:`QUEUE_MIGRATION`): tables ``run_queue`` and ``run_queue_runs`` and the
  functions ``tl_q_*``; ``tl_prune_row`` is replaced so that ``tl_prune`` and ``tl_sweep`` keep the newest
  checkpoint of every run an open entry recorded. See :mod:`~threadloom.persistence.postgres.queue`.
* Migration 3 (:data:`RETENTION_MIGRATION`) widens the retention functions' checkpoint count to ``bigint``.
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

QUEUE_MIGRATION = r"""
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

CREATE FUNCTION {s}.tl_q_row(p_entry bigint, p_code integer, p_previous text) RETURNS {s}.tl_q_result
LANGUAGE sql AS $fn$
    SELECT p_code, NULL::bigint, p_previous, q.entry_id, q.thread_id, q.graph_id, q.input, q.tenant_id, q.status,
           q.attempts, q.leased_by, q.lease_expires_at, q.available_at, q.enqueued_at, q.finished_at, q.error,
           ARRAY(SELECT r.run_id FROM {s}.run_queue_runs r WHERE r.entry_id = q.entry_id ORDER BY r.position)
    FROM {s}.run_queue q WHERE q.entry_id = p_entry
$fn$;

-- Locks the entry's row and says whether p_attempt is its current lease (rule 2): open, leased, that attempt.
-- o_current is the attempt of the entry's lease while it is open and leased, else NULL.
CREATE FUNCTION {s}.tl_q_fence(p_entry bigint, p_attempt bigint,
    OUT o_ok boolean, OUT o_current bigint, OUT o_thread text, OUT o_status text, OUT o_attempts bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
BEGIN
    SELECT q.thread_id, q.status, q.attempts, q.leased_by INTO r
        FROM {s}.run_queue q WHERE q.entry_id = p_entry FOR UPDATE;
    IF NOT FOUND THEN
        o_ok := false;
        RETURN;
    END IF;
    o_thread := r.thread_id;
    o_status := r.status;
    o_attempts := r.attempts;
    IF r.status = 'open' AND r.leased_by IS NOT NULL THEN
        o_current := r.attempts;
    END IF;
    o_ok := o_current IS NOT NULL AND o_current = p_attempt;
END
$fn$;

CREATE FUNCTION {s}.tl_q_enqueue(p_thread text, p_graph text, p_input text, p_tenant text, p_delay_us bigint)
RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz;
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(@QUEUE_LOCK_CLASS@, hashtext(p_thread));
    v_now := clock_timestamp();
    INSERT INTO {s}.run_queue (thread_id, graph_id, input, tenant_id, status, thread_head, available_at, enqueued_at)
        VALUES (p_thread, p_graph, p_input, p_tenant, 'open',
                NOT EXISTS (SELECT 1 FROM {s}.run_queue q WHERE q.thread_id = p_thread AND q.status = 'open'),
                v_now + p_delay_us * interval '1 microsecond', v_now)
        RETURNING entry_id INTO v_id;
    RETURN {s}.tl_q_row(v_id, 0, NULL);
END
$fn$;

-- lease: code 0 leased (previous = the holder of an expired lease it replaced), 1 nothing leasable. The oldest
-- open head that is available and has no live lease, locked with SKIP LOCKED: a head another lease is granting
-- right now is passed over, never waited for, and never granted twice.
CREATE FUNCTION {s}.tl_q_lease(p_holder text, p_ttl_us bigint, p_kinds text[]) RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_id bigint;
    v_previous text;
    res {s}.tl_q_result;
BEGIN
    IF p_kinds IS NULL THEN
        SELECT q.entry_id, q.leased_by INTO v_id, v_previous FROM {s}.run_queue q
            WHERE q.status = 'open' AND q.thread_head AND q.available_at <= v_now
              AND (q.lease_expires_at IS NULL OR q.lease_expires_at <= v_now)
            ORDER BY q.entry_id LIMIT 1 FOR UPDATE SKIP LOCKED;
    ELSE
        SELECT q.entry_id, q.leased_by INTO v_id, v_previous FROM {s}.run_queue q
            WHERE q.status = 'open' AND q.thread_head AND q.available_at <= v_now
              AND (q.lease_expires_at IS NULL OR q.lease_expires_at <= v_now) AND q.graph_id = ANY (p_kinds)
            ORDER BY q.entry_id LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF v_id IS NULL THEN
        res.code := 1;
        RETURN res;
    END IF;
    UPDATE {s}.run_queue
        SET attempts = attempts + 1, leased_by = p_holder, lease_expires_at = v_now + p_ttl_us * interval '1 microsecond'
        WHERE entry_id = v_id;
    RETURN {s}.tl_q_row(v_id, 0, v_previous);
END
$fn$;

-- renew: code 0 renewed, 1 stale (current = the entry's live attempt or NULL).
CREATE FUNCTION {s}.tl_q_renew(p_entry bigint, p_attempt bigint, p_ttl_us bigint) RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    f record;
    res {s}.tl_q_result;
BEGIN
    SELECT * INTO f FROM {s}.tl_q_fence(p_entry, p_attempt);
    IF NOT f.o_ok THEN
        res.code := 1;
        res.current := f.o_current;
        RETURN res;
    END IF;
    UPDATE {s}.run_queue SET lease_expires_at = clock_timestamp() + p_ttl_us * interval '1 microsecond'
        WHERE entry_id = p_entry;
    RETURN {s}.tl_q_row(p_entry, 0, NULL);
END
$fn$;

-- record_run: code 0 recorded (or already there), 1 stale (current as for renew), 2 the entry holds p_max runs.
CREATE FUNCTION {s}.tl_q_record(p_entry bigint, p_attempt bigint, p_run text, p_max integer)
RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    f record;
    v_position integer;
    res {s}.tl_q_result;
BEGIN
    SELECT * INTO f FROM {s}.tl_q_fence(p_entry, p_attempt);
    IF NOT f.o_ok THEN
        res.code := 1;
        res.current := f.o_current;
        RETURN res;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {s}.run_queue_runs r WHERE r.entry_id = p_entry AND r.run_id = p_run) THEN
        SELECT coalesce(max(r.position) + 1, 0) INTO v_position FROM {s}.run_queue_runs r WHERE r.entry_id = p_entry;
        IF v_position >= p_max THEN
            res.code := 2;
            RETURN res;
        END IF;
        INSERT INTO {s}.run_queue_runs (entry_id, position, run_id) VALUES (p_entry, v_position, p_run);
    END IF;
    RETURN {s}.tl_q_row(p_entry, 0, NULL);
END
$fn$;

-- finish: code 0 finished (or finished already by this attempt with this status: a retry), 1 stale. Takes the
-- thread's queue lock first (as enqueue does), so the next head is chosen among every entry enqueued before.
CREATE FUNCTION {s}.tl_q_finish(p_entry bigint, p_attempt bigint, p_status text, p_error text)
RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    v_thread text;
    f record;
    res {s}.tl_q_result;
BEGIN
    SELECT q.thread_id INTO v_thread FROM {s}.run_queue q WHERE q.entry_id = p_entry;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock(@QUEUE_LOCK_CLASS@, hashtext(v_thread));
    END IF;
    SELECT * INTO f FROM {s}.tl_q_fence(p_entry, p_attempt);
    IF f.o_status = p_status AND f.o_attempts = p_attempt THEN
        RETURN {s}.tl_q_row(p_entry, 0, NULL);
    END IF;
    IF NOT f.o_ok THEN
        res.code := 1;
        res.current := f.o_current;
        RETURN res;
    END IF;
    UPDATE {s}.run_queue
        SET status = p_status, thread_head = false, error = CASE WHEN p_status = 'failed' THEN p_error END,
            finished_at = clock_timestamp(), leased_by = NULL, lease_expires_at = NULL
        WHERE entry_id = p_entry;
    -- Only a head is leased, so the entry just finished was its thread's head: the next open entry heads now.
    UPDATE {s}.run_queue SET thread_head = true
        WHERE entry_id = (SELECT q.entry_id FROM {s}.run_queue q WHERE q.thread_id = v_thread AND q.status = 'open'
                          ORDER BY q.entry_id LIMIT 1);
    RETURN {s}.tl_q_row(p_entry, 0, NULL);
END
$fn$;

-- release: code 0 released (leasable again after p_delay_us), 1 not the current lease (nothing changed).
CREATE FUNCTION {s}.tl_q_release(p_entry bigint, p_attempt bigint, p_delay_us bigint) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    f record;
BEGIN
    SELECT * INTO f FROM {s}.tl_q_fence(p_entry, p_attempt);
    IF NOT f.o_ok THEN
        RETURN 1;
    END IF;
    UPDATE {s}.run_queue
        SET leased_by = NULL, lease_expires_at = NULL,
            available_at = clock_timestamp() + p_delay_us * interval '1 microsecond'
        WHERE entry_id = p_entry;
    RETURN 0;
END
$fn$;

-- Retention keeps the runs open queue entries recorded (seeds 000: lookupRun, sweep; DESIGN §4): tl_prune and
-- tl_sweep prune through this function, which now adds the RunIds of the thread's open entries to what it was
-- given (the sweep guard's answer), read after the caller locked the thread's row, in the same transaction.
-- A run recorded after that read has no checkpoint on the thread yet: it records before it touches the
-- thread, and its commits wait for the row lock this transaction holds.
CREATE OR REPLACE FUNCTION {s}.tl_prune_row(r {s}.threads, p_now timestamptz, p_max_age_us bigint,
    p_max_cps integer, p_max_events bigint, p_runs text[]) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lim timestamptz;
    v_cut bigint;
    v_fresh bigint;
    v_first_kept bigint;
    v_mark bigint;
    v_removed integer := 0;
    v_fresh_seq bigint;
    v_expired bigint;
    v_floor bigint := r.floor;
    v_dropped integer := 0;
    v_protected bigint[];
BEGIN
    IF p_max_age_us IS NOT NULL THEN
        v_lim := p_now - p_max_age_us * interval '1 microsecond';
    END IF;
    IF r.latest_pos IS NOT NULL AND (p_max_age_us IS NOT NULL OR p_max_cps IS NOT NULL) THEN
        v_first_kept := 0;
        IF p_max_cps IS NOT NULL THEN
            SELECT c.pos INTO v_cut FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id
                ORDER BY c.pos DESC OFFSET p_max_cps - 1 LIMIT 1;
            v_first_kept := coalesce(v_cut, 0);
        END IF;
        IF p_max_age_us IS NOT NULL THEN
            SELECT c.pos INTO v_fresh FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.committed_at > v_lim
                ORDER BY c.pos LIMIT 1;
            v_first_kept := greatest(v_first_kept, coalesce(v_fresh, r.latest_pos));
        END IF;
        v_first_kept := least(v_first_kept, r.latest_pos);
        IF EXISTS (SELECT 1 FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept) THEN
            SELECT c.seq_mark INTO v_mark FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos >= v_first_kept
                ORDER BY c.pos LIMIT 1;
            v_protected := ARRAY(
                SELECT z.m FROM (
                    SELECT (SELECT max(k.pos) FROM {s}.checkpoints k
                            WHERE k.thread_id = r.thread_id AND k.run_id = u.run) AS m
                    FROM (SELECT unnest(coalesce(p_runs, '{{}}'::text[]))
                          UNION
                          SELECT qr.run_id FROM {s}.run_queue q
                              JOIN {s}.run_queue_runs qr ON qr.entry_id = q.entry_id
                              WHERE q.thread_id = r.thread_id AND q.status = 'open') AS u(run)
                ) z WHERE z.m IS NOT NULL);
            DELETE FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept
                AND c.pos <> ALL (v_protected);
            GET DIAGNOSTICS v_removed = ROW_COUNT;
        END IF;
    END IF;
    IF v_mark IS NOT NULL THEN
        v_floor := greatest(v_floor, v_mark);
    END IF;
    IF p_max_age_us IS NOT NULL THEN
        SELECT e.seq INTO v_fresh_seq FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.committed_at > v_lim
            ORDER BY e.seq LIMIT 1;
        IF v_fresh_seq IS NULL THEN
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id;
        ELSE
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_fresh_seq;
        END IF;
        IF v_expired IS NOT NULL THEN
            v_floor := greatest(v_floor, v_expired + 1);
        END IF;
    END IF;
    IF p_max_events IS NOT NULL THEN
        v_floor := greatest(v_floor, r.next_seq - p_max_events);
    END IF;
    v_floor := least(v_floor, r.next_seq);
    IF v_floor > r.floor THEN
        DELETE FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_floor;
        GET DIAGNOSTICS v_dropped = ROW_COUNT;
        UPDATE {s}.threads SET floor = v_floor WHERE thread_id = r.thread_id;
    END IF;
    RETURN v_removed > 0 OR v_dropped > 0;
END
$fn$;
""".replace("@QUEUE_LOCK_CLASS@", str(QUEUE_LOCK_CLASS))
"""Migration 2: the run queue's tables, indexes and functions, and the retention that keeps open entries' runs."""


RETENTION_MIGRATION = r"""
-- A retention policy's max_checkpoints may be any positive 64-bit integer (DESIGN §2; validation.MAX_INT): the
-- count parameter of tl_prune, tl_sweep and tl_prune_row becomes bigint. A parameter's type is part of a
-- function's signature, so each is dropped and created again, with the body it had (migration 2's tl_prune_row).
DROP FUNCTION {s}.tl_prune(text, bigint, integer, bigint);
DROP FUNCTION {s}.tl_sweep(text[], jsonb, bigint, integer, bigint, bigint);
DROP FUNCTION {s}.tl_prune_row({s}.threads, timestamptz, bigint, integer, bigint, text[]);

CREATE FUNCTION {s}.tl_prune_row(r {s}.threads, p_now timestamptz, p_max_age_us bigint,
    p_max_cps bigint, p_max_events bigint, p_runs text[]) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lim timestamptz;
    v_cut bigint;
    v_fresh bigint;
    v_first_kept bigint;
    v_mark bigint;
    v_removed integer := 0;
    v_fresh_seq bigint;
    v_expired bigint;
    v_floor bigint := r.floor;
    v_dropped integer := 0;
    v_protected bigint[];
BEGIN
    IF p_max_age_us IS NOT NULL THEN
        v_lim := p_now - p_max_age_us * interval '1 microsecond';
    END IF;
    IF r.latest_pos IS NOT NULL AND (p_max_age_us IS NOT NULL OR p_max_cps IS NOT NULL) THEN
        v_first_kept := 0;
        IF p_max_cps IS NOT NULL THEN
            SELECT c.pos INTO v_cut FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id
                ORDER BY c.pos DESC OFFSET p_max_cps - 1 LIMIT 1;
            v_first_kept := coalesce(v_cut, 0);
        END IF;
        IF p_max_age_us IS NOT NULL THEN
            SELECT c.pos INTO v_fresh FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.committed_at > v_lim
                ORDER BY c.pos LIMIT 1;
            v_first_kept := greatest(v_first_kept, coalesce(v_fresh, r.latest_pos));
        END IF;
        v_first_kept := least(v_first_kept, r.latest_pos);
        IF EXISTS (SELECT 1 FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept) THEN
            SELECT c.seq_mark INTO v_mark FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos >= v_first_kept
                ORDER BY c.pos LIMIT 1;
            v_protected := ARRAY(
                SELECT z.m FROM (
                    SELECT (SELECT max(k.pos) FROM {s}.checkpoints k
                            WHERE k.thread_id = r.thread_id AND k.run_id = u.run) AS m
                    FROM (SELECT unnest(coalesce(p_runs, '{{}}'::text[]))
                          UNION
                          SELECT qr.run_id FROM {s}.run_queue q
                              JOIN {s}.run_queue_runs qr ON qr.entry_id = q.entry_id
                              WHERE q.thread_id = r.thread_id AND q.status = 'open') AS u(run)
                ) z WHERE z.m IS NOT NULL);
            DELETE FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept
                AND c.pos <> ALL (v_protected);
            GET DIAGNOSTICS v_removed = ROW_COUNT;
        END IF;
    END IF;
    IF v_mark IS NOT NULL THEN
        v_floor := greatest(v_floor, v_mark);
    END IF;
    IF p_max_age_us IS NOT NULL THEN
        SELECT e.seq INTO v_fresh_seq FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.committed_at > v_lim
            ORDER BY e.seq LIMIT 1;
        IF v_fresh_seq IS NULL THEN
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id;
        ELSE
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_fresh_seq;
        END IF;
        IF v_expired IS NOT NULL THEN
            v_floor := greatest(v_floor, v_expired + 1);
        END IF;
    END IF;
    IF p_max_events IS NOT NULL THEN
        v_floor := greatest(v_floor, r.next_seq - p_max_events);
    END IF;
    v_floor := least(v_floor, r.next_seq);
    IF v_floor > r.floor THEN
        DELETE FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_floor;
        GET DIAGNOSTICS v_dropped = ROW_COUNT;
        UPDATE {s}.threads SET floor = v_floor WHERE thread_id = r.thread_id;
    END IF;
    RETURN v_removed > 0 OR v_dropped > 0;
END
$fn$;

CREATE FUNCTION {s}.tl_prune(p_thread text, p_max_age_us bigint, p_max_cps bigint, p_max_events bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
BEGIN
    SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF r.thread_id IS NULL THEN
        RETURN false;
    END IF;
    RETURN {s}.tl_prune_row(r, clock_timestamp(), p_max_age_us, p_max_cps, p_max_events, NULL);
END
$fn$;

CREATE FUNCTION {s}.tl_sweep(p_ids text[], p_protected jsonb, p_max_age_us bigint, p_max_cps bigint,
    p_max_events bigint, p_tombstone_us bigint, OUT pruned text[], OUT reclaimed text[])
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
    v_now timestamptz;
    v_guarded boolean;
BEGIN
    pruned := '{{}}';
    reclaimed := '{{}}';
    PERFORM 1 FROM {s}.threads WHERE thread_id = ANY (p_ids) ORDER BY thread_id FOR UPDATE;
    v_now := clock_timestamp();
    FOR r IN SELECT * FROM {s}.threads WHERE thread_id = ANY (p_ids) ORDER BY thread_id LOOP
        v_guarded := p_protected ? r.thread_id;
        IF {s}.tl_prune_row(r, v_now, p_max_age_us, p_max_cps, p_max_events,
                CASE WHEN v_guarded
                     THEN ARRAY(SELECT jsonb_array_elements_text(p_protected -> r.thread_id)) END) THEN
            pruned := pruned || r.thread_id::text;
        END IF;
        IF p_tombstone_us IS NOT NULL AND NOT v_guarded AND r.deleted_at IS NOT NULL
            AND r.deleted_at < v_now - p_tombstone_us * interval '1 microsecond'
            AND r.latest_id IS NULL AND r.claim_token IS NULL AND r.metadata = '{{}}'::jsonb
            AND r.next_seq = r.first_seq
            AND NOT EXISTS (SELECT 1 FROM {s}.effects WHERE thread_id = r.thread_id) THEN
            UPDATE {s}.meta SET mark = greatest(mark, r.first_seq) WHERE id = 1;
            DELETE FROM {s}.children WHERE child = r.thread_id;
            DELETE FROM {s}.threads WHERE thread_id = r.thread_id;
            reclaimed := reclaimed || r.thread_id::text;
        END IF;
    END LOOP;
END
$fn$;
"""
"""Migration 3: the retention functions take a bigint checkpoint count."""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        r"""
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

-- claim: one statement; inserts the row when missing, locks it, refuses a live claim, else takes a token.
CREATE FUNCTION {s}.tl_claim(p_thread text, p_holder text, p_ttl_us bigint, p_tenant text,
    OUT code integer, OUT token bigint, OUT expires_at timestamptz,
    OUT old_holder text, OUT old_tenant text, OUT latest text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
    v_new boolean := false;
    v_mark bigint;
    v_now timestamptz;
BEGIN
    LOOP
        SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO {s}.threads (thread_id, first_seq, next_seq, floor)
            SELECT p_thread, greatest(1, m.mark), greatest(1, m.mark), greatest(1, m.mark)
            FROM {s}.meta m WHERE m.id = 1
            ON CONFLICT DO NOTHING;
        v_new := FOUND;
    END LOOP;
    IF v_new THEN
        -- A sweep that reclaimed this id while the insert waited may have raised the mark since the insert's
        -- snapshot: number past it (a new statement sees the committed mark).
        SELECT greatest(1, m.mark) INTO v_mark FROM {s}.meta m WHERE m.id = 1;
        IF v_mark > r.first_seq AND r.next_seq = r.first_seq THEN
            UPDATE {s}.threads SET first_seq = v_mark, next_seq = v_mark, floor = v_mark
                WHERE thread_id = p_thread;
        END IF;
    END IF;
    v_now := clock_timestamp();
    old_holder := r.claim_holder;
    old_tenant := r.claim_tenant;
    latest := r.latest_id;
    IF r.claim_token IS NOT NULL AND v_now < r.claim_expires THEN
        code := 1;
        RETURN;
    END IF;
    token := nextval('{s}.tokens');
    expires_at := v_now + p_ttl_us * interval '1 microsecond';
    UPDATE {s}.threads
        SET claim_holder = p_holder, claim_token = token, claim_expires = expires_at, claim_tenant = p_tenant
        WHERE thread_id = p_thread;
    code := 0;
END
$fn$;

CREATE FUNCTION {s}.tl_renew(p_thread text, p_token bigint, p_ttl_us bigint,
    OUT code integer, OUT current bigint, OUT holder text, OUT expires_at timestamptz, OUT tenant text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
BEGIN
    SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF r.thread_id IS NULL OR r.claim_token IS DISTINCT FROM p_token THEN
        code := 1;
        current := r.claim_token;
        RETURN;
    END IF;
    expires_at := clock_timestamp() + p_ttl_us * interval '1 microsecond';
    UPDATE {s}.threads SET claim_expires = expires_at WHERE thread_id = p_thread;
    code := 0;
    current := p_token;
    holder := r.claim_holder;
    tenant := r.claim_tenant;
END
$fn$;

CREATE FUNCTION {s}.tl_release(p_thread text, p_token bigint) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
BEGIN
    SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF r.thread_id IS NULL OR r.claim_token IS DISTINCT FROM p_token THEN
        RETURN 1;
    END IF;
    UPDATE {s}.threads SET claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL
        WHERE thread_id = p_thread;
    -- A row that holds nothing (a claim released on a thread that never stored anything) is forgotten.
    IF r.latest_id IS NULL AND r.deleted_at IS NULL AND r.next_seq = r.first_seq AND r.metadata = '{{}}'::jsonb
        AND r.first_seq <= (SELECT greatest(1, m.mark) FROM {s}.meta m WHERE m.id = 1)
        AND NOT EXISTS (SELECT 1 FROM {s}.effects WHERE thread_id = p_thread)
        AND NOT EXISTS (SELECT 1 FROM {s}.children WHERE child = p_thread) THEN
        DELETE FROM {s}.threads WHERE thread_id = p_thread;
    END IF;
    RETURN 0;
END
$fn$;

-- commit: codes 0 applied (n = first event number), 1 stale own token (n = current), 2 stale fence (n = the
-- fence thread's current), 3 parent conflict (t = the base), 4 duplicate checkpoint id, 5 misdirected pending
-- write (n = its index, t = the resulting latest), 6 retract_turn without a checkpoint.
CREATE FUNCTION {s}.tl_commit(
    p_thread text, p_token bigint, p_fence text, p_fence_token bigint,
    p_cp_id text, p_cp_parent text, p_cp_run text, p_cp_status text, p_cp_tenant text, p_cp_graph text,
    p_cp_origin text, p_cp_body text, p_retract boolean,
    p_pw_cps text[], p_pw_bodies text[], p_ev_prefix text, p_ev_tails text[],
    p_fx_keys text[], p_fx_bodies text[], p_metadata jsonb,
    OUT code integer, OUT n bigint, OUT t text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    v_other bigint;
    v_keep bigint;
    v_base text;
    v_result text;
    v_stamp timestamptz;
    v_pos bigint;
    v_events integer := coalesce(cardinality(p_ev_tails), 0);
    v_pws integer := coalesce(cardinality(p_pw_bodies), 0);
BEGIN
    IF p_fence IS NOT NULL THEN  -- both rows, in id order, so two fenced writes never deadlock
        PERFORM 1 FROM {s}.threads WHERE thread_id IN (p_thread, p_fence) ORDER BY thread_id FOR UPDATE;
    END IF;
    SELECT th.thread_id, th.claim_token, th.latest_pos, th.latest_id, th.next_seq, th.next_pos, th.next_pw,
           th.stamped_at
        INTO r FROM {s}.threads th WHERE th.thread_id = p_thread FOR UPDATE;
    IF NOT FOUND THEN
        code := 1;
        RETURN;
    END IF;
    IF r.claim_token IS DISTINCT FROM p_token THEN
        code := 1;
        n := r.claim_token;
        RETURN;
    END IF;
    IF p_fence IS NOT NULL THEN
        SELECT claim_token INTO v_other FROM {s}.threads WHERE thread_id = p_fence;
        IF v_other IS DISTINCT FROM p_fence_token THEN
            code := 2;
            n := v_other;
            RETURN;
        END IF;
    END IF;
    v_keep := r.latest_pos;
    v_base := r.latest_id;
    IF p_cp_id IS NOT NULL THEN
        IF p_retract THEN
            SELECT c.pos, c.id INTO v_keep, v_base FROM {s}.checkpoints c
                WHERE c.thread_id = p_thread AND c.status IN ('completed', 'failed')
                ORDER BY c.pos DESC LIMIT 1;
        END IF;
        IF p_cp_parent IS DISTINCT FROM v_base THEN
            code := 3;
            t := v_base;
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM {s}.checkpoints c WHERE c.thread_id = p_thread AND c.id = p_cp_id) THEN
            code := 4;
            RETURN;
        END IF;
    END IF;
    v_result := coalesce(p_cp_id, r.latest_id);
    FOR i IN 1 .. coalesce(cardinality(p_pw_cps), 0) LOOP
        IF p_pw_cps[i] IS DISTINCT FROM v_result THEN
            code := 5;
            n := i - 1;
            t := v_result;
            RETURN;
        END IF;
    END LOOP;
    IF p_retract AND p_cp_id IS NULL THEN
        code := 6;
        RETURN;
    END IF;
    v_stamp := greatest(clock_timestamp(), r.stamped_at);
    IF p_cp_id IS NOT NULL THEN
        IF p_retract THEN
            DELETE FROM {s}.checkpoints WHERE thread_id = p_thread AND pos > coalesce(v_keep, 0);
        END IF;
        v_pos := r.next_pos;
        INSERT INTO {s}.checkpoints (thread_id, pos, id, run_id, status, committed_at, seq_mark, body)
            VALUES (p_thread, v_pos, p_cp_id, p_cp_run, p_cp_status, v_stamp, r.next_seq, p_cp_body);
        IF r.next_pw > 1 THEN
            DELETE FROM {s}.pending_writes WHERE thread_id = p_thread;
        END IF;
        IF p_cp_origin IS NOT NULL THEN
            INSERT INTO {s}.children (parent, child, place)
                SELECT p_cp_origin, p_thread, nextval('{s}.places')
                WHERE NOT EXISTS (SELECT 1 FROM {s}.children c WHERE c.parent = p_cp_origin AND c.child = p_thread);
        END IF;
    END IF;
    IF v_pws > 0 THEN
        INSERT INTO {s}.pending_writes (thread_id, idx, body)
            SELECT p_thread, r.next_pw + u.o - 1, u.b FROM unnest(p_pw_bodies) WITH ORDINALITY AS u(b, o);
    END IF;
    IF v_events > 0 THEN
        INSERT INTO {s}.events (thread_id, seq, committed_at, body)
            SELECT p_thread, r.next_seq + u.o - 1, v_stamp,
                   p_ev_prefix || (r.next_seq + u.o - 1) || ',"token":' || p_token || ',' || u.e
            FROM unnest(p_ev_tails) WITH ORDINALITY AS u(e, o);
    END IF;
    IF coalesce(cardinality(p_fx_keys), 0) > 0 THEN
        INSERT INTO {s}.effects (thread_id, key, body)
            SELECT p_thread, u.k, u.b FROM unnest(p_fx_keys, p_fx_bodies) AS u(k, b)
            ON CONFLICT DO NOTHING;
    END IF;
    IF p_cp_id IS NOT NULL THEN
        UPDATE {s}.threads SET
            next_seq = next_seq + v_events, next_pos = v_pos + 1, next_pw = next_pw + v_pws,
            stamped_at = v_stamp, updated_at = v_stamp,
            metadata = CASE WHEN p_metadata IS NULL THEN metadata ELSE metadata || p_metadata END,
            latest_pos = v_pos, latest_id = p_cp_id, latest_run_id = p_cp_run, latest_status = p_cp_status,
            tenant_id = p_cp_tenant, graph_id = p_cp_graph, origin_parent = p_cp_origin
            WHERE thread_id = p_thread;
    ELSIF p_metadata IS NOT NULL THEN
        UPDATE {s}.threads SET
            next_seq = next_seq + v_events, next_pw = next_pw + v_pws,
            stamped_at = v_stamp, updated_at = v_stamp, metadata = metadata || p_metadata
            WHERE thread_id = p_thread;
    ELSE
        UPDATE {s}.threads SET next_seq = next_seq + v_events, next_pw = next_pw + v_pws, stamped_at = v_stamp
            WHERE thread_id = p_thread;
    END IF;
    IF v_events > 0 THEN
        PERFORM pg_notify({channel}, p_thread);
    END IF;
    code := 0;
    n := r.next_seq;
END
$fn$;

-- delete: codes 0 deleted, 1 stale own token (n = current), 2 stale fence (n = the fence thread's current).
CREATE FUNCTION {s}.tl_delete(p_thread text, p_token bigint, p_fence text, p_fence_token bigint,
    OUT code integer, OUT n bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
    v_other bigint;
    v_start bigint;
BEGIN
    IF p_fence IS NULL THEN
        SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    ELSE
        PERFORM 1 FROM {s}.threads WHERE thread_id IN (p_thread, p_fence) ORDER BY thread_id FOR UPDATE;
        SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread;
    END IF;
    IF r.thread_id IS NULL OR r.claim_token IS DISTINCT FROM p_token THEN
        code := 1;
        n := r.claim_token;
        RETURN;
    END IF;
    IF p_fence IS NOT NULL THEN
        SELECT claim_token INTO v_other FROM {s}.threads WHERE thread_id = p_fence;
        IF v_other IS DISTINCT FROM p_fence_token THEN
            code := 2;
            n := v_other;
            RETURN;
        END IF;
    END IF;
    -- The next incarnation numbers one past the deleted log ("one number skipped"); a deleted incarnation
    -- that numbered nothing does not move the numbering.
    IF r.next_seq > r.first_seq THEN
        v_start := r.next_seq + 1;
    END IF;
    DELETE FROM {s}.checkpoints WHERE thread_id = p_thread;
    DELETE FROM {s}.pending_writes WHERE thread_id = p_thread;
    DELETE FROM {s}.events WHERE thread_id = p_thread;
    DELETE FROM {s}.effects WHERE thread_id = p_thread;
    UPDATE {s}.threads SET
        first_seq = coalesce(v_start, first_seq), next_seq = coalesce(v_start, next_seq),
        floor = coalesce(v_start, floor),
        claim_holder = NULL, claim_token = NULL, claim_expires = NULL, claim_tenant = NULL,
        updated_at = NULL, deleted_at = clock_timestamp(), metadata = '{{}}'::jsonb,
        latest_pos = NULL, latest_id = NULL, latest_run_id = NULL, latest_status = NULL,
        tenant_id = NULL, graph_id = NULL, origin_parent = NULL
        WHERE thread_id = p_thread;
    PERFORM pg_notify({channel}, p_thread);
    code := 0;
END
$fn$;

CREATE FUNCTION {s}.tl_compact(p_thread text, p_before bigint) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
    v_floor bigint;
BEGIN
    SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF r.thread_id IS NULL THEN
        RETURN 1;
    END IF;
    v_floor := least(greatest(r.floor, p_before), greatest(r.floor, r.next_seq));
    IF v_floor > r.floor THEN
        DELETE FROM {s}.events WHERE thread_id = p_thread AND seq < v_floor;
        UPDATE {s}.threads SET floor = v_floor WHERE thread_id = p_thread;
    END IF;
    RETURN 0;
END
$fn$;

-- Prunes one locked thread by a retention policy (rules.checkpoints_to_prune and rules.pruned_floor); true
-- when it removed anything. Commit stamps never decrease along a history or log, so what age removes is a
-- prefix; what the count removes is one too.
CREATE FUNCTION {s}.tl_prune_row(r {s}.threads, p_now timestamptz, p_max_age_us bigint, p_max_cps integer,
    p_max_events bigint, p_runs text[]) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_lim timestamptz;
    v_cut bigint;
    v_fresh bigint;
    v_first_kept bigint;
    v_mark bigint;
    v_removed integer := 0;
    v_fresh_seq bigint;
    v_expired bigint;
    v_floor bigint := r.floor;
    v_dropped integer := 0;
    v_protected bigint[];
BEGIN
    IF p_max_age_us IS NOT NULL THEN
        v_lim := p_now - p_max_age_us * interval '1 microsecond';
    END IF;
    IF r.latest_pos IS NOT NULL AND (p_max_age_us IS NOT NULL OR p_max_cps IS NOT NULL) THEN
        v_first_kept := 0;
        IF p_max_cps IS NOT NULL THEN
            SELECT c.pos INTO v_cut FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id
                ORDER BY c.pos DESC OFFSET p_max_cps - 1 LIMIT 1;
            v_first_kept := coalesce(v_cut, 0);
        END IF;
        IF p_max_age_us IS NOT NULL THEN
            SELECT c.pos INTO v_fresh FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.committed_at > v_lim
                ORDER BY c.pos LIMIT 1;
            v_first_kept := greatest(v_first_kept, coalesce(v_fresh, r.latest_pos));
        END IF;
        v_first_kept := least(v_first_kept, r.latest_pos);
        IF EXISTS (SELECT 1 FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept) THEN
            SELECT c.seq_mark INTO v_mark FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos >= v_first_kept
                ORDER BY c.pos LIMIT 1;
            v_protected := ARRAY(
                SELECT z.m FROM (
                    SELECT (SELECT max(k.pos) FROM {s}.checkpoints k
                            WHERE k.thread_id = r.thread_id AND k.run_id = u.run) AS m
                    FROM unnest(coalesce(p_runs, '{{}}'::text[])) AS u(run)
                ) z WHERE z.m IS NOT NULL);
            DELETE FROM {s}.checkpoints c WHERE c.thread_id = r.thread_id AND c.pos < v_first_kept
                AND c.pos <> ALL (v_protected);
            GET DIAGNOSTICS v_removed = ROW_COUNT;
        END IF;
    END IF;
    IF v_mark IS NOT NULL THEN
        v_floor := greatest(v_floor, v_mark);
    END IF;
    IF p_max_age_us IS NOT NULL THEN
        SELECT e.seq INTO v_fresh_seq FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.committed_at > v_lim
            ORDER BY e.seq LIMIT 1;
        IF v_fresh_seq IS NULL THEN
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id;
        ELSE
            SELECT max(e.seq) INTO v_expired FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_fresh_seq;
        END IF;
        IF v_expired IS NOT NULL THEN
            v_floor := greatest(v_floor, v_expired + 1);
        END IF;
    END IF;
    IF p_max_events IS NOT NULL THEN
        v_floor := greatest(v_floor, r.next_seq - p_max_events);
    END IF;
    v_floor := least(v_floor, r.next_seq);
    IF v_floor > r.floor THEN
        DELETE FROM {s}.events e WHERE e.thread_id = r.thread_id AND e.seq < v_floor;
        GET DIAGNOSTICS v_dropped = ROW_COUNT;
        UPDATE {s}.threads SET floor = v_floor WHERE thread_id = r.thread_id;
    END IF;
    RETURN v_removed > 0 OR v_dropped > 0;
END
$fn$;

CREATE FUNCTION {s}.tl_prune(p_thread text, p_max_age_us bigint, p_max_cps integer, p_max_events bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
BEGIN
    SELECT * INTO r FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF r.thread_id IS NULL THEN
        RETURN false;
    END IF;
    RETURN {s}.tl_prune_row(r, clock_timestamp(), p_max_age_us, p_max_cps, p_max_events, NULL);
END
$fn$;

-- sweep: one page, in one transaction: locks every row of the page in id order first (so the reclamation
-- mark, locked last, never closes a cycle), then prunes each thread and reclaims old, empty tombstones.
CREATE FUNCTION {s}.tl_sweep(p_ids text[], p_protected jsonb, p_max_age_us bigint, p_max_cps integer,
    p_max_events bigint, p_tombstone_us bigint, OUT pruned text[], OUT reclaimed text[])
LANGUAGE plpgsql AS $fn$
DECLARE
    r {s}.threads%ROWTYPE;
    v_now timestamptz;
    v_guarded boolean;
BEGIN
    pruned := '{{}}';
    reclaimed := '{{}}';
    PERFORM 1 FROM {s}.threads WHERE thread_id = ANY (p_ids) ORDER BY thread_id FOR UPDATE;
    v_now := clock_timestamp();
    FOR r IN SELECT * FROM {s}.threads WHERE thread_id = ANY (p_ids) ORDER BY thread_id LOOP
        v_guarded := p_protected ? r.thread_id;
        IF {s}.tl_prune_row(r, v_now, p_max_age_us, p_max_cps, p_max_events,
                CASE WHEN v_guarded
                     THEN ARRAY(SELECT jsonb_array_elements_text(p_protected -> r.thread_id)) END) THEN
            pruned := pruned || r.thread_id::text;
        END IF;
        IF p_tombstone_us IS NOT NULL AND NOT v_guarded AND r.deleted_at IS NOT NULL
            AND r.deleted_at < v_now - p_tombstone_us * interval '1 microsecond'
            AND r.latest_id IS NULL AND r.claim_token IS NULL AND r.metadata = '{{}}'::jsonb
            AND r.next_seq = r.first_seq
            AND NOT EXISTS (SELECT 1 FROM {s}.effects WHERE thread_id = r.thread_id) THEN
            UPDATE {s}.meta SET mark = greatest(mark, r.first_seq) WHERE id = 1;
            DELETE FROM {s}.children WHERE child = r.thread_id;
            DELETE FROM {s}.threads WHERE thread_id = r.thread_id;
            reclaimed := reclaimed || r.thread_id::text;
        END IF;
    END LOOP;
END
$fn$;
""",
    ),
    (2, QUEUE_MIGRATION),
    (3, RETENTION_MIGRATION),
)
"""Numbered migrations, applied in order under the schema's advisory lock and recorded in ``schema_version``.

Each is a template: ``{s}`` is the quoted schema, ``{channel}`` the quoted notification channel; literal
braces are doubled. Append new migrations; never edit an applied one.
"""

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
COMMIT = (
    "SELECT code, n, t FROM {s}.tl_commit("
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE = "SELECT code, n FROM {s}.tl_delete(%s, %s, %s, %s)"
COMPACT = "SELECT {s}.tl_compact(%s, %s)"
PRUNE = "SELECT {s}.tl_prune(%s, %s, %s, %s)"
SWEEP = "SELECT pruned, reclaimed FROM {s}.tl_sweep(%s, %s, %s, %s, %s, %s)"

# -- the run queue (migration 2): writes are one function call each; reads one statement -------------------------

Q_ENQUEUE = "SELECT * FROM {s}.tl_q_enqueue(%s, %s, %s, %s, %s)"
Q_LEASE = "SELECT * FROM {s}.tl_q_lease(%s, %s, %s)"
Q_RENEW = "SELECT * FROM {s}.tl_q_renew(%s, %s, %s)"
Q_RECORD = "SELECT * FROM {s}.tl_q_record(%s, %s, %s, %s)"
Q_FINISH = "SELECT * FROM {s}.tl_q_finish(%s, %s, %s, %s)"
Q_RELEASE = "SELECT {s}.tl_q_release(%s, %s, %s)"

_Q_COLUMNS = (
    "q.entry_id, q.thread_id, q.graph_id, q.input, q.tenant_id, q.status, q.attempts, q.leased_by, "
    "q.lease_expires_at, q.available_at, q.enqueued_at, q.finished_at, q.error, "
    "ARRAY(SELECT r.run_id FROM {s}.run_queue_runs r WHERE r.entry_id = q.entry_id ORDER BY r.position)"
)
"""An entry as the reads return it: the columns of ``tl_q_result`` after ``code, current, previous``."""

Q_ENTRY = "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.entry_id = %s"
Q_ENTRIES = "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.entry_id > %s ORDER BY q.entry_id LIMIT %s"
Q_ENTRIES_OF = (
    "SELECT " + _Q_COLUMNS + " FROM {s}.run_queue q WHERE q.status = %s AND q.entry_id > %s "
    "ORDER BY q.entry_id LIMIT %s"
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

REGISTRY_ROOTS = "t.tenant_key = %s AND t.latest_id IS NOT NULL AND t.origin_parent IS NULL"

REGISTRY_BRANCHES = {
    "idle": "t.latest_status = 'running' AND NOT t.deleting AND NOT coalesce(t.claim_expires > statement_timestamp(), false)",
    "suspended": "t.latest_status = 'suspended' AND NOT t.deleting AND NOT coalesce(t.claim_expires > statement_timestamp(), false)",
    "completed": "t.latest_status = 'completed' AND NOT t.deleting AND NOT coalesce(t.claim_expires > statement_timestamp(), false)",
    "failed": "t.latest_status = 'failed' AND NOT t.deleting AND NOT coalesce(t.claim_expires > statement_timestamp(), false)",
    "running": "t.claim_token IS NOT NULL AND NOT t.deleting AND t.claim_expires > statement_timestamp()",
    "deleted": "t.deleting",
}
"""One disjoint branch per registry status (the values of ``ThreadStatus``), each ordered by its own index:
the status index for the four checkpoint statuses, ``threads_claimed`` for RUNNING, ``threads_deleting`` for
DELETED. Each reads at most ``limit + 1`` rows it returns, plus the rows of its index another status took."""
