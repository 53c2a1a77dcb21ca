-- listeners (version 13): who listens for the schema's notifications.
--
-- tl_listen registers the calling session as a listener of the schema: a store's listening connection calls it in
-- the transaction of its LISTEN (one message), so the LISTEN and the registration commit together. tl_commit
-- notifies only while some listener is registered (functions/commit.sql), holding the listener lock in share mode
-- from before its first read to its end; tl_listen takes that lock in exclusive mode first, so it waits for the
-- commits that could not see it, and every commit after it sees it. Once registered, a listener sees each commit
-- with events either in its notification or in the read it makes after its LISTEN (the store's waiters re-read
-- whenever the listener (re-)connects).
--
-- A row names the listening session's backend pid. The session's end does not remove it: tl_listen removes the rows
-- of sessions that no longer exist (by pid, which every role may see in pg_stat_activity), and a store removes its
-- own row when it closes. A row left behind only makes commits notify as before version 13, until the next
-- registration removes it.
CREATE OR REPLACE FUNCTION {s}.tl_listen() RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock({listen_lock}, hashtext({channel}));
    DELETE FROM {s}.listeners l
        WHERE l.pid = pg_backend_pid() OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
    INSERT INTO {s}.listeners (pid) VALUES (pg_backend_pid());
END
$fn$;
