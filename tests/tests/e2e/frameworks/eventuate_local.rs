//! Eventuate Local (event sourcing).
//!
//! Tables as eventuate-foundation/eventuate-common's `postgres/1.initialize-database.sql`
//! creates them: `eventuate.events(event_id varchar(1000) primary key, event_type,
//! event_data varchar(1000) not null, entity_type, entity_id, triggering_event, metadata,
//! published smallint default 0)` with its two indexes, and `eventuate.entities` (the
//! entity's version: its last event's ID). Rows as `EventuateCommonJdbcOperations.java`
//! (`insertIntoEventsTable`) writes them: one insert per event, the ID an Int128 string,
//! `event_data` and `metadata` JSON text, with the entity's row inserted or updated in the
//! same transaction; the CDC service later sets `published = 1`. The ID is the primary
//! key: no duplicate. The statements below are ours.

use super::Framework;

const DDL: &str = r#"
create schema eventuate;
create table eventuate.events (
  event_id varchar(1000) primary key,
  event_type varchar(1000),
  event_data varchar(1000) not null,
  entity_type varchar(1000) not null,
  entity_id varchar(1000) not null,
  triggering_event varchar(1000),
  metadata varchar(1000),
  published smallint default 0
);
create index events_idx on eventuate.events(entity_type, entity_id, event_id);
create index events_published_idx on eventuate.events(published, event_id);
create table eventuate.entities (
  entity_type varchar(1000),
  entity_id varchar(1000),
  entity_version varchar(1000) not null,
  primary key (entity_type, entity_id)
);
create index entities_idx on eventuate.entities(entity_type, entity_id);
create table account_balance (account_id text primary key, balance numeric not null);
"#;

const ACCOUNT: &str = "io.eventuate.example.banking.domain.Account";

/// `save`/`update` of an Account: its events and the entity's version, in one
/// transaction.
fn save(entity: &str, events: &[(&str, &str, &str)]) -> String {
    let mut tx = String::from("begin;");
    for (id, kind, data) in events {
        tx.push_str(&format!(
            "insert into eventuate.events (event_id, event_type, event_data, entity_type, entity_id, triggering_event, metadata) \
             values ('{id}', 'io.eventuate.example.banking.domain.{kind}', '{data}', '{ACCOUNT}', '{entity}', null, \
             '{{\"userId\":\"u-1\"}}');"
        ));
    }
    let last = events.last().expect("events").0;
    tx.push_str(&format!(
        "insert into eventuate.entities (entity_type, entity_id, entity_version) values ('{ACCOUNT}', '{entity}', '{last}') \
         on conflict (entity_type, entity_id) do update set entity_version = excluded.entity_version; commit;"
    ));
    tx
}

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    let id = |n: u32| format!("0000018c2f4e7b{n:02x}-0242ac1200060000");
    let a1 = "0000018c2f4e7a01-0242ac1200060000";
    let a2 = "0000018c2f4e7a02-0242ac1200060000";
    let writes = vec![
        save(
            a1,
            &[(&id(1), "AccountOpenedEvent", r#"{"initialBalance":100}"#)],
        ),
        save(
            a2,
            &[(&id(2), "AccountOpenedEvent", r#"{"initialBalance":20.5}"#)],
        ),
        save(
            a1,
            &[
                (
                    &id(3),
                    "AccountDebitedEvent",
                    r#"{"amount":30,"transactionId":"t-1"}"#,
                ),
                (
                    &id(4),
                    "AccountCreditedEvent",
                    r#"{"amount":4.25,"transactionId":"t-2"}"#,
                ),
            ],
        ),
        save(
            a2,
            &[(
                &id(5),
                "AccountCreditedEvent",
                r#"{"amount":30,"transactionId":"t-1"}"#,
            )],
        ),
        // Written by a hand-rolled serializer: no JSON.
        save(a2, &[(&id(6), "AccountDebitedEvent", "amount=5")]),
    ];
    Framework {
        preset: "eventuate_local",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        later: vec!["update eventuate.events set published = 1;".into()],
        text_ids: true,
        events: 5,
        dead_letters: &["json"],
        read_model: "select string_agg(account_id || ' ' || balance, ', ' order by account_id) from account_balance",
        fold: r#"select string_agg(account_id || ' ' || balance, ', ' order by account_id)
                 from (select entity_id as account_id,
                         sum(case event_type
                               when 'io.eventuate.example.banking.domain.AccountOpenedEvent' then (event_data::jsonb->>'initialBalance')::numeric
                               when 'io.eventuate.example.banking.domain.AccountCreditedEvent' then (event_data::jsonb->>'amount')::numeric
                               else -(event_data::jsonb->>'amount')::numeric end) as balance
                       from eventuate.events where event_data like '{%'
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventuate_local_folds_its_events_through_the_readme_and_init() {
    framework().run().await;
}
