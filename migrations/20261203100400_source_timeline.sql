-- Which server history a slot's ingest position belongs to: the source's system
-- identifier and timeline (IDENTIFY_SYSTEM) as of the last start. A position is an LSN
-- of one timeline; after a failover the new primary's timeline forks from it, and what
-- walfold read past the fork is on no surviving server.
alter table ingest_position add column system_id text;
alter table ingest_position add column timeline bigint;

-- Each timeline change walfold saw on a slot's source: where the new timeline forks
-- from the one walfold read (`fork_lsn`), how far walfold had ingested then
-- (`ingested_lsn`; past the fork: events the new primary may not have) and the log's
-- head then (the old timeline's events are at or below it).
create table source_failover (
    id bigserial primary key,
    slot text not null,
    source text not null,
    system_id text not null,
    from_timeline bigint not null,
    to_timeline bigint not null,
    fork_lsn pg_lsn not null,
    ingested_lsn pg_lsn not null,
    head_seq bigint not null,
    detected_at timestamptz not null default now()
);

-- A gap's table outboxes backfilled over it (`on_slot_lost = "recreate"`): when, and
-- how many events that added. A gap with a message outbox stays unfilled: its events
-- exist only in WAL that is gone.
alter table slot_gap add column filled_at timestamptz;
alter table slot_gap add column backfilled bigint;
-- Gaps closed before: not backfilled by walfold (0), and not known to be filled. Only
-- gaps recorded from here on are backfilled by themselves.
update slot_gap set backfilled = 0 where to_lsn is not null;

-- When the events walfold read past a failover's fork were checked against the new
-- primary's outbox tables.
alter table source_failover add column phantoms_checked_at timestamptz;

-- Phantoms: events walfold read from the old primary past the fork that no outbox table
-- of the new primary holds (lost with the old primary, or deleted by the application:
-- an insert-then-delete outbox, and a message outbox, cannot be confirmed). Open until
-- accepted (`accepted_at`); reads of the event log (a rebuild, a new subscriber) skip
-- open ones.
create table phantom_event (
    event_id uuid primary key,
    seq bigint not null,
    slot text not null,
    failover_id bigint not null references source_failover (id),
    detected_at timestamptz not null default now(),
    accepted_at timestamptz
);
