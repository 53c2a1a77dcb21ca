-- Version 3: a retention policy's max_checkpoints may be any positive 64-bit integer (validation.MAX_INT): the
-- count parameter of tl_prune, tl_sweep and tl_prune_row is bigint. A parameter's type is part of a function's
-- signature, so the integer forms that versions 1 and 2 created are dropped (a new database never had them) and
-- the functions are created as functions/retention.sql defines them.
DROP FUNCTION IF EXISTS {s}.tl_prune(text, bigint, integer, bigint);
DROP FUNCTION IF EXISTS {s}.tl_sweep(text[], jsonb, bigint, integer, bigint, bigint);
DROP FUNCTION IF EXISTS {s}.tl_prune_row({s}.threads, timestamptz, bigint, integer, bigint, text[]);

\ir functions/retention.sql
