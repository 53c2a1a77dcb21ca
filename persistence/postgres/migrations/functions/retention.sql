-- Retention: prune one thread (tl_prune), sweep a page of threads (tl_sweep), both through tl_prune_row.
-- Created by version 1, re-created by version 3 (bigint counts); included by the migrations that create them.

-- Prunes one locked thread by a retention policy (rules.checkpoints_to_prune and rules.pruned_floor); true
-- when it removed anything. Commit stamps never decrease along a history or log, so what age removes is a
-- prefix; what the count removes is one too. It keeps the newest checkpoint of every run it is given (the sweep
-- guard's answer) and of every run an open queue entry recorded, read after the caller locked the thread's row,
-- in the same transaction: a run recorded after that read has no checkpoint on the thread yet (it records
-- before it touches the thread, and its commits wait for the row lock this transaction holds).
CREATE OR REPLACE FUNCTION {s}.tl_prune_row(r {s}.threads, p_now timestamptz, p_max_age_us bigint,
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

CREATE OR REPLACE FUNCTION {s}.tl_prune(p_thread text, p_max_age_us bigint, p_max_cps bigint, p_max_events bigint)
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
CREATE OR REPLACE FUNCTION {s}.tl_sweep(p_ids text[], p_protected jsonb, p_max_age_us bigint, p_max_cps bigint,
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
