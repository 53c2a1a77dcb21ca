-- Version 14: RunQueue.retry enqueues a FAILED entry's run again at most once. run_queue.retried_as names the
-- entry a retry enqueued (NULL while the entry was not retried); tl_q_retry checks, enqueues and records it in
-- one transaction, the failed entry's row locked first, so two concurrent retries enqueue one entry. The reads
-- select the column; the other queue functions' answers do not carry it (they answer open or just-finished
-- entries, never retried ones).

ALTER TABLE {s}.run_queue ADD COLUMN retried_as bigint;

\ir functions/run_queue_retry.sql
