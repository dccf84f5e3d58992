-- Which source a slot's ingest position belongs to, so a source whose slot name changed
-- (while its old slot still holds events) and a renamed source are noticed at start.
-- Positions recorded before came from the only source ('default').
alter table ingest_position add column source text not null default 'default';
