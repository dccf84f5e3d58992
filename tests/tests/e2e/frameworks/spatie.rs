//! Spatie's laravel-event-sourcing with its Eloquent stored-event repository.
//!
//! Table as spatie/laravel-event-sourcing's
//! `database/migrations/create_stored_events_table.php.stub` creates it, in the SQL
//! Laravel's PostgreSQL schema grammar makes of it (`id()` a bigserial primary key,
//! `uuid` uuid, `unsignedBigInteger` bigint, `unsignedTinyInteger` smallint, `string`
//! varchar(255), `jsonb`, `timestamp` timestamp(0) without time zone, the two indexes
//! and the unique `(aggregate_uuid, aggregate_version)`). Rows as
//! `src/StoredEvents/Repositories/EloquentStoredEventRepository.php`'s `persist`
//! writes them: an Eloquent insert of `event_properties` (the JSON event serializer's
//! object of the event's properties), `aggregate_uuid`, `aggregate_version` (1, 2, …
//! per aggregate root), `event_version` 1, `event_class`, `meta_data` (`created-at`)
//! and `created_at`, returning the `id`; then a second save adding `stored-event-id`
//! to `meta_data` (an update, no event). An aggregate root persists its recorded
//! events one by one; a concurrent writer's same version fails on the unique index, so
//! no version repeats. The statements are ours.

use super::Framework;

const DDL: &str = r#"
create table "stored_events" ("id" bigserial not null primary key, "aggregate_uuid" uuid null,
  "aggregate_version" bigint null, "event_version" smallint not null default '1',
  "event_class" varchar(255) not null, "event_properties" jsonb not null, "meta_data" jsonb not null,
  "created_at" timestamp(0) without time zone not null);
create index "stored_events_event_class_index" on "stored_events" ("event_class");
create index "stored_events_aggregate_uuid_index" on "stored_events" ("aggregate_uuid");
alter table "stored_events" add constraint "stored_events_aggregate_uuid_aggregate_version_unique"
  unique ("aggregate_uuid", "aggregate_version");
create table account_balance (account_uuid uuid primary key, name text, balance numeric not null, events integer not null);
"#;

const ALICE: &str = "9a0d1c3e-5b7f-4e21-8c4d-6f2a1b3c4d5e";
const BOB: &str = "9a0d1c3e-5b7f-4e21-8c4d-6f2a1b3c4d5f";
const EVENTS: &str = "App\\Domain\\Account\\Events";

/// One `persist`: the insert, then the save that adds the stored event's ID.
fn persist(uuid: &str, version: i64, class: &str, properties: &str) -> String {
    format!(
        "insert into \"stored_events\" (\"event_properties\", \"aggregate_uuid\", \"aggregate_version\", \
         \"event_version\", \"event_class\", \"meta_data\", \"created_at\") values ('{properties}', '{uuid}', \
         {version}, 1, '{EVENTS}\\{class}', jsonb_build_object('created-at', to_char(now(), 'YYYY-MM-DD HH24:MI:SS')), \
         now()::timestamp(0)) returning \"id\"; \
         update \"stored_events\" set \"meta_data\" = \"meta_data\" || jsonb_build_object('stored-event-id', \"id\") \
         where \"id\" = currval('stored_events_id_seq');"
    )
}

pub fn framework() -> Framework {
    let writes = vec![
        persist(ALICE, 1, "AccountCreated", r#"{"name":"Alice"}"#),
        persist(ALICE, 2, "MoneyAdded", r#"{"amount":100}"#),
        persist(BOB, 1, "AccountCreated", r#"{"name":"Bob"}"#),
        persist(ALICE, 3, "MoneySubtracted", r#"{"amount":30}"#),
        persist(BOB, 2, "MoneyAdded", r#"{"amount":12.5}"#),
        // Serialized by a custom serializer into a JSON string, not an object.
        persist(BOB, 3, "MoneyAdded", r#""amount=7""#),
    ];
    Framework {
        preset: "spatie",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            "aggregate_id = \"coalesce(aggregate_uuid::text, id::text)\"",
            "version = \"aggregate_version\"",
        ],
        history: Vec::new(),
        writes,
        later: Vec::new(),
        text_ids: true,
        events: 6,
        dead_letters: &[],
        read_model: "select string_agg(account_uuid || ' ' || coalesce(name, '-') || ' ' || balance || ' ' || events, ', ' \
                     order by account_uuid) from account_balance",
        fold: r#"select string_agg(account_uuid || ' ' || coalesce(name, '-') || ' ' || balance || ' ' || events, ', '
                   order by account_uuid)
                 from (select aggregate_uuid as account_uuid, max(event_properties->>'name') as name,
                         coalesce(sum(case when event_class like '%MoneyAdded' then 1
                                           when event_class like '%MoneySubtracted' then -1 else 0 end
                                      * (case jsonb_typeof(event_properties) when 'object'
                                           then event_properties->>'amount' end)::numeric), 0) as balance,
                         count(*) as events
                       from stored_events group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spatie_folds_its_stored_events_strictly_through_the_readme_and_init() {
    framework().run().await;
}
