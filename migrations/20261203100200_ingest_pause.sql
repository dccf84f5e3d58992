-- Why a slot's ingest waits out an error of the environment, for `walfold status`
-- (before, only /readyz and walfold_ingest_paused said so). Set by the ingest loop,
-- cleared by the next append that commits.
alter table ingest_position add column paused_since timestamptz, add column pause_error text;
