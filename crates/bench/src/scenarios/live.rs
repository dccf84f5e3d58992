//! Scenarios 3 and 4: live latency at an offered rate, and keeping up with pgbench
//! writing the outbox unthrottled.

use std::time::{Duration, Instant};

use walfold_tempdb::Cluster;

use super::{blocking, connect, count, reset_peak_rss, settle, slot_active, start, Line, BACKLOG};
use crate::measure::{rss_mib, Span};
use crate::setup::{self, BoxError};
use crate::Args;

/// pgbench's script of one single-row outbox transaction on one of 10,000 orders.
pub(super) const SINGLE_ROW: &str = "\\set aid random(1, 10000)\n\
    insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
    values (gen_random_uuid(), 'order', 'o-' || :aid, 'OrderPaid', 1, \
    '{\"status\": \"paid\", \"amount\": \"12.25\", \"currency\": \"EUR\", \"customer\": \"6512bd43d9caa6e02c990b0a82652dca\", \"sku\": \"c20ad4d76fe97759aa27a0c99bff6710\", \"note\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}');\n";

pub(super) async fn live(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = "live";
    blocking(move || {
        // The backlog's database is absent when this scenario runs alone.
        settle(cluster, BACKLOG).ok();
        setup::create_db(cluster, db)
    })
    .await?;
    let config = setup::config(cluster, db, "walfold_live", setup::LATENCY_PROJECTION)?;
    let client = connect(cluster, db).await?;
    reset_peak_rss();
    let (cancel, task) = start(config);
    slot_active(&client).await?;

    // 3. Live latency at a steady offered rate of single-row transactions.
    let (rate, secs) = (args.rate, args.latency_secs);
    let script = SINGLE_ROW;
    let sampler = tokio::spawn(async move {
        let mut max_rss: f64 = 0.0;
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            max_rss = max_rss.max(rss_mib().0);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        max_rss
    });
    let span = Span::start();
    blocking(move || {
        setup::pgbench(
            cluster,
            db,
            script,
            &[
                "-c",
                "2",
                "-j",
                "2",
                "-R",
                &rate.to_string(),
                "-T",
                &secs.to_string(),
            ],
        )?;
        Ok(())
    })
    .await?;
    let written = count(&client, "select count(*) from outbox").await;
    let t0 = Instant::now();
    while count(&client, "select count(*) from applied").await < written {
        if t0.elapsed() > Duration::from_secs(300) {
            return Err("latency run did not catch up".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, live_cpu, _) = span.stop();
    let steady_rss = sampler.await?;
    let row = client
        .query_one(
            "select percentile_cont(0.5) within group (order by d), \
                    percentile_cont(0.95) within group (order by d), \
                    percentile_cont(0.99) within group (order by d), max(d) \
             from (select (extract(epoch from pg_xact_commit_timestamp(a.xmin) \
                                            - pg_xact_commit_timestamp(o.xmin)))::float8 * 1000 as d \
                   from outbox o join applied a on a.event_id = o.id) x",
            &[],
        )
        .await?;
    let (p50, p95, p99, max): (f64, f64, f64, f64) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    // The same latency in its two halves: the source's commit to the event log's, and
    // the event log's to the projection's.
    let halves = client
        .query_one(
            "select percentile_cont(0.5) within group (order by ingest), \
                    percentile_cont(0.99) within group (order by ingest), \
                    percentile_cont(0.5) within group (order by fold), \
                    percentile_cont(0.99) within group (order by fold) \
             from (select (extract(epoch from pg_xact_commit_timestamp(l.xmin) \
                                            - pg_xact_commit_timestamp(o.xmin)))::float8 * 1000 as ingest, \
                          (extract(epoch from pg_xact_commit_timestamp(a.xmin) \
                                            - pg_xact_commit_timestamp(l.xmin)))::float8 * 1000 as fold \
                   from outbox o join walfold.event_log l on l.event_id = o.id \
                   join applied a on a.event_id = o.id) x",
            &[],
        )
        .await?;
    let (ingest_p50, ingest_p99, fold_p50, fold_p99): (f64, f64, f64, f64) = (
        halves.try_get(0)?,
        halves.try_get(1)?,
        halves.try_get(2)?,
        halves.try_get(3)?,
    );
    lines.push(Line {
        scenario: format!("3. live latency, {rate} ev/s offered for {secs} s ({written} events)"),
        walfold: format!("p50 {p50:.1} ms, p95 {p95:.1} ms, p99 {p99:.1} ms, max {max:.1} ms (source commit → event log commit p50 {ingest_p50:.1} / p99 {ingest_p99:.1} ms, → projection commit p50 {fold_p50:.1} / p99 {fold_p99:.1} ms)"),
        limit: "target: p50 ≤ 5 ms, p99 ≤ 20 ms".into(),
        ratio: "—".into(),
        cpu: format!("{live_cpu:.1}"),
        rss: format!("{steady_rss:.0} (steady)"),
    });

    // 4. Keep-up: pgbench writes 100-row transactions as fast as it can.
    let before = count(&client, "select count(*) from outbox").await;
    let keep = args.keepup_secs;
    let script = format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || (random() * 10000)::int, 'OrderPaid', 1, {} \
         from generate_series(1, 100) as i;\n",
        setup::PAYLOAD_SQL
    );
    reset_peak_rss();
    let span = Span::start();
    blocking(move || {
        setup::pgbench(
            cluster,
            db,
            &script,
            &["-c", "2", "-j", "2", "-T", &keep.to_string()],
        )?;
        Ok(())
    })
    .await?;
    let (write_s, _, _) = span.stop();
    let total = count(&client, "select count(*) from outbox").await;
    let offered = (total - before) as f64 / write_s;
    let lag_at_end = total - count(&client, "select count(*) from applied").await;
    let t0 = Instant::now();
    while count(&client, "select count(*) from applied").await < total {
        if t0.elapsed() > Duration::from_secs(900) {
            return Err("keep-up run did not catch up".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let catch_up = t0.elapsed().as_secs_f64();
    let (all_s, keep_cpu, _) = span.stop();
    let ours = (total - before) as f64 / all_s;
    lines.push(Line {
        scenario: format!("4. keep-up, 100-row txns, pgbench unthrottled for {keep} s"),
        walfold: format!("{ours:.0} ev/s end to end; lag at end {lag_at_end} events, caught up {catch_up:.1} s later"),
        limit: format!("{offered:.0} ev/s (pgbench writing the outbox)"),
        ratio: format!("{:.2}×", ours / offered),
        cpu: format!("{keep_cpu:.1}"),
        rss: format!("{:.0}", rss_mib().1),
    });
    cancel.cancel();
    task.await??;
    Ok(())
}
