-- Which source an ingest rejection came from: a WAL position, and a backfilled row's
-- digest, identify a row only within one source's database, so both identities now
-- include the source. Rejections recorded before came from the only source ('default').
alter table dead_letter add column source text not null default 'default';
drop index if exists dead_letter_ingest_change;
create unique index dead_letter_ingest_change on dead_letter (source, change_lsn, change_index)
    where subscriber_id is null and change_lsn is not null;
drop index if exists dead_letter_ingest_row;
create unique index dead_letter_ingest_row on dead_letter (source, row_digest)
    where subscriber_id is null and row_digest is not null;
