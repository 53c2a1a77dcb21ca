-- The run queue's functions (version 2), one per queue write; see persistence/postgres/queue.py. tl_q_row (the
-- entry a function answers) and tl_q_release are in run_queue_refund.sql (version 6).

-- Locks the entry's row and says whether p_attempt is its current lease (rule 2): open, leased, that attempt.
-- o_current is the attempt of the entry's lease while it is open and leased, else NULL.
CREATE OR REPLACE FUNCTION {s}.tl_q_fence(p_entry bigint, p_attempt bigint,
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

CREATE OR REPLACE FUNCTION {s}.tl_q_enqueue(p_thread text, p_graph text, p_input text, p_tenant text, p_delay_us bigint)
RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz;
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(1953263985, hashtext(p_thread));
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
CREATE OR REPLACE FUNCTION {s}.tl_q_lease(p_holder text, p_ttl_us bigint, p_kinds text[]) RETURNS {s}.tl_q_result
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
CREATE OR REPLACE FUNCTION {s}.tl_q_renew(p_entry bigint, p_attempt bigint, p_ttl_us bigint) RETURNS {s}.tl_q_result
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
CREATE OR REPLACE FUNCTION {s}.tl_q_record(p_entry bigint, p_attempt bigint, p_run text, p_max integer)
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
CREATE OR REPLACE FUNCTION {s}.tl_q_finish(p_entry bigint, p_attempt bigint, p_status text, p_error text)
RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    v_thread text;
    f record;
    res {s}.tl_q_result;
BEGIN
    SELECT q.thread_id INTO v_thread FROM {s}.run_queue q WHERE q.entry_id = p_entry;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock(1953263985, hashtext(v_thread));
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
