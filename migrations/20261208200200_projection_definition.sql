-- What defines each subscriber's fold (crates/store/src/definition.rs; the definition
-- itself is crates/config/src/definition.rs): a projection whose definition changed
-- under the same subscriber is never folded on top of the rows the old one built.
-- A subscriber from an older release has no row: its first start records the
-- definition it runs with.
create table projection_definition (
    subscriber_id text primary key,
    projection text not null,
    -- SHA-256 (hex) of `definition`.
    digest text not null,
    -- The normalised text: one line per part, what a change's line diff is made of.
    definition text not null,
    -- The parts as written (statement, columns, filters, ...): a `sql` or `table`
    -- projection's fold is built again from them while its subscriber serves.
    parts jsonb not null,
    -- How it came to be recorded: `first` (first start), `rebuild` (a rebuild's new
    -- subscriber), `accepted` (an operator's `on_definition_change = "accept"`).
    origin text not null check (origin in ('first', 'rebuild', 'accepted')),
    recorded_at timestamptz not null default now(),
    -- `accepted`: the OS user, host and instance that accepted it.
    accepted_by text,
    -- `accepted`: the digest it replaced.
    previous_digest text
);

-- Every accepted change of definition, and every rebuild one started: what `walfold
-- status` and `walfold events --subscriber` show.
create table definition_change (
    id bigserial primary key,
    projection text not null,
    subscriber_id text not null,
    action text not null check (action in ('accepted', 'rebuild')),
    from_digest text not null,
    to_digest text not null,
    -- A line diff of the normalised definitions.
    diff text not null,
    by_whom text not null,
    at timestamptz not null default now()
);
create index definition_change_subscriber on definition_change (subscriber_id, id);
