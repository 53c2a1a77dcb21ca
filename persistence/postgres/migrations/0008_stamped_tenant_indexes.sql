-- Version 8: the row tables' tenant indexes hold stamped rows only. A store with no access schema stamps no row
-- (access_tenant NULL): those rows were one index entry each per commit, never read (every tenant read and
-- row-level-security policy compares access_tenant with a tenant, which a NULL never equals).

DROP INDEX {s}.checkpoints_access_tenant;
CREATE INDEX checkpoints_access_tenant ON {s}.checkpoints (access_tenant, thread_id) WHERE access_tenant IS NOT NULL;
DROP INDEX {s}.pending_writes_access_tenant;
CREATE INDEX pending_writes_access_tenant ON {s}.pending_writes (access_tenant, thread_id)
    WHERE access_tenant IS NOT NULL;
DROP INDEX {s}.events_access_tenant;
CREATE INDEX events_access_tenant ON {s}.events (access_tenant, thread_id) WHERE access_tenant IS NOT NULL;
DROP INDEX {s}.effects_access_tenant;
CREATE INDEX effects_access_tenant ON {s}.effects (access_tenant, thread_id) WHERE access_tenant IS NOT NULL;
