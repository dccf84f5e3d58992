//! Projections on another server (`[targets.NAME]`, `projection.database`): their read
//! models and state live on a second PostgreSQL cluster while the event log stays on
//! the first. One daemon config, one second cluster, in phases: the second target
//! folds what the main one folds; it is stopped mid-stream and only its projections
//! pause; the daemon is SIGKILLed repeatedly while events stream; its projection is
//! rebuilt under a new subscriber. And the fence holds on an extra target: a deposed
//! leader's transaction there lands before the new leader's takeover or fails.
//!
//! By behaviour: the second target's fold through its outage, crashes, a rebuild and a
//! replay after pruning (`fold.rs`), the fence on an extra target (`fence.rs`), a target
//! or projection taken out of or moved in the config (`config_changes.rs`).

mod config_changes;
mod fence;
mod fold;

use std::time::Duration;

use tokio_postgres::Client;
use walfold_tests::{count, eventually};

/// The second target's projections: a running sum (rebuildable: it names `{table}`)
/// with two partitions, and a guarded state upsert.
const REPORTING: &str = r#"
[[projection]]
name = "reporting_total"
subscriber = "reporting.total.v1"
database = "reporting"
parallelism = 2
max_attempts = 2
retry_backoff_ms = 10
target = "public.order_total"
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""

[[projection]]
name = "reporting_state"
subscriber = "reporting.state.v1"
database = "reporting"
table = "public.order_state"
key = "order_id"
version_column = "version"
dedup_retention = "1s"
max_attempts = 2
retry_backoff_ms = 10
columns = { status = ":payload.status", amount = ":payload.amount::numeric" }
"#;

/// Waits until every partition of each of `subscribers` on the second target has read
/// the main log to its head (and the log holds `events`).
async fn reporting_caught_up(main: &Client, rep: &Client, events: i64, subscribers: &[&str]) {
    eventually(
        Duration::from_secs(90),
        "the second target's projections to catch up",
        || async {
            let head = count(main, "select coalesce(max(seq), 0) from walfold.event_log").await;
            if count(main, "select count(*) from walfold.event_log").await < events {
                return false;
            }
            for s in subscribers {
                let Ok(row) = rep
                    .query_one(
                        "select count(*), coalesce(min(position), 0), coalesce(max(partitions), 1)::int8 \
                         from walfold.checkpoint where subscriber_id = $1",
                        &[s],
                    )
                    .await
                else {
                    return false;
                };
                let (n, min, partitions): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                if n < partitions || min < head {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// Rows of `sql` on `client`, as text, sorted.
async fn rows(client: &Client, sql: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = client
        .query(sql, &[])
        .await
        .map(|rs| rs.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default();
    rows.sort();
    rows
}

/// Found by a stranger: an extra target taken out of the config (its projections with
/// it) while it holds state keeps holding the event log where it last did, so a prune
/// never deletes what its projections have not read, and putting it back folds
/// everything.
const REMOVED_TARGET: &str = r#"
[[projection]]
name = "reporting_total"
subscriber = "reporting.total.v1"
database = "reporting"
target = "public.order_total"
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#;

async fn sum(c: &tokio_postgres::Client) -> i64 {
    count(
        c,
        "select coalesce((sum(total) * 100)::int8, 0) from order_total",
    )
    .await
}
