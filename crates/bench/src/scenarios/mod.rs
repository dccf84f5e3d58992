//! The scenarios. Each measures walfold and, in the same run, the limit it is judged
//! against: pg_recvlogical draining an identical slot, pgbench driving the same claim +
//! guarded upsert SQL, pgbench writing the outbox as fast as it can. One file per
//! scenario family (the backlog's decode, drain and rebuild; live latency and keep-up;
//! one large transaction; several sources; history), the table they fill and the waits
//! they share here.

mod backlog;
mod handover;
mod history;
mod live;
mod sources;
mod transaction;
mod wait;

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use walfold_config::Config;
use walfold_engine::Pipeline;
use walfold_tempdb::Cluster;

use self::backlog::decode_and_drain;
use self::history::history;
use self::live::live;
use self::sources::several_sources;
use self::transaction::{big_transaction, one_transaction};
use crate::setup::{self, BoxError};
use crate::Args;

/// The database of the decode, drain and rebuild scenarios.
const BACKLOG: &str = "backlog";

struct Line {
    scenario: String,
    walfold: String,
    limit: String,
    ratio: String,
    cpu: String,
    rss: String,
}

pub async fn run_all(args: Args) -> Result<(), BoxError> {
    let mut lines = Vec::new();
    if args.only.as_deref() == Some("history") {
        let (kind, extra) = (args.history_cluster.clone(), args.settings.clone());
        let cluster = blocking(move || setup::start_history_cluster(&kind, &extra)).await?;
        let cluster: &'static Cluster = Box::leak(Box::new(cluster));
        eprintln!("cluster on port {}", cluster.port());
        history(cluster, &args, &mut lines).await?;
        print_table(&lines);
        return Ok(());
    }
    let fsync = args.fsync.clone();
    let cluster = tokio::task::spawn_blocking(move || setup::start_cluster(&fsync)).await??;
    let cluster: &'static Cluster = Box::leak(Box::new(cluster));
    eprintln!("cluster on port {}, fsync={}", cluster.port(), args.fsync);

    if args.only.is_none() {
        decode_and_drain(cluster, &args, &mut lines).await?;
        live(cluster, &args, &mut lines).await?;
        if args.big_txn > 0 {
            big_transaction(cluster, &args, &mut lines).await?;
        }
    }
    if args.only.as_deref() == Some("live") {
        live(cluster, &args, &mut lines).await?;
    } else if args.only.as_deref() == Some("wait") {
        wait::wait(cluster, &args, &mut lines).await?;
    } else if args.only.as_deref() == Some("handover") {
        handover::handover(cluster, args.handover_rounds, &mut lines).await?;
    } else if args.only.as_deref() == Some("sources") {
        several_sources(cluster, args.sources_events, &mut lines).await?;
    } else if args.stream_txn > 0 {
        for protocol in [1, 2] {
            one_transaction(cluster, args.stream_txn, protocol, &mut lines).await?;
        }
    }
    print_table(&lines);
    Ok(())
}

fn print_table(lines: &[Line]) {
    println!();
    println!("| scenario | walfold | limit (same run) | ratio | walfold CPU s | peak RSS MiB |");
    println!("|---|---|---|---|---|---|");
    for l in lines {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            l.scenario, l.walfold, l.limit, l.ratio, l.cpu, l.rss
        );
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BoxError> + Send + 'static,
) -> Result<T, BoxError> {
    tokio::task::spawn_blocking(f).await?
}

/// Resets the kernel's peak-RSS counter (VmHWM) for this process.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Vacuums and checkpoints `db`, so the next measurement does not share the machine
/// with the cleanup of the last one.
fn settle(cluster: &Cluster, db: &str) -> Result<(), BoxError> {
    cluster.psql(db, "vacuum (analyze)")?;
    cluster.psql(db, "checkpoint")?;
    Ok(())
}

fn start(
    config: Config,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), walfold_engine::EngineError>>,
) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Pipeline::new(config).run(cancel.clone()));
    (cancel, task)
}

/// Waits until `subscribers` subscribers have read the log up to at least `events`.
async fn wait_subscribers(
    client: &tokio_postgres::Client,
    events: i64,
    subscribers: i64,
    timeout: Duration,
) -> Result<(), BoxError> {
    let start = Instant::now();
    loop {
        let row = client
            .query_opt(
                "select count(distinct subscriber_id), coalesce(min(position), 0) from walfold.checkpoint",
                &[],
            )
            .await
            .ok()
            .flatten();
        if let Some(r) = row {
            if r.try_get::<_, i64>(0)? >= subscribers && r.try_get::<_, i64>(1)? >= events {
                return Ok(());
            }
        }
        if start.elapsed() > timeout {
            return Err("timed out waiting for the projections".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client on one of the benchmark's databases.
async fn connect(cluster: &Cluster, db: &str) -> Result<tokio_postgres::Client, BoxError> {
    Ok(walfold_pg::connect(&format!("{}?sslmode=disable", cluster.url(db))).await?)
}

/// Waits until the pipeline's slot streams, before load is offered.
async fn slot_active(client: &tokio_postgres::Client) -> Result<(), BoxError> {
    wait_for(
        client,
        "select count(*) from pg_replication_slots where active",
        Duration::from_secs(30),
        "the slot to become active",
    )
    .await
}

/// Polls the count `sql` every 20 ms until it is not 0.
async fn wait_for(
    client: &tokio_postgres::Client,
    sql: &str,
    timeout: Duration,
    what: &str,
) -> Result<(), BoxError> {
    let t0 = Instant::now();
    while count(client, sql).await == 0 {
        if t0.elapsed() > timeout {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client
        .query_one(sql, &[])
        .await
        .and_then(|r| r.try_get::<_, i64>(0))
        .unwrap_or(0)
}
