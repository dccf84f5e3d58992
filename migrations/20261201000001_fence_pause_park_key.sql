-- The leader's fencing token. A new leader advances `epoch` as it takes over; every
-- write transaction of a leader checks here that the epoch is still its own, under a
-- shared advisory lock of that epoch which the new leader takes exclusively (see
-- crates/store/src/leader.rs): a deposed leader's commits fail instead of landing.
create table leader (
    id boolean primary key default true check (id),
    epoch bigint not null,
    pid integer,
    acquired_at timestamptz
);
insert into leader (epoch) values (0);

-- Projector partitions paused by an error of the environment (privileges, a missing
-- table or column, disk full): nothing is dead-lettered for it; the row says why, and
-- goes when the partition resumes by itself.
create table projection_pause (
    subscriber_id text not null,
    partition integer not null,
    sqlstate text,
    error text not null,
    since timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    primary key (subscriber_id, partition)
);

-- A parked aggregate is keyed by a hash of its type and ID: an ID of any length can be
-- parked (a B-tree entry holds at most ~2.7 kB). The full ID stays in the row and in
-- the dead letter. Length-prefixed, so ('ab', 'c') and ('a', 'bc') differ.
-- (`convert_to` is stable only because the encoding could change; a database's cannot.)
create function aggregate_key(aggregate_type text, aggregate_id text) returns bytea
    language sql immutable parallel safe
    as $$ select sha256(convert_to(length(aggregate_type)::text || ':' || aggregate_type || aggregate_id, 'UTF8')) $$;
alter table parked_aggregate
    add column aggregate_key bytea generated always as (aggregate_key(aggregate_type, aggregate_id)) stored;
alter table parked_aggregate drop constraint parked_aggregate_pkey;
alter table parked_aggregate add primary key (subscriber_id, aggregate_key);
