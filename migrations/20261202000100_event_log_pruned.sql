-- The highest seq that pruning (retention.event_log) may have deleted. A rebuild
-- replays only what the log still holds, so once this row exists a rebuild is refused
-- unless the operator asks to rebuild from the retained log.
create table event_log_pruned (
    one boolean primary key default true check (one),
    through bigint not null,
    pruned_at timestamptz
);

-- A log pruned before this table existed starts after seq 1 (seqs start at 1: a log
-- that starts later was pruned or, rarely, began with an ID repeated in one batch).
insert into event_log_pruned (through)
select min(seq) - 1 from event_log having min(seq) > 1;
