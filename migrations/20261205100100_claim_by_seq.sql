-- issue 28: a claim is found by its event's seq, so each claim inserts at the right edge
-- of its subscriber's index instead of a random leaf of a UUID index (see claim.rs).
-- `message_id` stays on every claim (for display and pruning) but is indexed only for
-- the claims made before this migration (`seq` null), which keep deduplicating by it.
-- Rebuilds one index over the existing claims (about a minute per 10M claims); the
-- table is locked meanwhile, so wait for it no longer than the lock timeout.
set local lock_timeout = '30s';
alter table processed_message add column seq bigint;
alter table processed_message drop constraint processed_message_pkey;
create unique index processed_message_by_seq on processed_message (subscriber_id, seq);
create unique index processed_message_by_id on processed_message (subscriber_id, message_id)
    where seq is null;
-- A binary from before this migration claims without a seq, which no longer meets the
-- claims made by seq: refused (an environment error that pauses it) instead of applying
-- an event again. `not valid`: the claims made before keep their null.
alter table processed_message add constraint processed_message_claimed_by_seq
    check (seq is not null) not valid;
-- Without its primary key the table has no replica identity; a target that is also a
-- published source (`for all tables`) must still be able to delete claims.
alter table processed_message replica identity full;

-- The seq an event's claims carry when it is not its own: an event appended again after
-- pruning had deleted it carries the seq of its first delivery (from `retired_identity`).
alter table event_log add column claim_seq bigint;

-- The identities of pruned events, kept as long as a claim on them may be kept, so an
-- event delivered again meets its claims.
create table retired_identity (
    event_id uuid primary key,
    claim_seq bigint not null,
    retired_at timestamptz not null default now()
);
