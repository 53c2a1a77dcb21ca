-- Deletes (tl_delete, fenced like a commit) and compaction of a thread's event log (tl_compact) (version 1).

-- delete: codes 0 deleted, 1 stale own token (n = current), 2 stale fence (n = the fence thread's current).
CREATE OR REPLACE FUNCTION {s}.tl_delete(p_thread text, p_token bigint, p_fence text, p_fence_token bigint,
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

CREATE OR REPLACE FUNCTION {s}.tl_compact(p_thread text, p_before bigint) RETURNS integer
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
