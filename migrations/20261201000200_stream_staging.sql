-- Changes of in-progress transactions that the source streams (pgoutput protocol 2),
-- held until their commit moves them into the event log in one transaction, or their
-- abort deletes them. Projectors never read this table.
--
-- Unlogged: no staged row is ever the durable point. Every replication session starts
-- by clearing what an earlier one staged, because the server sends every transaction
-- that was not acknowledged again from its first segment; so a target crash that
-- empties this table (or a failover to a standby, where it is empty) loses nothing.
-- Logged, every streamed row would be written to WAL twice (staged, then moved), and a
-- source that is also the target would decode both.
create unlogged table stream_stage (
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
