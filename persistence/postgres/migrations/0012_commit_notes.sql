-- Version 12: a commit whose events fit a notification (its payload under 8000 bytes) sends them, as a JSON array
-- of their stored texts in seq order, on the schema's events channel instead of its thread id on the schema's
-- channel (tl_commit; same parameters and answers as version 11): a listener hands them to the thread's waiters
-- without reading them again. A bigger commit, and a delete, still send the thread id on the schema's channel.

\ir functions/commit.sql
