//! Scenarios 5 and 7: one large transaction, its memory (5) and its time from commit to
//! log with pgoutput protocol 1 and 2 (7).

use std::time::{Duration, Instant};

use walfold_tempdb::Cluster;

use super::{blocking, connect, count, reset_peak_rss, settle, slot_active, start, Line};
use crate::measure::{rss_mib, Span};
use crate::setup::{self, BoxError};
use crate::Args;

pub(super) async fn big_transaction(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = "big";
    let n = args.big_txn;
    blocking(move || setup::create_db(cluster, db)).await?;
    let config = setup::config(cluster, db, "walfold_big", setup::LATENCY_PROJECTION)?;
    let client = connect(cluster, db).await?;
    let (cancel, task) = start(config);
    slot_active(&client).await?;
    let (before, _) = rss_mib();
    reset_peak_rss();
    let span = Span::start();
    blocking(move || {
        cluster.psql(
            db,
            &format!(
                "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                 select gen_random_uuid(), 'order', 'o-' || (i % 10000), 'OrderPaid', i / 10000 + 1, {} \
                 from generate_series(0, {}) as i",
                setup::PAYLOAD_SQL,
                n - 1
            ),
        )?;
        Ok(())
    })
    .await?;
    while count(&client, "select count(*) from applied").await < n as i64 {
        if span.stop().0 > 1800.0 {
            return Err("big transaction did not drain".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (wall, cpu, _) = span.stop();
    let (_, peak) = rss_mib();
    lines.push(Line {
        scenario: format!("5. one transaction of {n} outbox rows"),
        walfold: format!(
            "{:.0} ev/s incl. the write; RSS {before:.0} → peak {peak:.0} MiB",
            n as f64 / wall
        ),
        limit: "target: peak ≤ 128 MiB".into(),
        ratio: "—".into(),
        cpu: format!("{cpu:.1}"),
        rss: format!("{peak:.0}"),
    });
    cancel.cancel();
    task.await??;
    Ok(())
}

/// One transaction of `n` outbox rows with pgoutput `protocol` 1 or 2, the source at its
/// default `logical_decoding_work_mem`: time from its commit until its last event is in
/// the log, what the source spilled to disk meanwhile, and walfold's peak RSS.
pub(super) async fn one_transaction(
    cluster: &'static Cluster,
    n: u64,
    protocol: u8,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = if protocol == 1 { "proto1" } else { "proto2" };
    blocking(move || setup::create_db(cluster, db)).await?;
    let slot = format!("walfold_{db}");
    let mut config = setup::config(cluster, db, &slot, "")?;
    config.source[0].protocol = Some(protocol);
    let client = connect(cluster, db).await?;
    let (cancel, task) = start(config);
    slot_active(&client).await?;
    blocking(move || settle(cluster, db)).await?;
    reset_peak_rss();
    let span = Span::start();
    let started = Instant::now();
    blocking(move || {
        cluster.psql(
            db,
            &format!(
                "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                 select gen_random_uuid(), 'order', 'o-' || (i % 10000), 'OrderPaid', i / 10000 + 1, {} \
                 from generate_series(0, {}) as i",
                setup::PAYLOAD_SQL,
                n - 1
            ),
        )?;
        Ok(())
    })
    .await?;
    let committed = Instant::now();
    let appended = "select coalesce(sum(appended), 0)::int8 from walfold.ingest_position";
    while count(&client, appended).await < n as i64 {
        if committed.elapsed() > Duration::from_secs(1800) {
            return Err("the transaction did not reach the log".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after_commit = committed.elapsed().as_secs_f64();
    let (_, cpu, _) = span.stop();
    let (_, peak) = rss_mib();
    let stats = client
        .query_one(
            "select coalesce(spill_bytes, 0), coalesce(stream_bytes, 0) \
             from pg_stat_replication_slots where slot_name = $1",
            &[&slot],
        )
        .await?;
    let (spill, streamed): (i64, i64) = (stats.try_get(0)?, stats.try_get(1)?);
    lines.push(Line {
        scenario: format!("7. one transaction of {n} rows, protocol {protocol}"),
        walfold: format!(
            "last event in the log {after_commit:.1} s after the commit (write took {:.1} s); \
             source spill_bytes {} MB, stream_bytes {} MB",
            (committed - started).as_secs_f64(),
            spill / 1_000_000,
            streamed / 1_000_000
        ),
        limit: if protocol == 1 {
            "protocol 1: decoded only after the commit".into()
        } else {
            "protocol 2: staged while it runs".into()
        },
        ratio: "—".into(),
        cpu: format!("{cpu:.1}"),
        rss: format!("{peak:.0}"),
    });
    cancel.cancel();
    task.await??;
    Ok(())
}
