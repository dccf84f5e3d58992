-- The publication each slot was read through: a slot decodes its changes with the
-- catalog as of each change, so only that publication (or one older than what the slot
-- still holds) can go on reading it. Recorded at each start once the source checks pass.
alter table ingest_position add column publication text;
