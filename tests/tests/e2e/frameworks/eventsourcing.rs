//! Python `eventsourcing` (pyeventsourcing/eventsourcing) with its PostgreSQL
//! persistence module.
//!
//! Tables as `eventsourcing/postgres.py` creates them:
//! `PostgresApplicationRecorder.construct_create_table_statements` for
//! `<app>_events` (the application's name in lower case, `Factory.application_recorder`)
//! and the unique notification index; `PostgresAggregateRecorder`'s for
//! `<app>_snapshots` (no `notification_id`). Rows as `insert_events` writes them: in one
//! transaction, `SET LOCAL lock_timeout`, `LOCK TABLE … IN EXCLUSIVE MODE`, then one
//! `INSERT … VALUES (%s, %s, %s, %s) RETURNING notification_id` per event. The state is
//! `eventsourcing/persistence.py`'s `Mapper.to_stored_event`: the event's attributes
//! but `originator_id` and `originator_version`, through the default `JSONTranscoder`
//! (compact UTF-8 JSON; `datetime`, `Decimal` and `UUID` as `{"_type_": …, "_data_": …}`);
//! with a compressor configured (`COMPRESSOR_TOPIC`), zlib bytes. The identity is
//! `(originator_id, originator_version)`, the primary key: a conflicting write fails,
//! so no row repeats. The statements are ours.

use super::Framework;

const DDL: &str = r#"
create table if not exists bankaccounts_events (originator_id uuid not null, originator_version bigint not null,
  topic text, state bytea, notification_id bigserial, primary key (originator_id, originator_version))
  with (autovacuum_enabled=false);
create unique index if not exists bankaccounts_events_notification_id_idx
  on bankaccounts_events (notification_id asc);
create table if not exists bankaccounts_snapshots (originator_id uuid not null, originator_version bigint not null,
  topic text, state bytea, primary key (originator_id, originator_version))
  with (autovacuum_enabled=false);
create table account_balance (account_id uuid primary key, full_name text, balance numeric not null, events integer not null);
"#;

const ALICE: &str = "1c1ca1de-0000-4000-8000-00000000a11c";
const BOB: &str = "1c1ca1de-0000-4000-8000-000000000b0b";
const TOPIC: &str = "bankaccounts.domainmodel:BankAccount";

/// The event's state as the JSON transcoder writes it.
fn state(attributes: &str) -> String {
    format!(
        r#"{{"timestamp":{{"_type_":"datetime_iso","_data_":"2026-12-03T08:43:40.512204+00:00"}}{attributes}}}"#
    )
}

fn opened(name: &str) -> String {
    state(&format!(
        r#","originator_topic":"{TOPIC}","full_name":"{name}","email_address":"{}@example.com""#,
        name.to_lowercase()
    ))
}

fn appended(amount: &str) -> String {
    state(&format!(
        r#","amount":{{"_type_":"decimal_str","_data_":"{amount}"}}"#
    ))
}

/// One `save()`: the lock, then each event.
fn save(events: &[(&str, i64, &str, String)]) -> String {
    let mut tx =
        "begin; set local lock_timeout = '5s'; lock table bankaccounts_events in exclusive mode;"
            .to_owned();
    for (id, version, kind, state) in events {
        tx.push_str(&format!(
            "insert into bankaccounts_events values ('{id}', {version}, '{TOPIC}.{kind}', convert_to('{state}', 'UTF8')) \
             returning notification_id;"
        ));
    }
    tx.push_str("commit;");
    tx
}

pub fn framework() -> Framework {
    let writes = vec![
        // Both accounts start at version 1: only the composite tells their events apart.
        save(&[(ALICE, 1, "Opened", opened("Alice")), (ALICE, 2, "TransactionAppended", appended("100.00"))]),
        save(&[(BOB, 1, "Opened", opened("Bob"))]),
        save(&[(BOB, 2, "TransactionAppended", appended("40.00")), (ALICE, 3, "TransactionAppended", appended("-25.50"))]),
        // A snapshot (another table: no events).
        format!(
            "insert into bankaccounts_snapshots values ('{ALICE}', 3, 'eventsourcing.domain:Snapshot', \
             convert_to('{}', 'UTF8'));",
            state(r#","topic":"bankaccounts.domainmodel:BankAccount","state":{"balance":"74.50"}"#)
        ),
        // Written after the application turned on zlib compression: no JSON.
        "begin; lock table bankaccounts_events in exclusive mode; \
         insert into bankaccounts_events values ('1c1ca1de-0000-4000-8000-00000000a11c', 4, \
         'bankaccounts.domainmodel:BankAccount.TransactionAppended', \
         '\\x789c558c310e83301004ffb26d009d2f268aee1df4a753e2c2521c507c1408f1f7c41d2967473b3b3c9754ddca02d9a1be2d4921789aa76634d7191df4c7d67626bef5817bba4e7497188578180333c50b9110e1e860655edffe9f4b8f5ceca5d53fe75a18877639bef4aa2860'::bytea) \
         returning notification_id; commit;"
            .into(),
        save(&[(BOB, 3, "TransactionAppended", appended("2.50"))]),
    ];
    Framework {
        preset: "eventsourcing",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        text_ids: true,
        later: Vec::new(),
        events: 6,
        dead_letters: &["column `state` is bytes that are not utf-8"],
        read_model: "select string_agg(account_id || ' ' || full_name || ' ' || balance || ' ' || events, ', ' \
                     order by account_id) from account_balance",
        fold: r#"select string_agg(account_id || ' ' || full_name || ' ' || balance || ' ' || events, ', '
                   order by account_id)
                 from (select originator_id as account_id,
                         max(convert_from(state, 'UTF8')::jsonb->>'full_name') as full_name,
                         coalesce(sum((convert_from(state, 'UTF8')::jsonb->'amount'->>'_data_')::numeric), 0) as balance,
                         count(*) as events
                       from bankaccounts_events where get_byte(state, 0) = 123
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsourcing_folds_its_stored_events_by_composite_identity_through_the_readme_and_init() {
    framework().run().await;
}
