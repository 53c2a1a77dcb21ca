-- Version 9: reserved for a migration of another line of work (it takes this number when both are merged).
SELECT 1;
