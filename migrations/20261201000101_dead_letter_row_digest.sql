-- A row rejected by `walfold backfill` is identified by a digest of its table and values,
-- so backfilling the same rows again records nothing twice. (Such rows carried the
-- commit LSN 0/0 and their index in the page before: two at the same index on different
-- pages collided on dead_letter_ingest_once and the second was dropped.)
alter table dead_letter add column row_digest uuid;
create unique index dead_letter_ingest_row on dead_letter (row_digest)
    where subscriber_id is null and row_digest is not null;
