-- A row rejected at ingest is recorded once, however often its WAL is replayed after a
-- crash: it is identified by its source transaction's commit LSN and its position among
-- that transaction's outbox inserts.
alter table dead_letter add column source_ordinal integer;
create unique index dead_letter_ingest_once on dead_letter (source_lsn, source_ordinal)
    where subscriber_id is null and source_ordinal is not null;
