-- A row rejected at ingest is identified by where it was read, no longer by its position
-- among its transaction's outbox inserts (that position shifted when the set of mapped
-- tables changed): a streamed row by the LSN of its change's own WAL record and its index
-- among that record's rows (a COPY writes several rows per record). Rows recorded before
-- keep (source_lsn, source_ordinal) and the index that made those unique; new rows leave
-- source_ordinal null, so the two never meet.
alter table dead_letter add column change_lsn pg_lsn, add column change_index integer;
create unique index dead_letter_ingest_change on dead_letter (change_lsn, change_index)
    where subscriber_id is null and change_lsn is not null;
