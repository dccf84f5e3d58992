-- A source's ingest that stopped on a definite error (its slot lost, its publication
-- dropped) while the other sources go on: `pause_error` says why, `stopped` that it
-- does not resume by itself (the next append of the source, after the fix and a
-- restart, clears both).
alter table ingest_position add column stopped boolean not null default false;
