//! `walfold demo`: a throwaway PostgreSQL with `wal_level=logical`, an outbox table and a
//! message outbox, three projections (version-guarded, a sum, strict-sequence), sample
//! events (a duplicate, out-of-order versions, a malformed row), the real pipeline, the
//! resulting read models; then everything is cleaned up.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use walfold_config::builder::ConfigBuilder;
use walfold_config::{Config, LogConfig};
use walfold_engine::Pipeline;
use walfold_pg::RowExt;
use walfold_store::Operator;
use walfold_tempdb::{Cluster, Options};

use crate::{telemetry, Failure};

const SCHEMA: &str = "
create table outbox (
    id uuid, aggregate_type text not null, aggregate_id text not null, event_type text not null,
    version bigint, payload jsonb, headers jsonb, occurred_at timestamptz default now());
create table order_state (order_id text primary key, status text not null, total numeric, version bigint not null);
create table revenue (currency text primary key, total numeric not null);
create table account_balance (account_id text primary key, balance numeric not null);
-- Only the producer writes the message outbox's events: walfold refuses one that PUBLIC
-- may write to (here the producer is the superuser that writes the sample events).
do $$ declare f regprocedure; begin
  for f in select p.oid::regprocedure from pg_proc p where p.proname = 'pg_logical_emit_message'
    and p.pronamespace = 'pg_catalog'::regnamespace loop
    execute format('revoke execute on function %s from public', f);
  end loop;
end $$;
";

const EVENTS: &str = "
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPlaced', 1, '{\"status\": \"placed\", \"total\": \"30.00\", \"currency\": \"EUR\"}'),
 ('00000000-0000-4000-8000-000000000002', 'order', 'o-1', 'OrderPaid', 2, '{\"status\": \"paid\", \"total\": \"30.00\", \"currency\": \"EUR\", \"amount\": \"30.00\"}'),
 ('00000000-0000-4000-8000-000000000003', 'order', 'o-2', 'OrderPlaced', 1, '{\"status\": \"placed\", \"total\": \"12.50\", \"currency\": \"EUR\"}');
-- o-2 is cancelled (v3) before the delayed payment (v2) arrives: the guard keeps v3.
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 ('00000000-0000-4000-8000-000000000005', 'order', 'o-2', 'OrderCancelled', 3, '{\"status\": \"cancelled\", \"total\": \"12.50\", \"currency\": \"EUR\"}');
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 ('00000000-0000-4000-8000-000000000004', 'order', 'o-2', 'OrderPaid', 2, '{\"status\": \"paid\", \"total\": \"12.50\", \"currency\": \"EUR\", \"amount\": \"12.50\"}');
-- A producer retry writes the o-1 payment again with the same event ID: applied once.
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 ('00000000-0000-4000-8000-000000000002', 'order', 'o-1', 'OrderPaid', 2, '{\"status\": \"paid\", \"total\": \"30.00\", \"currency\": \"EUR\", \"amount\": \"30.00\"}');
-- A row without an event ID goes to dead letters; the stream goes on.
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 (null, 'order', 'o-3', 'OrderPlaced', 1, '{}');
insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) values
 ('00000000-0000-4000-8000-000000000006', 'order', 'o-3', 'OrderPlaced', 1, '{\"status\": \"placed\", \"total\": \"7.00\", \"currency\": \"USD\"}');
-- Delta events without an outbox table: transactional logical decoding messages. The
-- debit (v3) commits before the second credit (v2): the strict projection holds it back.
select pg_logical_emit_message(true, 'walfold:accounts', '{\"id\": \"00000000-0000-4000-8000-0000000000a1\", \"aggregate_type\": \"account\", \"aggregate_id\": \"acc-1\", \"event_type\": \"Credited\", \"version\": 1, \"payload\": {\"amount\": \"100.00\"}}');
select pg_logical_emit_message(true, 'walfold:accounts', '{\"id\": \"00000000-0000-4000-8000-0000000000a3\", \"aggregate_type\": \"account\", \"aggregate_id\": \"acc-1\", \"event_type\": \"Debited\", \"version\": 3, \"payload\": {\"amount\": \"-30.00\"}}');
select pg_logical_emit_message(true, 'walfold:accounts', '{\"id\": \"00000000-0000-4000-8000-0000000000a2\", \"aggregate_type\": \"account\", \"aggregate_id\": \"acc-1\", \"event_type\": \"Credited\", \"version\": 2, \"payload\": {\"amount\": \"20.00\"}}');
";

/// A version-guarded state table, a sum of payments, and a strict-sequence balance fed
/// by the message outbox.
const PROJECTIONS: &str = r#"
[[projection]]
name = "order_state"
subscriber = "orders.state.v1"
aggregate_types = ["order"]
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status", total = ":payload.total::numeric" }

[[projection]]
name = "revenue"
subscriber = "orders.revenue.v1"
event_types = ["OrderPaid"]
sql = """
insert into revenue (currency, total) values (:payload.currency, :payload.amount::numeric)
on conflict (currency) do update set total = revenue.total + excluded.total
"""

[[projection]]
name = "account_balance"
subscriber = "accounts.balance.v1"
aggregate_types = ["account"]
version_mode = "strict"
sql = """
insert into account_balance (account_id, balance) values (:aggregate_id, :payload.amount::numeric)
on conflict (account_id) do update set balance = account_balance.balance + excluded.balance
"""
"#;

fn config(url: &str) -> String {
    ConfigBuilder::new(url)
        .source("slot", "walfold_demo")
        .source("publication", "walfold_demo")
        .outbox_table("public.outbox")
        .message_outbox("walfold:accounts")
        .set("log", "level", "warn")
        .text(PROJECTIONS)
        .to_toml()
}

pub async fn demo() -> Result<(), Failure> {
    telemetry::init(&LogConfig {
        level: "warn".into(),
        ..LogConfig::default()
    });
    println!("starting a throwaway PostgreSQL with wal_level=logical…");
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(Options::default()))
        .await
        .map_err(Failure::runtime)?
        .map_err(Failure::runtime)?;
    let db = "walfold_demo";
    cluster
        .psql("postgres", &format!("create database {db}"))
        .map_err(Failure::runtime)?;
    cluster.psql(db, SCHEMA).map_err(Failure::runtime)?;
    let url = cluster.url(db);
    let config = Config::from_toml(&config(&url), Vec::<(String, String)>::new())
        .map_err(Failure::config)?;
    println!("database {}, {} projections", db, config.projection.len());

    let cancel = CancellationToken::new();
    let pipeline = tokio::spawn(Pipeline::new(config).run(cancel.clone()));
    let client = walfold_pg::connect(&url).await.map_err(Failure::runtime)?;
    // Write once the slot exists, so the events are in its stream.
    wait_for(Duration::from_secs(30), || async {
        client
            .query_opt(
                "select 1 from pg_replication_slots where slot_name = 'walfold_demo' and active",
                &[],
            )
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await
    .map_err(|_| Failure::runtime("the replication slot did not become active"))?;
    println!("writing 8 outbox rows (one duplicate ID, one stale version, one malformed row) and 3 messages (one ahead of its turn)…");
    client
        .batch_execute(EVENTS)
        .await
        .map_err(Failure::runtime)?;
    let caught_up = wait_for(Duration::from_secs(60), || async {
        let Ok(s) = Operator::new(&client, &walfold_store::Schema::new("walfold"))
            .status_of_slot(&client, "walfold_demo")
            .await
        else {
            return false;
        };
        s.ingest.as_ref().is_some_and(|i| i.appended >= 9)
            && s.subscribers.len() == 3
            && s.subscribers.iter().all(|sub| sub.lag_events == 0)
    })
    .await;
    cancel.cancel();
    let stopped = pipeline.await.map_err(Failure::runtime)?;
    stopped.map_err(Failure::runtime)?;
    caught_up.map_err(|_| Failure::runtime("the projections did not catch up in time"))?;

    println!("\norder_state (table projection, version-guarded):");
    for r in client
        .query(
            "select order_id, status, total::text, version from order_state order by order_id",
            &[],
        )
        .await
        .map_err(Failure::runtime)?
    {
        let r = r.of("order_state");
        println!(
            "  {:<5} {:<10} {:>6}  v{}",
            r.col::<String>(0)?,
            r.col::<String>(1)?,
            r.col::<String>(2)?,
            r.col::<i64>(3)?
        );
    }
    println!("\nrevenue (sql projection, sums OrderPaid amounts; the duplicate counted once):");
    for r in client
        .query(
            "select currency, total::text from revenue order by currency",
            &[],
        )
        .await
        .map_err(Failure::runtime)?
    {
        let r = r.of("revenue");
        println!("  {}  {}", r.col::<String>(0)?, r.col::<String>(1)?);
    }
    println!("\naccount_balance (strict projection of delta events from a message outbox; v3 waited for v2):");
    for r in client
        .query(
            "select b.account_id, b.balance::text, v.version from account_balance b \
             left join walfold.aggregate_version v on v.subscriber_id = 'accounts.balance.v1' \
             and v.aggregate_type = 'account' and v.aggregate_id = b.account_id order by 1",
            &[],
        )
        .await
        .map_err(Failure::runtime)?
    {
        let r = r.of("account_balance");
        println!(
            "  {}  {}  v{}",
            r.col::<String>(0)?,
            r.col::<String>(1)?,
            r.col::<Option<i64>>(2)?.unwrap_or(0)
        );
    }
    let op = Operator::new(&client, &walfold_store::Schema::new("walfold"));
    let s = op
        .status_of_slot(&client, "walfold_demo")
        .await
        .map_err(Failure::runtime)?;
    if let Some(i) = &s.ingest {
        println!(
            "\nevent log: {} events appended, {} duplicate IDs skipped, {} malformed rows dead-lettered",
            i.appended, i.duplicates, i.malformed
        );
    }
    for sub in &s.subscribers {
        println!(
            "subscriber {:<18} applied {}  stale skipped {}  duplicates {}",
            sub.subscriber, sub.applied, sub.stale, sub.duplicates
        );
    }
    let letters = op
        .dead_letters(None, true, i64::MAX)
        .await
        .map_err(Failure::runtime)?;
    // Listed newest first; the demo tells them in the order they happened.
    for letter in letters.iter().rev() {
        println!("dead letter: {} — {}", letter.reason, letter.error);
    }
    drop(op);
    drop(client);
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .map_err(Failure::runtime)?;
    println!("\nthrowaway PostgreSQL stopped and removed");
    Ok(())
}

async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> Result<(), ()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < timeout {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(())
}
