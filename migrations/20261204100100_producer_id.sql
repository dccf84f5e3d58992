-- issue 26: a producer's event ID may be any stable value (text, a number, a composite);
-- the event ID is then a UUIDv5 of it, and the value itself is kept for display (null
-- when the producer's ID was a UUID, as every event before this).
alter table event_log add column producer_id text;
alter table stream_stage add column producer_id text;

-- An `[[outbox]] expand` row is several events: a rejected one is identified by its
-- row's change and its index among the row's elements (0 for every other row), so the
-- rejections of two elements of one row are both recorded, each once across replays.
alter table dead_letter add column change_element integer not null default 0;
alter table stream_stage add column change_element integer;
drop index if exists dead_letter_ingest_change;
create unique index dead_letter_ingest_change
    on dead_letter (source, change_lsn, change_index, change_element)
    where subscriber_id is null and change_lsn is not null;
