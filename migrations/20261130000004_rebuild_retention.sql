-- Which subscriber ID serves each projection's live storage. It starts as the config's
-- `subscriber` and changes when a rebuild switches over; `configured_subscriber` is the
-- config value it was recorded for, so an edited config is noticed.
create table projection (
    name text primary key,
    subscriber_id text not null,
    configured_subscriber text not null,
    updated_at timestamptz not null default now()
);

-- Rebuilds: a new subscriber replays the event log into shadow storage beside the live
-- one, then one transaction swaps them. `running` → `switched` → `finished`, or
-- `running`/`aborting` → `aborted`.
create table rebuild (
    subscriber_id text primary key,
    projection text not null,
    previous_subscriber text not null,
    live_table text not null,
    shadow_table text not null,
    retired_table text not null,
    state text not null check (state in ('running', 'aborting', 'switched', 'finished', 'aborted')),
    requested_at timestamptz not null default now(),
    switched_at timestamptz,
    ended_at timestamptz
);
-- One rebuild in progress per projection (a switched one keeps its retired table).
create unique index rebuild_one_open on rebuild (projection)
    where state in ('running', 'aborting', 'switched');

-- `retrying`: an operator asked for the event to go through its subscriber again.
alter table dead_letter drop constraint dead_letter_status_check;
alter table dead_letter add constraint dead_letter_status_check
    check (status in ('open', 'retrying', 'retried', 'discarded'));

-- Pruning claims by age: a BRIN index is nearly free to maintain on this
-- append-ordered column, unlike a B-tree on the hot claim path.
create index processed_message_processed_at on processed_message using brin (processed_at);
