-- Version 5: tl_commit checks a retract_turn commit's checkpoint parent against the latest checkpoint before the
-- cut, like every other commit, and cuts back to the newest settled checkpoint only once every check passed.
-- Same parameters and answers as version 4 (base now always names the latest).

\ir functions/commit.sql
