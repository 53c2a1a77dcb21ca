-- The run queue's functions that read or write refunded (version 6); the others are in run_queue.sql.

-- The entry as a queue function answers it (tl_q_result: code, current, previous, then the entry).
CREATE OR REPLACE FUNCTION {s}.tl_q_row(p_entry bigint, p_code integer, p_previous text) RETURNS {s}.tl_q_result
LANGUAGE sql AS $fn$
    SELECT p_code, NULL::bigint, p_previous, q.entry_id, q.thread_id, q.graph_id, q.input, q.tenant_id, q.status,
           q.attempts, q.leased_by, q.lease_expires_at, q.available_at, q.enqueued_at, q.finished_at, q.error,
           ARRAY(SELECT r.run_id FROM {s}.run_queue_runs r WHERE r.entry_id = q.entry_id ORDER BY r.position),
           q.refunded
    FROM {s}.run_queue q WHERE q.entry_id = p_entry
$fn$;

-- release: code 0 released (leasable again after p_delay_us; with p_refund the lease does not count as a try:
-- refunded goes up by one), 1 not the current lease (nothing changed).
CREATE OR REPLACE FUNCTION {s}.tl_q_release(p_entry bigint, p_attempt bigint, p_delay_us bigint, p_refund boolean)
RETURNS integer
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
            available_at = clock_timestamp() + p_delay_us * interval '1 microsecond',
            refunded = refunded + CASE WHEN p_refund THEN 1 ELSE 0 END
        WHERE entry_id = p_entry;
    RETURN 0;
END
$fn$;
