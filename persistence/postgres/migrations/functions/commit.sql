-- commit (version 13: a commit notifies only while a listener is registered (tl_listen), and runs fewer statements;
-- version 12: a commit's notification carries its events when they fit; version 11: a new checkpoint
-- numbers its pending writes from 1 again; version 10: the checkpoint's metadata in a column of its own; version 9:
-- a commit without a checkpoint re-stamps a thread an older schema stamped, in its own transaction; version 7:
-- access stamps; version 5 a retract_turn commit's parent against the newest settled checkpoint instead of the
-- latest; versions 1 to 3 had a form that numbered spliced event texts and answered a code).
--
-- Writes one encoded commit in one statement: locks the thread's row (and the fence's, both in id order, so two
-- fenced writes never deadlock), reads what the commit checks need, and applies the commit when every check
-- passes. The client decides nothing here but "all passed": the checks' order and messages are the client's one
-- commit rule (domain/rules.py check_commit), which it runs on what this function answers.
--
-- Answers: applied, first_seq = the number of the commit's first event (its events take first_seq, +1, ...).
-- Refused (nothing written): first_seq NULL. Either way the other fields hold what the checks read: current (the
-- thread's claim token), fence_current (the fence thread's claim token), base (what the checkpoint's parent must
-- name: the latest id, with p_retract too: the cut back to the newest settled checkpoint comes after the checks),
-- duplicate (the checkpoint id is already in the history, before any cut), latest (the latest id, which pending
-- writes name when the commit has no checkpoint).
--
-- Access stamps: every row the commit writes, and the thread row, get p_access_* (derived by the client from the
-- commit's checkpoint). A commit without a checkpoint writes the thread's stamp (its latest checkpoint's) when
-- that stamp is of the committing node's schema for the thread's graph kind: p_schemas maps each graph kind the
-- node declared to its schema's hash, and a kind it did not declare has the implicit schema (tl_access_hash). When
-- the stamp is of another schema (an older node committed the latest checkpoint), every check passed and
-- p_stamp_pos is not the latest's position, the commit is refused (nothing written; first_seq NULL) with
-- stamp_pos and stamp_body, the latest checkpoint's position and text: the client derives the stamp from that
-- text and sends the commit again with it and p_stamp_pos = stamp_pos. Then, the latest still at that position,
-- the commit applies with that stamp and re-stamps the thread's older rows (tl_restamp, as tl_stamp does), in this
-- one transaction under the thread's row lock; the latest moved, it is refused again with the new latest. A walk
-- thread, or a thread without a checkpoint, is stamped as before (the thread's stamp: none).
--
-- Event texts arrive without their number: each is stored as '{{"seq":<n>,' || text, exactly the text the
-- client's encoder gives for number n (persistence/encoded.py EncodedEvent.text), so nothing is parsed here
-- or re-read by the client.
--
-- Notification (at COMMIT): a commit with events sends them, as a JSON array of their stored texts in seq order,
-- on {events_channel} when that payload is under 8000 bytes (pg_notify's limit), else the thread id on {channel} -
-- but only while a listener is registered in {s}.listeners (functions/listeners.sql). PostgreSQL serializes every
-- transaction that notifies, from its notification to the end of its commit (its WAL flush included), so commits
-- that notify cannot share a flush; a commit nobody listens for does not notify, and concurrent commits flush
-- together. The commit takes the listener lock in share mode before it reads anything, and holds it to its end: a
-- listener registers under the same lock in exclusive mode, so it waits for the commits that did not see it, and
-- every later commit sees it (read after the lock; the listener's LISTEN is committed with its registration).
--
-- Pending writes are numbered (idx) per checkpoint, from 1: a new checkpoint deletes the old one's and numbers its
-- own from 1 again, so its insert meets the deleted keys' index entries in the primary key's uniqueness check, which
-- marks them dead. Numbered on across checkpoints (before version 11), every deleted pending write left an index
-- entry that each later commit's delete walked again until a vacuum: a commit's cost grew with the commits since.
CREATE OR REPLACE FUNCTION {s}.tl_commit(
    p_thread text, p_token bigint, p_fence text, p_fence_token bigint,
    p_cp_id text, p_cp_parent text, p_cp_run text, p_cp_status text, p_cp_tenant text, p_cp_graph text,
    p_cp_origin text, p_cp_body text, p_cp_metadata jsonb, p_retract boolean,
    p_pw_cps text[], p_pw_bodies text[], p_ev_bodies text[], p_fx_keys text[], p_fx_bodies text[],
    p_metadata jsonb, p_access_schema text, p_access_tenant text, p_access_attrs jsonb,
    p_schemas jsonb, p_stamp_pos bigint,
    OUT first_seq bigint, OUT current bigint, OUT fence_current bigint, OUT base text, OUT duplicate boolean,
    OUT latest text, OUT stamp_pos bigint, OUT stamp_body text)
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    v_keep bigint;
    v_result text;
    v_stamp timestamptz;
    v_pos bigint;
    v_events integer := coalesce(cardinality(p_ev_bodies), 0);
    v_pws integer := coalesce(cardinality(p_pw_bodies), 0);
    v_pw bigint;
    v_note text;
BEGIN
    IF v_events > 0 THEN  -- before anything is read: a listener registering now waits for this commit to end
        PERFORM pg_advisory_xact_lock_shared({listen_lock}, hashtext({channel}));
    END IF;
    IF p_fence IS NOT NULL THEN
        PERFORM 1 FROM {s}.threads WHERE thread_id IN (p_thread, p_fence) ORDER BY thread_id FOR UPDATE;
        SELECT claim_token INTO fence_current FROM {s}.threads WHERE thread_id = p_fence;
    END IF;
    SELECT th.claim_token, th.latest_pos, th.latest_id, th.next_seq, th.next_pos, th.next_pw, th.stamped_at,
           th.graph_id, th.access_schema, th.access_tenant, th.access_attrs,
           v_events > 0 AND EXISTS (SELECT 1 FROM {s}.listeners) AS listening
        INTO r FROM {s}.threads th WHERE th.thread_id = p_thread FOR UPDATE;
    current := r.claim_token;
    latest := r.latest_id;
    base := r.latest_id;
    v_keep := r.latest_pos;
    v_pw := r.next_pw;
    IF p_cp_id IS NOT NULL THEN
        IF p_retract THEN  -- no settled checkpoint: NULL (the whole history goes)
            SELECT c.pos INTO v_keep FROM {s}.checkpoints c
                WHERE c.thread_id = p_thread AND c.status IN ('completed', 'failed')
                ORDER BY c.pos DESC LIMIT 1;
        END IF;
        duplicate := EXISTS (SELECT 1 FROM {s}.checkpoints c WHERE c.thread_id = p_thread AND c.id = p_cp_id);
    END IF;
    v_result := coalesce(p_cp_id, r.latest_id);
    IF current IS DISTINCT FROM p_token
        OR (p_fence IS NOT NULL AND fence_current IS DISTINCT FROM p_fence_token)
        OR (p_cp_id IS NOT NULL AND (p_cp_parent IS DISTINCT FROM base OR duplicate))
        OR NOT coalesce(v_result = ALL (p_pw_cps), p_pw_cps IS NULL)  -- a pending write names another
        OR (p_retract AND p_cp_id IS NULL) THEN
        RETURN;
    END IF;
    v_stamp := greatest(clock_timestamp(), r.stamped_at);
    IF p_cp_id IS NULL AND r.latest_pos IS NOT NULL THEN  -- the rows carry the latest checkpoint's stamp
        IF r.graph_id IS NULL OR r.graph_id = 'threadloom.access-walk' OR r.access_schema
            IS NOT DISTINCT FROM coalesce(p_schemas ->> r.graph_id, {s}.tl_access_hash(r.graph_id)) THEN
            p_access_schema := r.access_schema;
            p_access_tenant := r.access_tenant;
            p_access_attrs := r.access_attrs;
        ELSIF p_stamp_pos IS DISTINCT FROM r.latest_pos THEN  -- another schema's stamp: the client derives it
            stamp_pos := r.latest_pos;
            SELECT c.body INTO stamp_body FROM {s}.checkpoints c
                WHERE c.thread_id = p_thread AND c.pos = r.latest_pos;
            RETURN;
        ELSE  -- derived from the latest, still the latest: the commit's rows and the thread's older ones get it
            PERFORM {s}.tl_restamp(p_thread, p_access_schema, p_access_tenant, p_access_attrs);
        END IF;
    END IF;
    IF p_cp_id IS NOT NULL THEN
        IF p_retract THEN
            DELETE FROM {s}.checkpoints WHERE thread_id = p_thread AND pos > coalesce(v_keep, 0);
        END IF;
        v_pos := r.next_pos;
        v_pw := 1;  -- the new checkpoint's pending writes are numbered from 1
        INSERT INTO {s}.checkpoints (thread_id, pos, id, run_id, status, committed_at, seq_mark, body, metadata,
                                     access_schema, access_tenant, access_attrs)
            VALUES (p_thread, v_pos, p_cp_id, p_cp_run, p_cp_status, v_stamp, r.next_seq, p_cp_body, p_cp_metadata,
                    p_access_schema, p_access_tenant, p_access_attrs);
        IF r.next_pw > 1 THEN
            DELETE FROM {s}.pending_writes WHERE thread_id = p_thread;
        END IF;
        IF p_cp_origin IS NOT NULL THEN
            INSERT INTO {s}.children (parent, child, place)
                SELECT p_cp_origin, p_thread, nextval('{s}.places')
                WHERE NOT EXISTS (SELECT 1 FROM {s}.children c WHERE c.parent = p_cp_origin AND c.child = p_thread);
        END IF;
    END IF;
    IF v_pws = 1 THEN  -- one row: no function scan to set up
        INSERT INTO {s}.pending_writes (thread_id, idx, body, access_schema, access_tenant, access_attrs)
            VALUES (p_thread, v_pw, p_pw_bodies[1], p_access_schema, p_access_tenant, p_access_attrs);
    ELSIF v_pws > 1 THEN
        INSERT INTO {s}.pending_writes (thread_id, idx, body, access_schema, access_tenant, access_attrs)
            SELECT p_thread, v_pw + u.o - 1, u.b, p_access_schema, p_access_tenant, p_access_attrs
            FROM unnest(p_pw_bodies) WITH ORDINALITY AS u(b, o);
    END IF;
    IF v_events = 1 THEN
        INSERT INTO {s}.events (thread_id, seq, committed_at, body, access_schema, access_tenant, access_attrs)
            VALUES (p_thread, r.next_seq, v_stamp, '{{"seq":' || r.next_seq || ',' || p_ev_bodies[1],
                    p_access_schema, p_access_tenant, p_access_attrs);
    ELSIF v_events > 1 THEN
        INSERT INTO {s}.events (thread_id, seq, committed_at, body, access_schema, access_tenant, access_attrs)
            SELECT p_thread, r.next_seq + u.o - 1, v_stamp, '{{"seq":' || (r.next_seq + u.o - 1) || ',' || u.e,
                   p_access_schema, p_access_tenant, p_access_attrs
            FROM unnest(p_ev_bodies) WITH ORDINALITY AS u(e, o);
    END IF;
    IF coalesce(cardinality(p_fx_keys), 0) > 0 THEN
        INSERT INTO {s}.effects (thread_id, key, body, access_schema, access_tenant, access_attrs)
            SELECT p_thread, u.k, u.b, p_access_schema, p_access_tenant, p_access_attrs
            FROM unnest(p_fx_keys, p_fx_bodies) AS u(k, b)
            ON CONFLICT DO NOTHING;
    END IF;
    IF p_cp_id IS NOT NULL THEN
        UPDATE {s}.threads SET
            next_seq = next_seq + v_events, next_pos = v_pos + 1, next_pw = v_pw + v_pws,
            stamped_at = v_stamp, updated_at = v_stamp,
            metadata = CASE WHEN p_metadata IS NULL THEN metadata ELSE metadata || p_metadata END,
            latest_pos = v_pos, latest_id = p_cp_id, latest_run_id = p_cp_run, latest_status = p_cp_status,
            tenant_id = p_cp_tenant, graph_id = p_cp_graph, origin_parent = p_cp_origin,
            access_schema = p_access_schema, access_tenant = p_access_tenant, access_attrs = p_access_attrs
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
    IF r.listening THEN  -- the events themselves when they fit a notification, else the thread id: read them
        IF v_events = 1 THEN
            v_note := '[{{"seq":' || r.next_seq || ',' || p_ev_bodies[1] || ']';
        ELSE
            v_note := '[' || array_to_string(ARRAY(
            SELECT '{{"seq":' || (r.next_seq + u.o - 1) || ',' || u.e
            FROM unnest(p_ev_bodies) WITH ORDINALITY AS u(e, o) ORDER BY u.o), ',') || ']';
        END IF;
        IF octet_length(v_note) < 8000 THEN
            PERFORM pg_notify({events_channel}, v_note);
        ELSE
            PERFORM pg_notify({channel}, p_thread);
        END IF;
    END IF;
    first_seq := r.next_seq;
END
$fn$;
