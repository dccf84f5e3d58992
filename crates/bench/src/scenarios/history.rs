//! Scenario 9: a drain into an empty walfold schema, then the same drain after years of
//! seeded history: what the log's and the claims' size cost per event.

use std::time::{Duration, Instant};

use walfold_config::Config;
use walfold_tempdb::Cluster;

use super::{blocking, connect, settle, start, wait_subscribers, Line};
use crate::measure::Span;
use crate::setup::{self, BoxError};
use crate::Args;

/// What the server did so far: WAL, full-page images, checkpoints, and buffer reads and
/// hits of the two indexes every event probes (the event ID's, the claims' key).
#[derive(Debug, Default, Clone, Copy)]
struct ServerWork {
    wal_bytes: f64,
    wal_fpi: i64,
    checkpoints_timed: i64,
    checkpoints_req: i64,
    index_reads: i64,
    index_hits: i64,
    /// Dirty buffers written out: by checkpoints, the background writer, backends.
    buffers_written: i64,
    /// Of those, written by backends (a backend that needs a buffer evicts a dirty one;
    /// if its last change is not yet in flushed WAL, it flushes WAL first).
    buffers_backend: i64,
    /// WAL syncs (commits, and backends flushing WAL to write out a buffer).
    wal_sync: i64,
}

async fn server_work(client: &tokio_postgres::Client) -> Result<ServerWork, BoxError> {
    let row = client
        .query_one(
            "select (select wal_bytes::float8 from pg_stat_wal), (select wal_fpi from pg_stat_wal), \
             (select checkpoints_timed from pg_stat_bgwriter), \
             (select checkpoints_req from pg_stat_bgwriter), \
             coalesce(sum(idx_blks_read), 0)::int8, coalesce(sum(idx_blks_hit), 0)::int8, \
             (select buffers_checkpoint + buffers_clean + buffers_backend from pg_stat_bgwriter), \
             (select buffers_backend from pg_stat_bgwriter), (select wal_sync from pg_stat_wal) \
             from pg_statio_all_indexes where schemaname = 'walfold' \
             and indexrelname in ('event_log_event_id_key', 'processed_message_by_seq', \
             'processed_message_by_id')",
            &[],
        )
        .await?;
    Ok(ServerWork {
        wal_bytes: row.try_get(0)?,
        wal_fpi: row.try_get(1)?,
        checkpoints_timed: row.try_get(2)?,
        checkpoints_req: row.try_get(3)?,
        index_reads: row.try_get(4)?,
        index_hits: row.try_get(5)?,
        buffers_written: row.try_get(6)?,
        buffers_backend: row.try_get(7)?,
        wal_sync: row.try_get(8)?,
    })
}

/// The server settings that decide what history costs, as one line.
async fn wal_settings(client: &tokio_postgres::Client) -> Result<String, BoxError> {
    let mut out = Vec::new();
    for name in [
        "fsync",
        "shared_buffers",
        "max_wal_size",
        "checkpoint_timeout",
        "full_page_writes",
        "wal_compression",
    ] {
        let v: String = client
            .query_one(&format!("show {name}"), &[])
            .await?
            .try_get(0)?;
        out.push(format!("{name}={v}"));
    }
    Ok(out.join(" "))
}

/// One drain of the history scenario: runs the pipeline until both drain projections
/// have read the log up to `upto`; the rate of `n` events and the server's work per event.
async fn history_drain(
    (cluster, db): (&'static Cluster, &'static str),
    config: Config,
    client: &tokio_postgres::Client,
    n: u64,
    upto: u64,
) -> Result<(f64, f64, String), BoxError> {
    // With statements: also each relation's buffer reads and its WAL and full-page
    // images (the drain's WAL kept by a physical slot for pg_waldump).
    let start_lsn = if setup::statements_enabled() {
        Some(
            blocking(move || {
                cluster.psql(db, "create extension if not exists pg_stat_statements")?;
                cluster.psql(db, "select pg_stat_statements_reset(), pg_stat_reset()")?;
                Ok(cluster.psql(
                    db,
                    "select lsn from pg_create_physical_replication_slot('bench_hold', true) \
                     as s(name, lsn)",
                )?)
            })
            .await?
            .trim()
            .to_owned(),
        )
    } else {
        None
    };
    let behind: String = client
        .query_one(
            "select pg_size_pretty(pg_current_wal_lsn() - restart_lsn) from pg_replication_slots \
             where slot_name = 'walfold_history'",
            &[],
        )
        .await?
        .try_get(0)?;
    eprintln!("the slot's restart_lsn is {behind} behind the WAL's end before the drain to {upto}");
    let before = server_work(client).await?;
    let server_cpu = crate::measure::server_cpu(cluster.data_dir());
    let span = Span::start();
    let (cancel, task) = start(config);
    wait_subscribers(client, upto as i64, 2, Duration::from_secs(7200)).await?;
    let (wall, cpu, _) = span.stop();
    let server_cpu = crate::measure::server_cpu(cluster.data_dir()) - server_cpu;
    let after = server_work(client).await?;
    cancel.cancel();
    task.await??;
    if let Some(start) = start_lsn {
        let end: String = client
            .query_one("select pg_current_wal_lsn()::text", &[])
            .await?
            .try_get(0)?;
        eprintln!(
            "busiest statements during the drain to {upto}:\n{}",
            blocking(move || setup::top_statements(cluster, db)).await?
        );
        eprintln!(
            "buffer reads and hits during the drain to {upto}:\n{}",
            blocking(move || setup::relation_io(cluster, db)).await?
        );
        let wal = blocking(move || {
            let table = setup::wal_by_relation(cluster, db, &start, &end);
            cluster.psql(db, "select pg_drop_replication_slot('bench_hold')")?;
            table
        })
        .await?;
        eprintln!("WAL by relation during the drain to {upto}:\n{wal}");
    }
    let per = |x: f64| x / n as f64;
    let work = format!(
        "server CPU {:.1} µs/event, WAL {:.0} B/event, {:.3} FPI/event, checkpoints {} timed + {} requested, \
         index blocks read {:.2} / hit {:.1} per event, buffers written {:.3} ({:.3} by backends) per event, WAL syncs {:.4} per event",
        per(server_cpu * 1e6),
        per(after.wal_bytes - before.wal_bytes),
        per((after.wal_fpi - before.wal_fpi) as f64),
        after.checkpoints_timed - before.checkpoints_timed,
        after.checkpoints_req - before.checkpoints_req,
        per((after.index_reads - before.index_reads) as f64),
        per((after.index_hits - before.index_hits) as f64),
        per((after.buffers_written - before.buffers_written) as f64),
        per((after.buffers_backend - before.buffers_backend) as f64),
        per((after.wal_sync - before.wal_sync) as f64),
    );
    Ok((n as f64 / wall, cpu, work))
}

/// A drain of `n` events (event log + the two drain projections) into an empty walfold
/// schema; then `history` earlier events and their claims for both subscribers, seeded
/// set-based ([`setup::seed_history`]), and a checkpoint; then the same drain of `n`
/// more events: what a year-old deployment costs per event, at the cluster's settings.
pub(super) async fn history(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let n = args.history_drain;
    let h = args.history_events;
    let db = "history";
    let ids = setup::Ids::parse(&args.history_ids)?;
    blocking(move || {
        setup::create_db(cluster, db)?;
        setup::create_slot(cluster, db, "walfold_history")?;
        setup::write_backlog_from(cluster, db, 0, n, ids)?;
        settle(cluster, db)
    })
    .await?;
    let client = connect(cluster, db).await?;
    let settings = wal_settings(&client).await?;
    let label = format!(
        "{} cluster: {settings}, event IDs {}",
        args.history_cluster, args.history_ids
    );
    eprintln!("history scenario on the {label}");
    let config = || setup::config(cluster, db, "walfold_history", setup::DRAIN_PROJECTIONS);

    let (empty_rate, empty_cpu, empty_work) =
        history_drain((cluster, db), config()?, &client, n, n).await?;
    eprintln!("empty schema: {n} events at {empty_rate:.0} ev/s; {empty_work}");

    let started = Instant::now();
    blocking(move || {
        setup::seed_history(cluster, db, h, ids)?;
        setup::pass_history(cluster, db, "walfold_history")?;
        setup::write_backlog_from(cluster, db, n, n, ids)?;
        settle(cluster, db)
    })
    .await?;
    let size: String = client
        .query_one(
            "select pg_size_pretty(pg_total_relation_size('walfold.event_log') + \
             pg_total_relation_size('walfold.processed_message'))",
            &[],
        )
        .await?
        .try_get(0)?;
    eprintln!(
        "seeded {h} events and {} claims ({size} with the first drain's) in {:.0} s",
        2 * h,
        started.elapsed().as_secs_f64()
    );

    let (full_rate, full_cpu, full_work) =
        history_drain((cluster, db), config()?, &client, n, 2 * n + h).await?;
    eprintln!("after history: {n} events at {full_rate:.0} ev/s; {full_work}");
    lines.push(Line {
        scenario: format!("9. drain {n} events (log + 2 projections), empty schema; {label}"),
        walfold: format!("{empty_rate:.0} ev/s; {empty_work}"),
        limit: "—".into(),
        ratio: "1.00×".into(),
        cpu: format!("{empty_cpu:.1}"),
        rss: "—".into(),
    });
    lines.push(Line {
        scenario: format!("9. the same drain after {h} events and {} claims", 2 * h),
        walfold: format!("{full_rate:.0} ev/s; {full_work}"),
        limit: format!("{empty_rate:.0} ev/s (empty schema, same run; target ≥ 0.9×)"),
        ratio: format!("{:.2}×", full_rate / empty_rate),
        cpu: format!("{full_cpu:.1}"),
        rss: "—".into(),
    });
    Ok(())
}
