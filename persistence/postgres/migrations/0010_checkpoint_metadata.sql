-- Version 10: each checkpoint's metadata (a JSON object of strings) in a column of its own, which
-- search_history reads instead of parsing the whole body. Rows written before are NULL: search_history reads
-- their metadata from the body. tl_commit takes the column's value (its parameters changed: the form of version
-- 9 is dropped, so a process of an earlier threadloom has its commits refused, nothing written, until it is
-- upgraded).

ALTER TABLE {s}.checkpoints ADD COLUMN IF NOT EXISTS metadata jsonb;

DROP FUNCTION IF EXISTS {s}.tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text,
    boolean, text[], text[], text[], text[], text[], jsonb, text, text, jsonb, jsonb, bigint);

\ir functions/commit.sql
