-- WAL ranges a recreated slot skipped (`on_slot_lost = "recreate"`): outbox rows
-- committed in them may be missing from the event log. Never silent: each is logged,
-- exported in metrics and shown by `walfold status`. The row is written before the new
-- slot is created (`to_lsn` null until it exists), so a crash in between cannot lose it.
create table slot_gap (
    id bigserial primary key,
    slot text not null,
    reason text not null,
    from_lsn pg_lsn not null,
    to_lsn pg_lsn,
    detected_at timestamptz not null default now()
);
create unique index slot_gap_one_open on slot_gap (slot) where to_lsn is null;
