-- Claims: take (tl_claim), renew (tl_renew) and release (tl_release) a thread's claim (version 1).

-- claim: one statement; inserts the row when missing, locks it, refuses a live claim, else takes a token.
CREATE OR REPLACE FUNCTION {s}.tl_claim(p_thread text, p_holder text, p_ttl_us bigint, p_tenant text,
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

CREATE OR REPLACE FUNCTION {s}.tl_renew(p_thread text, p_token bigint, p_ttl_us bigint,
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

CREATE OR REPLACE FUNCTION {s}.tl_release(p_thread text, p_token bigint) RETURNS integer
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
