-- Changes of in-progress transactions that the source streams (pgoutput protocol 2),
-- held until their commit moves them into the event log in one transaction, or their
-- abort deletes them. Projectors never read this table.
create table stream_stage (
    slot text not null,
    -- The top-level transaction, and the (sub)transaction that made the change: an
    -- aborted subtransaction's rows are deleted alone.
    xid int8 not null,
    subxid int8 not null,
    -- Order of the change within its transaction, across stream segments.
    ord int8 not null,
    event_id uuid,
    aggregate_type text,
    aggregate_id text,
    event_type text,
    version int8,
    payload jsonb,
    headers jsonb,
    occurred_at timestamptz,
    partition_hash int4,
    -- The change's WAL record and its index in it: identifies a rejected row across
    -- replays, as for a committed transaction.
    change_lsn pg_lsn,
    change_index int4,
    -- A row that cannot be an event: {event_id, aggregate_type, aggregate_id, error, raw}.
    rejected jsonb,
    primary key (slot, xid, ord)
);

create index stream_stage_subxid on stream_stage (slot, xid, subxid);
