-- The application's outbox and read models, and a least-privilege role for walfold.
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
create table order_status (order_id text primary key, status text not null, version bigint not null);
create table order_totals (order_id text primary key, total numeric, currency text, version bigint not null);
-- Folded from the payments service's outbox (the second source).
create table order_payments (order_id text primary key, paid numeric not null default 0);

-- The publication is created here by the table owner, so walfold needs no ownership:
-- inserts (and truncates) only, so the application's deletes never need a replica identity.
create publication walfold_outbox for table public.outbox with (publish = 'insert, truncate', publish_via_partition_root = true);

create role walfold with login replication password 'walfold-secret';
grant create on database app to walfold;            -- walfold's own schema
grant select on outbox to walfold;
grant select, insert, update on order_status, order_totals, order_payments to walfold;
