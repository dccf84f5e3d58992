-- walfold's own schema. Runs with search_path set to the configured schema, so names are
-- unqualified here and land in that schema.

-- Every outbox event, once, in source commit order. `seq` is assigned by the single
-- appender; `event_id` is the producer's ID and the unit of deduplication.
create table event_log (
    seq bigint primary key,
    event_id uuid not null unique,
    aggregate_type text not null,
    aggregate_id text not null,
    event_type text not null,
    version bigint,
    payload jsonb not null,
    headers jsonb,
    occurred_at timestamptz,
    partition_hash integer not null check (partition_hash >= 0),
    source_lsn pg_lsn not null,
    committed_at timestamptz,
    appended_at timestamptz not null default now()
);

-- Dedup claims: a subscriber claims an event in the same transaction as its projection
-- change. Zero rows claimed means the event was already applied.
create table processed_message (
    subscriber_id text not null,
    message_id uuid not null,
    processed_at timestamptz not null default now(),
    primary key (subscriber_id, message_id)
);

-- Where each subscriber partition has read the event log up to (an optimisation: the
-- claims, not the checkpoint, decide what is a duplicate), and what it did.
create table checkpoint (
    subscriber_id text not null,
    partition integer not null,
    partitions integer not null,
    position bigint not null,
    applied bigint not null default 0,
    duplicates bigint not null default 0,
    stale bigint not null default 0,
    dead_lettered bigint not null default 0,
    last_committed_at timestamptz,
    updated_at timestamptz not null default now(),
    primary key (subscriber_id, partition)
);

-- Rows and events set aside with their reason; nothing is dropped silently.
-- subscriber_id is null for rows rejected at ingest (malformed, id_conflict).
create table dead_letter (
    id bigserial primary key,
    subscriber_id text,
    event_id uuid,
    seq bigint,
    aggregate_type text,
    aggregate_id text,
    reason text not null,
    error text not null,
    raw jsonb,
    existing jsonb,
    attempts integer not null default 1,
    source_lsn pg_lsn,
    first_failed_at timestamptz not null default now(),
    last_failed_at timestamptz not null default now(),
    status text not null default 'open' check (status in ('open', 'retried', 'discarded'))
);
create index dead_letter_subscriber_status on dead_letter (subscriber_id, status);

-- Aggregates whose events wait for a subscriber because one of them failed for good.
create table parked_aggregate (
    subscriber_id text not null,
    aggregate_type text not null,
    aggregate_id text not null,
    dead_letter_id bigint not null references dead_letter (id),
    parked_at timestamptz not null default now(),
    primary key (subscriber_id, aggregate_type, aggregate_id)
);

-- The ingest side's durable position: the end LSN of the last source transaction whose
-- events are all in event_log, and what ingest did. One row per slot.
create table ingest_position (
    slot text primary key,
    lsn pg_lsn not null,
    appended bigint not null default 0,
    duplicates bigint not null default 0,
    id_conflicts bigint not null default 0,
    malformed bigint not null default 0,
    ignored_changes bigint not null default 0,
    updated_at timestamptz not null default now()
);
