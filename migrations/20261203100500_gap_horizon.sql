-- Bounds for a gap's backfill. Every minute or so walfold records, per slot, a pair read
-- from the source's slot in one row: its confirmed position and its catalog_xmin (the
-- oldest transaction running at a point at or before that position; as a 64-bit xid).
-- Every transaction that commits after the position has an xid at or after it, so a
-- gap from LSN L only needs the outbox rows whose xmin is at or after the xid of the
-- last pair at or before L (rows a vacuum froze have lost their xmin: always read).
create table source_horizon (
    slot text not null,
    lsn pg_lsn not null,
    xid bigint not null,
    recorded_at timestamptz not null default now()
);
create index source_horizon_slot_lsn on source_horizon (slot, lsn);

-- A gap backfill's progress: rows of the outbox tables read so far (`scanned`), the
-- xid bound it used (null: the whole tables), and when it last reported.
alter table slot_gap add column scanned bigint;
alter table slot_gap add column since_xid bigint;
alter table slot_gap add column progress_at timestamptz;

-- When the slot walfold found after a failover was checked against the fork: a slot
-- that exists on the new primary past the fork (one created there after the promotion,
-- e.g. a Patroni permanent slot) never streams what the new primary committed between,
-- so that range is recorded as a gap. Failovers recorded before are taken as checked.
alter table source_failover add column slot_checked_at timestamptz;
update source_failover set slot_checked_at = now();

-- Why an operator accepted a phantom (`walfold phantoms accept --reason`).
alter table phantom_event add column accept_reason text;
