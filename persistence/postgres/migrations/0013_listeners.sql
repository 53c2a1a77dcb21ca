-- Version 13: a commit notifies only while a store listens on the schema. PostgreSQL serializes the transactions
-- that notify, each through its WAL flush, so concurrent commits with events could not share a flush. Listening
-- stores register in the table listeners (tl_listen, called with their LISTEN); tl_commit (same parameters and
-- answers as version 12) notifies only while a listener is registered, and runs fewer statements (one pending
-- write or event is inserted without a function scan; the pending writes' check is one expression).

CREATE TABLE IF NOT EXISTS {s}.listeners (
    pid integer PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT clock_timestamp()
);

\ir functions/listeners.sql
\ir functions/commit.sql
