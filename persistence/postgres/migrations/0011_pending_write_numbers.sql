-- Version 11: a new checkpoint numbers its pending writes from 1 again (tl_commit; same parameters and answers as
-- version 10). Numbered on across checkpoints, every pending write a checkpoint replaced left an index entry that
-- each later commit's delete of the latest's pending writes walked again until a vacuum, so a commit's cost grew
-- with the commits made on its thread since; a thread's next_pw restarts at its next checkpoint.

\ir functions/commit.sql
