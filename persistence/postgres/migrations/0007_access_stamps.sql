-- Version 7: access stamps (README "Access schemas"). Every row kind carries the schema hash, the tenant and the
-- declared attributes (jsonb) of its thread when the row was written or last stamped; rows written before are
-- NULL (a row-level-security policy on access_tenant hides them: unstamped is invisible). The thread row keeps its
-- latest checkpoint's stamp, which a commit without a checkpoint writes. Indexes: each row table by tenant
-- (per-tenant export, erase, RLS), threads by graph kind (the walks' pages) and by tenant (export_tenant's pages).
-- access_members: who serves which schema in a walk group, with expiry by the database clock.
-- tl_commit takes the stamp (its parameters changed: the form of versions 4 to 6 is dropped, so a process of an
-- earlier threadloom has its commits refused, nothing written, until it is upgraded).

ALTER TABLE {s}.checkpoints
    ADD COLUMN access_schema text, ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb;
ALTER TABLE {s}.pending_writes
    ADD COLUMN access_schema text, ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb;
ALTER TABLE {s}.events
    ADD COLUMN access_schema text, ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb;
ALTER TABLE {s}.effects
    ADD COLUMN access_schema text, ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb;
ALTER TABLE {s}.threads
    ADD COLUMN access_schema text, ADD COLUMN access_tenant text, ADD COLUMN access_attrs jsonb;

CREATE INDEX checkpoints_access_tenant ON {s}.checkpoints (access_tenant, thread_id);
CREATE INDEX pending_writes_access_tenant ON {s}.pending_writes (access_tenant, thread_id);
CREATE INDEX events_access_tenant ON {s}.events (access_tenant, thread_id);
CREATE INDEX effects_access_tenant ON {s}.effects (access_tenant, thread_id);
CREATE INDEX threads_graph ON {s}.threads (graph_id, thread_id) WHERE graph_id IS NOT NULL;
CREATE INDEX threads_tenant ON {s}.threads (tenant_key, thread_id) WHERE latest_id IS NOT NULL;

CREATE TABLE {s}.access_members (
    grp text COLLATE "C" NOT NULL,
    member text COLLATE "C" NOT NULL,
    serves jsonb NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (grp, member)
);

DROP FUNCTION IF EXISTS {s}.tl_commit(text, bigint, text, bigint, text, text, text, text, text, text, text, text,
    boolean, text[], text[], text[], text[], text[], jsonb);

\ir functions/commit.sql
\ir functions/access.sql
