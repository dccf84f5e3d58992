-- WAL ranges a recreated slot skipped (`on_slot_lost = "recreate"`): outbox rows
-- committed in them may be missing from the event log. Never silent: each is logged,
-- counted in metrics and shown by `walfold status`.
create table slot_gap (
    id bigserial primary key,
    slot text not null,
    reason text not null,
    from_lsn pg_lsn not null,
    to_lsn pg_lsn not null,
    detected_at timestamptz not null default now()
);
