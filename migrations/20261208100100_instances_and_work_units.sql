-- Every instance works (crates/store/src/instance.rs, work_unit.rs, leader.rs).
--
-- Instances: each `walfold run` registers in the main target and heartbeats every
-- second; every session it opens holds the advisory key (tag_class, tag) shared, so the
-- server can say which backends are its own. An instance silent for longer than its
-- lease is dead: its work moves, and its sessions are ended.
create table instance (
    id uuid primary key,
    host text not null,
    pid integer not null,
    version text not null,
    -- The projections it may run (`[cluster] projections`); null: every one it knows.
    runs text[],
    -- The projections its config defines.
    knows text[] not null,
    -- Whether it may lead (ingest, prune, plan).
    leads boolean not null default true,
    tag integer not null,
    started_at timestamptz not null default now(),
    heartbeat_at timestamptz not null default now()
);

-- Units of projection work, on the target that holds their state: one per partition of
-- each subscriber the leader plans (live, or a rebuild's replay). The instance that owns
-- one proves in each of its write transactions that `token` is still its own, under a
-- shared advisory lock of that token that whoever takes the unit next takes exclusively.
-- `held`: the leader has taken it back for a change of plan (a switch-over, a new
-- partition count); nobody takes it until the leader lets go.
create sequence work_unit_token;
create table work_unit (
    subscriber_id text not null,
    partition integer not null,
    partitions integer not null,
    projection text not null,
    rebuild boolean not null default false,
    owner uuid,
    held boolean not null default false,
    token bigint not null default nextval('work_unit_token'),
    taken_at timestamptz,
    primary key (subscriber_id, partition),
    unique (token)
);

-- Leadership is a lease of an instance (`owner`) instead of a session's lock, so a frozen
-- leader is replaced. Each takeover draws a new `lead_token`; a release older than this
-- schema advances the epoch without one and is refused here, with the fix.
alter table leader add column owner uuid;
alter table leader add column lead_token uuid;

create function leader_refuse_older() returns trigger language plpgsql as $$
begin
    if new.epoch is distinct from old.epoch and new.lead_token is not distinct from old.lead_token then
        raise exception 'a walfold release older than this schema tried to lead: upgrade that instance to the release that migrated the schema (or newer)'
            using hint = 'every instance of a deployment runs the same release: stop the older one and start this release in its place';
    end if;
    return new;
end $$;

create trigger leader_refuse_older before update on leader
    for each row execute function leader_refuse_older();

-- Ends every session of a dead instance (the backends holding its tag shared, but the
-- caller's), so none of its open transactions or locks outlives its lease. A backend the
-- caller may not signal (another role, a superuser's) is left and counted.
create function end_sessions(tag_class integer, tag integer)
    returns table (ended integer, refused integer) language plpgsql as $$
declare
    b integer;
begin
    ended := 0;
    refused := 0;
    for b in select l.pid from pg_locks l
        where l.locktype = 'advisory' and l.classid = tag_class::oid and l.objid = tag::oid
          and l.objsubid = 2 and l.granted and l.pid <> pg_backend_pid()
    loop
        begin
            if pg_terminate_backend(b) then
                ended := ended + 1;
            end if;
        exception when insufficient_privilege then
            refused := refused + 1;
        end;
    end loop;
    return next;
end $$;
