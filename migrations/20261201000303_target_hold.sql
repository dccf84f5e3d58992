-- How far each extra target lets go of the event log, as of the last prune pass. A
-- target taken out of the config keeps its row, so the log stays held for its
-- projections until an operator deletes the row: removing a target from the config
-- never lets pruning delete what its projections still need.
create table target_hold (
    target text primary key,
    bound bigint not null,
    updated_at timestamptz not null default now()
);
