-- What the publication looked like when walfold last checked it (the xmins of its
-- pg_publication row and of its pg_publication_rel rows: any rewrite changes them), and
-- the slot's confirmed position then. pgoutput drops the changes of a table while it is
-- out of the publication, and a change undone before walfold looks leaves only this
-- trace: a different signature means a slot gap from that position, backfilled.
alter table ingest_position add column publication_signature text;
alter table ingest_position add column publication_checked_at pg_lsn;
