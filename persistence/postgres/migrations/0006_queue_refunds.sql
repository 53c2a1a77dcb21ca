-- Version 6: release_lease(..., refund => true) hands a lease back without counting it as a try (a worker that
-- stopped gracefully): run_queue.refunded counts those leases, and every entry a queue function answers carries
-- it (tl_q_result gains the attribute, last). attempts still numbers every lease: it stays the fence.

ALTER TABLE {s}.run_queue ADD COLUMN refunded bigint NOT NULL DEFAULT 0;
ALTER TYPE {s}.tl_q_result ADD ATTRIBUTE refunded bigint;
DROP FUNCTION IF EXISTS {s}.tl_q_release(bigint, bigint, bigint);

\ir functions/run_queue_refund.sql
