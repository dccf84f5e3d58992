-- The payments service's own database: its outbox, and a least-privilege role for walfold.
create table outbox (
    id uuid not null,
    aggregate_type text not null,
    aggregate_id text not null,
    event_type text not null,
    version bigint,
    payload jsonb not null,
    headers jsonb,
    occurred_at timestamptz not null default now()
);
create publication walfold_outbox for table public.outbox with (publish = 'insert, truncate', publish_via_partition_root = true);

create role walfold with login replication password 'walfold-secret';
grant select on outbox to walfold;
