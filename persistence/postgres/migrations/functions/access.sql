-- access stamps (version 7; README "Access schemas").
--
-- tl_stamp: stamp_thread's write. The client read the thread's latest checkpoint (at p_pos) and derived its stamp
-- (p_schema, p_tenant, p_attrs; p_schema NULL: nothing to stamp). This function locks the thread's row (and the
-- fence's, both in id order, as tl_commit does), checks the fence, checks that the latest checkpoint is still the
-- one at p_pos (positions are never reused), and only then sets the stamp on every row of the thread whose stamp
-- differs. So the stamp written is the one derived from the latest checkpoint under the thread's lock, and a
-- concurrent commit's newer stamp is never overwritten.
-- Answers code 0 (applied; changed = rows changed), 1 (the fence's token is not its thread's claim: fence_current
-- holds it; nothing written), 2 (the latest checkpoint moved since the client read it: read again; nothing written).
CREATE OR REPLACE FUNCTION {s}.tl_stamp(
    p_thread text, p_fence text, p_fence_token bigint, p_pos bigint,
    p_schema text, p_tenant text, p_attrs jsonb,
    OUT code integer, OUT fence_current bigint, OUT changed bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_pos bigint;
    v_n bigint;
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
    UPDATE {s}.checkpoints SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    changed := changed + v_n;
    UPDATE {s}.pending_writes SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    changed := changed + v_n;
    UPDATE {s}.events SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    changed := changed + v_n;
    UPDATE {s}.effects SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread AND (access_schema IS DISTINCT FROM p_schema
            OR access_tenant IS DISTINCT FROM p_tenant OR access_attrs IS DISTINCT FROM p_attrs);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    changed := changed + v_n;
    UPDATE {s}.threads SET access_schema = p_schema, access_tenant = p_tenant, access_attrs = p_attrs
        WHERE thread_id = p_thread;
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
