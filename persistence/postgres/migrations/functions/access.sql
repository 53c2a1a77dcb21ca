-- access stamps (version 7, version 9 tl_restamp and tl_access_hash; README "Access schemas").
--
-- tl_access_hash: the hash of the implicit schema of a graph kind no schema was declared for, exactly as the client
-- computes it (domain/access.py AccessSchema.hash: "a1" and 14 hex digits of the SHA-256 of the canonical JSON
-- {{"attributes":[],"graph_id":<id>,"v":1}}). to_json escapes a text as the client's canonical JSON does (double
-- quote, backslash and the characters below U+0020, nothing else), so the two agree on every id (a test compares
-- them).
CREATE OR REPLACE FUNCTION {s}.tl_access_hash(p_graph text) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $fn$
    SELECT 'a1' || left(encode(sha256(convert_to(
        '{{"attributes":[],"graph_id":' || to_json(p_graph)::text || ',"v":1}}', 'UTF8')), 'hex'), 14)
$fn$;

-- tl_restamp: sets the stamp (p_schema, p_tenant, p_attrs) on every row of the thread whose stamp differs, and on
-- the thread's row; answers how many rows of checkpoints, pending writes, events and effects it changed. Its
-- callers hold the thread's row lock and checked that the stamp is derived from the latest checkpoint: tl_stamp,
-- and tl_commit for a commit without a checkpoint to a thread another schema stamped.
CREATE OR REPLACE FUNCTION {s}.tl_restamp(p_thread text, p_schema text, p_tenant text, p_attrs jsonb)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_n bigint;
    v_changed bigint := 0;
BEGIN
    UPDATE {s}.checkpoints SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_changed := v_changed + v_n;
    UPDATE {s}.pending_writes SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_changed := v_changed + v_n;
    UPDATE {s}.events SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_changed := v_changed + v_n;
    UPDATE {s}.effects SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_changed := v_changed + v_n;
    UPDATE {s}.threads SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread;
    RETURN v_changed;
END
$fn$;

-- tl_stamp: stamp_thread's write. The client read the thread's latest checkpoint (at p_pos) and derived its stamp
-- (p_schema, p_tenant, p_attrs; p_schema NULL: nothing to stamp). This function locks the thread's row (and the
-- fence's, both in id order, as tl_commit does), checks the fence, checks that the latest checkpoint is still the
-- one at p_pos (positions are never reused), and only then sets the stamp on every row of the thread whose stamp
-- differs (tl_restamp). So the stamp written is the one derived from the latest checkpoint under the thread's
-- lock, and a concurrent commit's newer stamp is never overwritten.
-- Answers code 0 (applied; changed = rows changed), 1 (the fence's token is not its thread's claim: fence_current
-- holds it; nothing written), 2 (the latest checkpoint moved since the client read it: read again; nothing written).
CREATE OR REPLACE FUNCTION {s}.tl_stamp(
    p_thread text, p_fence text, p_fence_token bigint, p_pos bigint,
    p_schema text, p_tenant text, p_attrs jsonb,
    OUT code integer, OUT fence_current bigint, OUT changed bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_pos bigint;
BEGIN
    changed := 0;
    IF p_fence IS NOT NULL THEN
        PERFORM 1 FROM {s}.threads WHERE thread_id IN (p_thread, p_fence) ORDER BY thread_id FOR UPDATE;
        SELECT claim_token INTO fence_current FROM {s}.threads WHERE thread_id = p_fence;
        IF fence_current IS DISTINCT FROM p_fence_token THEN
            code := 1;
            RETURN;
        END IF;
    END IF;
    SELECT latest_pos INTO v_pos FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
    IF v_pos IS DISTINCT FROM p_pos THEN
        code := 2;
        RETURN;
    END IF;
    code := 0;
    IF p_schema IS NULL THEN
        RETURN;
    END IF;
    changed := {s}.tl_restamp(p_thread, p_schema, p_tenant, p_attrs);
END
$fn$;

-- tl_heartbeat: replaces a member's heartbeat (expiring p_ttl_us microseconds from now by the database clock) and
-- drops the group's expired ones.
CREATE OR REPLACE FUNCTION {s}.tl_heartbeat(p_grp text, p_member text, p_serves jsonb, p_ttl_us bigint)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM {s}.access_members WHERE grp = p_grp AND expires_at <= clock_timestamp();
    INSERT INTO {s}.access_members (grp, member, serves, expires_at)
        VALUES (p_grp, p_member, p_serves, clock_timestamp() + p_ttl_us * interval '1 microsecond')
        ON CONFLICT (grp, member) DO UPDATE SET serves = excluded.serves, expires_at = excluded.expires_at;
END
$fn$;
