-- Strict-sequence projections (`version_mode = "strict"`): the last version applied per
-- aggregate and subscriber, written in the same transaction as the change it records.
create table aggregate_version (
    subscriber_id text not null,
    aggregate_type text not null,
    aggregate_id text not null,
    aggregate_key bytea generated always as (aggregate_key(aggregate_type, aggregate_id)) stored,
    version bigint not null,
    updated_at timestamptz not null default now(),
    primary key (subscriber_id, aggregate_key)
);

-- `waiting`: an event of a strict projection held for a missing version (reason
-- `version_gap`); it is not an open dead letter until the gap outlives `gap_timeout`.
alter table dead_letter drop constraint dead_letter_status_check;
alter table dead_letter add constraint dead_letter_status_check
    check (status in ('open', 'retrying', 'retried', 'discarded', 'waiting'));
