-- Version 4: tl_commit writes the texts the client encoded once (checkpoint, pending writes, events, effects)
-- and, when a check fails, answers what each check read instead of a code (the client raises through the one
-- commit rule). Its parameters changed, so the form of versions 1 to 3 is dropped (a new database never had
-- it): a process of an earlier threadloom still running on the schema then has its commits refused ("does not
-- match this version", nothing written) until it is upgraded.
DROP FUNCTION IF EXISTS {s}.tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text,
    boolean, text[], text[], text, text[], text[], text[], jsonb);

\ir functions/commit.sql
