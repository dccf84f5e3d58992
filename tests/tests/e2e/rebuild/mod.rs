//! Rebuilds, backfill, retention and dead-letter retries, with the real `walfold` binary
//! against a throwaway PostgreSQL. Expected read models are computed in SQL straight
//! from the event log or the outbox, never by walfold's own projection code.
//!
//! By behaviour: a rebuild's replay (`replay.rs`) and its progress (`progress.rs`), its switch-over (`switch_over.rs`),
//! what it refuses up front (`refusals.rs`), backfill (`backfill.rs`), retention and
//! pruning (`retention.rs`), dead-letter retries and discards (`dead_letters.rs`).

mod backfill;
mod dead_letters;
mod progress;
mod refusals;
mod replay;
mod retention;
mod switch_over;

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{count, walfold, Daemon, TestDb};

/// A state projection and a running total whose `sql` names `{table}`.
const PROJECTIONS: &str = r#"
[[projection]]
name = "order_state"
subscriber = "orders.state.v1"
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status", amount = ":payload.amount::numeric" }

[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
target = "public.order_total"
parallelism = 2
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#;

/// The suites' config with [`PROJECTIONS`], pruning left to the `prune` command.
fn builder(db: &TestDb) -> ConfigBuilder {
    walfold_tests::config_builder(&db.url())
        .set("retention", "prune_interval_s", 0)
        .text(PROJECTIONS)
}

/// [`builder`]'s config, then `extra`.
fn config(db: &TestDb, extra: &str) -> String {
    builder(db).text(extra).to_toml()
}

/// `n` events over `orders` aggregates in transactions of 10k rows, versions 1.. per order.
fn preload(db: &TestDb, n: i64, orders: i64) {
    let mut done = 0;
    while done < n {
        let k = (n - done).min(10_000);
        db.psql(&format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             select gen_random_uuid(), 'order', 'o-' || (i % {orders}), 'OrderChanged', \
                    i / {orders} + 1, \
                    jsonb_build_object('status', 's' || i, 'amount', (i % 97)::text) \
             from generate_series({from}, {to}) as i",
            from = done,
            to = done + k - 1
        ));
        done += k;
    }
}

/// Waits until every outbox row is in the log and `subscriber` has read all of it (every
/// partition). The outbox rows in these tests have distinct IDs.
async fn subscriber_caught_up(client: &tokio_postgres::Client, subscriber: &str, timeout: u64) {
    let sql = format!(
        "select (select count(*) from outbox) - (select count(*) from walfold.event_log) \
         + (select count(*) from walfold.checkpoint where subscriber_id = '{subscriber}' \
            and position < (select max(seq) from walfold.event_log)) \
         + (select count(*) from (select 1 where not exists \
            (select 1 from walfold.checkpoint where subscriber_id = '{subscriber}')) x)"
    );
    let start = std::time::Instant::now();
    while count(client, &sql).await != 0 {
        if start.elapsed() > Duration::from_secs(timeout) {
            panic!(
                "timed out waiting for {subscriber} to catch up:{}{}",
                walfold_tests::pipeline_state(client).await,
                walfold_tests::daemon_log_tails()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn rebuild_state(client: &tokio_postgres::Client, subscriber: &str) -> String {
    client
        .query_opt(
            "select state from walfold.rebuild where subscriber_id = $1",
            &[&subscriber],
        )
        .await
        .ok()
        .flatten()
        .map_or_else(|| "-".into(), |r| r.get(0))
}

const TOTALS_FROM_LOG: &str = "select aggregate_id, sum((payload->>'amount')::numeric) \
     from walfold.event_log group by aggregate_id";

/// A daemon on `text` with `events` preloaded over `orders` aggregates, once
/// `subscriber` has projected all of them.
async fn projected(
    db: &TestDb,
    text: &str,
    events: i64,
    orders: i64,
    subscriber: &str,
) -> (Daemon, tokio_postgres::Client) {
    let (d, client) = Daemon::streaming(db, text).await;
    preload(db, events, orders);
    subscriber_caught_up(&client, subscriber, 180).await;
    (d, client)
}

/// `walfold rebuild <projection> --subscriber <subscriber>` on the config at `cfg`:
/// (exit code, stdout, stderr).
fn start_rebuild(cfg: &str, projection: &str, subscriber: &str) -> (i32, String, String) {
    walfold(
        &["rebuild", projection, "--subscriber", subscriber, "-c", cfg],
        &[],
    )
}
