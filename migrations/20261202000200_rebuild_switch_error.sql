-- Why the last switch-over of a running rebuild failed (the daemon tries again), so
-- `walfold status` and `rebuild --wait` say it instead of only the daemon's log.
alter table rebuild add column switch_error text;
alter table rebuild add column switch_failed_at timestamptz;
