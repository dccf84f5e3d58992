-- walfold acknowledges a slot position only once it has recorded it here (before this,
-- an idle slot's keepalives were acknowledged without a write). Set with every write of
-- the position from then on: where it is true, a slot found past the recorded position
-- was moved by something else (pg_replication_slot_advance, another client of the
-- slot), and the rows committed in between were never streamed.
alter table ingest_position add column acks_recorded boolean not null default false;
