-- Version 9: a commit without a checkpoint to a thread whose latest checkpoint another schema stamped (an older
-- node committed it) stamps its rows, and re-stamps the thread's older ones, in its own transaction (it used to
-- write the older stamp and leave the re-stamp to a second transaction). tl_commit takes the node's declared
-- schemas and the position its stamp was derived from, and answers the latest checkpoint to derive from (its
-- parameters and answers changed: the form of versions 7 and 8 is dropped, so a process of an earlier threadloom
-- has its commits refused, nothing written, until it is upgraded). tl_restamp holds the updates tl_stamp and
-- tl_commit share; tl_access_hash names a graph kind's implicit schema.

DROP FUNCTION IF EXISTS {s}.tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text,
    boolean, text[], text[], text[], text[], text[], jsonb, text, text, jsonb);

\ir functions/access.sql
\ir functions/commit.sql
