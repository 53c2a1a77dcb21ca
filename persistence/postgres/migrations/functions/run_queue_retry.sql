-- The run queue's retry (version 14); the other queue functions are in run_queue.sql and run_queue_refund.sql.

-- retry: code 0 the new entry (enqueued as tl_q_enqueue does, no delay; the failed entry's retried_as set to
-- it), 1 nothing written: the entry is unknown, not failed, or already retried (its row locked first: a
-- concurrent retry waits, then reads retried_as set and answers 1).
CREATE OR REPLACE FUNCTION {s}.tl_q_retry(p_entry bigint) RETURNS {s}.tl_q_result
LANGUAGE plpgsql AS $fn$
DECLARE
    r record;
    res {s}.tl_q_result;
BEGIN
    SELECT q.thread_id, q.graph_id, q.input, q.tenant_id INTO r
        FROM {s}.run_queue q
        WHERE q.entry_id = p_entry AND q.status = 'failed' AND q.retried_as IS NULL
        FOR UPDATE;
    IF NOT FOUND THEN
        res.code := 1;
        RETURN res;
    END IF;
    res := {s}.tl_q_enqueue(r.thread_id, r.graph_id, r.input, r.tenant_id, 0);
    UPDATE {s}.run_queue SET retried_as = res.entry_id WHERE entry_id = p_entry;
    RETURN res;
END
$fn$;
