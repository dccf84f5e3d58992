//! Scenarios 1, 2 and 6 on one backlog: decode beside pg_recvlogical, the drain (event
//! log + two projections) beside pgbench applying the same SQL, a rebuild's replay.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use walfold_tempdb::Cluster;

use super::{
    blocking, connect, reset_peak_rss, settle, start, wait_for, wait_subscribers, Line, BACKLOG,
};
use crate::measure::{median, rss_mib, Span};
use crate::setup::{self, BoxError};
use crate::Args;

pub(super) async fn decode_and_drain(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = BACKLOG;
    let n = args.events;
    let runs = args.runs.max(1);
    blocking(move || {
        setup::create_db(cluster, db)?;
        for k in 0..runs {
            setup::create_slot(cluster, db, &format!("walfold_{k}"))?;
            setup::create_slot(cluster, db, &format!("baseline_{k}"))?;
        }
        Ok(())
    })
    .await?;
    let write = Instant::now();
    blocking(move || setup::write_backlog(cluster, db, n)).await?;
    let write_s = write.elapsed().as_secs_f64();
    let end = blocking(move || setup::end_marker(cluster, db)).await?;
    eprintln!(
        "wrote {n} outbox rows in 100-row transactions in {write_s:.1} s ({:.0} rows/s); end marker at {end}",
        n as f64 / write_s
    );

    let (mut ours, mut theirs, mut our_cpu, mut their_cpu) = (vec![], vec![], vec![], vec![]);
    reset_peak_rss();
    for k in 0..runs {
        let span = Span::start();
        let slot = format!("baseline_{k}");
        blocking(move || setup::recvlogical(cluster, db, &slot, end)).await?;
        let (wall, _, child) = span.stop();
        theirs.push(wall);
        their_cpu.push(child);

        let config = setup::config(cluster, db, &format!("walfold_{k}"), "")?;
        let span = Span::start();
        let stats = walfold_source::decode_only(&config.source_views()[0], end).await?;
        let (wall, own, _) = span.stop();
        if stats.events != n {
            return Err(format!("decode saw {} events, expected {n}", stats.events).into());
        }
        ours.push(wall);
        our_cpu.push(own);
        eprintln!(
            "decode run {k}: pg_recvlogical {:.2} s, walfold {wall:.2} s ({} events)",
            theirs[k], stats.events
        );
    }
    let (ours_s, theirs_s) = (median(ours), median(theirs));
    lines.push(Line {
        scenario: format!("1. decode {n} events (median of {runs})"),
        walfold: format!("{:.0} ev/s", n as f64 / ours_s),
        limit: format!(
            "{:.0} ev/s (pg_recvlogical, CPU {:.1} s)",
            n as f64 / theirs_s,
            median(their_cpu)
        ),
        ratio: format!("{:.2}×", theirs_s / ours_s),
        cpu: format!("{:.1}", median(our_cpu)),
        rss: format!("{:.0}", rss_mib().1),
    });

    // 2. Drain the same backlog through the whole pipeline.
    reset_peak_rss();
    let config = setup::config(cluster, db, "walfold_0", setup::DRAIN_PROJECTIONS)?;
    let client = connect(cluster, db).await?;
    let span = Span::start();
    let (cancel, task) = start(config);
    wait_subscribers(&client, n as i64, 2, Duration::from_secs(3600)).await?;
    let (drain_s, drain_cpu, _) = span.stop();
    cancel.cancel();
    task.await??;
    let drain_rss = rss_mib().1;
    eprintln!("drain: {n} events through the event log and 2 projections in {drain_s:.1} s");
    if setup::statements_enabled() {
        eprintln!(
            "busiest statements during decode and drain:\n{}",
            blocking(move || setup::top_statements(cluster, db)).await?
        );
    }

    // The server's raw apply limit: the same claim + guarded upsert, 1000 events per
    // transaction, driven by pgbench over the events now in the log. Each measurement
    // starts from a settled database (no autovacuum of the last one's rows beside it).
    blocking(move || {
        settle(cluster, db)?;
        cluster.psql(
            db,
            "create table raw_state (like order_state including all); create sequence raw_batch;",
        )?;
        Ok(())
    })
    .await?;
    let batches = n / 1000;
    let script = "select nextval('raw_batch') - 1 as b \\gset\n\
        begin;\n\
        insert into walfold.processed_message (subscriber_id, seq, message_id, processed_at) \
          select 'raw', seq, event_id, now() from walfold.event_log \
          where seq > :b * 1000 and seq <= (:b + 1) * 1000 on conflict do nothing;\n\
        insert into raw_state as c (order_id, status, amount, version) \
          select aggregate_id, payload->>'status', (payload->>'amount')::numeric, version \
          from walfold.event_log where seq > :b * 1000 and seq <= (:b + 1) * 1000 \
          on conflict (order_id) do update set status = excluded.status, amount = excluded.amount, \
          version = excluded.version where c.version < excluded.version;\n\
        commit;\n";
    let raw_rate = set_based_rate(cluster, db, script.to_owned(), batches).await?;

    // The same yardstick for all of the drain's writes: the event-log insert and both
    // projections' claims and upserts, set-based, 1000 events per transaction. (The
    // bench's 1000-event windows hold distinct aggregates, so one upsert per window is
    // the same as one per event.)
    blocking(move || {
        settle(cluster, db)?;
        cluster.psql(
            db,
            "create table raw_log (like walfold.event_log including all); \
             create table raw_state2 (like order_state including all); \
             create table raw_sum (like order_sum including all); create sequence raw_all_batch;",
        )?;
        Ok(())
    })
    .await?;
    let range = "from walfold.event_log where seq > :b * 1000 and seq <= (:b + 1) * 1000";
    let script = format!(
        "select nextval('raw_all_batch') - 1 as b \\gset\n\
         begin;\n\
         insert into raw_log select * {range};\n\
         insert into walfold.processed_message (subscriber_id, seq, message_id, processed_at) \
           select 'raw.state', seq, event_id, now() {range} on conflict do nothing;\n\
         insert into raw_state2 as c (order_id, status, amount, version) \
           select aggregate_id, payload->>'status', (payload->>'amount')::numeric, version {range} \
           on conflict (order_id) do update set status = excluded.status, amount = excluded.amount, \
           version = excluded.version where c.version < excluded.version;\n\
         insert into walfold.processed_message (subscriber_id, seq, message_id, processed_at) \
           select 'raw.sum', seq, event_id, now() {range} on conflict do nothing;\n\
         insert into raw_sum as c (order_id, total) \
           select aggregate_id, (payload->>'amount')::numeric {range} \
           on conflict (order_id) do update set total = c.total + excluded.total;\n\
         commit;\n"
    );
    let raw_all_rate = set_based_rate(cluster, db, script, batches).await?;
    let drain_rate = n as f64 / drain_s;
    lines.push(Line {
        scenario: format!("2. drain {n} events: event log + 2 projections"),
        walfold: format!("{drain_rate:.0} ev/s"),
        limit: format!(
            "{raw_rate:.0} ev/s (pgbench: claim + guarded upsert, 1000/txn, 1 projection)"
        ),
        ratio: format!("{:.2}×", drain_rate / raw_rate),
        cpu: format!("{drain_cpu:.1}"),
        rss: format!("{drain_rss:.0}"),
    });
    lines.push(Line {
        scenario: "2b. the same drain beside all of its writes done set-based".into(),
        walfold: format!("{drain_rate:.0} ev/s"),
        limit: format!(
            "{raw_all_rate:.0} ev/s (pgbench: event-log insert + 2 × (claim + upsert), 1000/txn)"
        ),
        ratio: format!("{:.2}×", drain_rate / raw_all_rate),
        cpu: "—".into(),
        rss: "—".into(),
    });

    // 6. Rebuild: replay the whole log into a shadow of the state projection under a new
    // subscriber, until the switch-over.
    reset_peak_rss();
    blocking(move || settle(cluster, db)).await?;
    let config = setup::config(cluster, db, "walfold_0", setup::DRAIN_PROJECTIONS)?;
    walfold_engine::ops::start_rebuild(
        &config,
        "state",
        "bench.state.rebuilt",
        walfold_engine::ops::History::Whole,
    )
    .await?;
    if setup::statements_enabled() {
        blocking(move || Ok(cluster.psql(db, "select pg_stat_statements_reset()")?)).await?;
    }
    let span = Span::start();
    let timeline = setup::timeline_enabled().then(|| {
        let stop = CancellationToken::new();
        let probe = tokio::spawn(rebuild_timeline(cluster, db, stop.clone()));
        (stop, probe)
    });
    let (cancel, task) = start(config);
    wait_for(
        &client,
        "select count(*) from walfold.rebuild where state = 'switched'",
        Duration::from_secs(3600),
        "the rebuild to switch over",
    )
    .await?;
    let (rebuild_s, rebuild_cpu, _) = span.stop();
    if let Some((stop, probe)) = timeline {
        stop.cancel();
        eprintln!(
            "rebuild timeline (s from the pipeline's start):\n{}",
            probe.await??
        );
    }
    cancel.cancel();
    task.await??;
    let rebuild_rate = n as f64 / rebuild_s;
    eprintln!("rebuild: {n} events replayed into a shadow table in {rebuild_s:.1} s");
    if setup::statements_enabled() {
        eprintln!(
            "busiest statements during the rebuild:\n{}",
            blocking(move || setup::top_statements(cluster, db)).await?
        );
    }
    lines.push(Line {
        scenario: format!("6. rebuild replay of {n} events (state projection, 5000/txn)"),
        walfold: format!("{rebuild_rate:.0} ev/s"),
        limit: format!("{raw_rate:.0} ev/s (scenario 2's raw apply limit)"),
        ratio: format!("{:.2}×", rebuild_rate / raw_rate),
        cpu: format!("{rebuild_cpu:.1}"),
        rss: format!("{:.0}", rss_mib().1),
    });
    Ok(())
}

/// `WALFOLD_BENCH_TIMELINE=1`: when the rebuild's checkpoint first appears, first moves,
/// reaches the head, and when the rebuild switches over, polled every 5 ms on a
/// connection of its own until `stop`.
async fn rebuild_timeline(
    cluster: &'static Cluster,
    db: &'static str,
    stop: CancellationToken,
) -> Result<String, BoxError> {
    let client = connect(cluster, db).await?;
    let t0 = Instant::now();
    let head: i64 = client
        .query_one("select coalesce(max(seq), 0) from walfold.event_log", &[])
        .await?
        .try_get(0)?;
    let mut seen: Vec<(f64, String)> = Vec::new();
    let mut last = (None::<i64>, String::new());
    let mut commits = 0u32;
    while !stop.is_cancelled() {
        let row = client
            .query_one(
                "select (select max(position) from walfold.checkpoint \
                   where subscriber_id = 'bench.state.rebuilt'), \
                 (select state::text from walfold.rebuild \
                   where subscriber_id = 'bench.state.rebuilt')",
                &[],
            )
            .await?;
        let t = t0.elapsed().as_secs_f64();
        let (position, state): (Option<i64>, Option<String>) = (row.try_get(0)?, row.try_get(1)?);
        let state = state.unwrap_or_default();
        if position != last.0 {
            commits += 1;
            let what = match (last.0, position) {
                (None, Some(p)) => format!("first checkpoint at {p}"),
                (_, Some(p)) if p >= head => format!("reached the head {p} ({commits} moves seen)"),
                (_, Some(p)) => format!("position {p}"),
                (_, None) => String::new(),
            };
            if !what.is_empty() {
                seen.push((t, what));
            }
        }
        if state != last.1 {
            seen.push((t, format!("state {state}")));
        }
        last = (position, state);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(seen
        .iter()
        .map(|(t, what)| format!("  {t:7.3} {what}"))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// Events per second of a set-based pgbench `script` run `batches` times on one
/// connection, 1000 events per run.
async fn set_based_rate(
    cluster: &'static Cluster,
    db: &'static str,
    script: String,
    batches: u64,
) -> Result<f64, BoxError> {
    let span = Span::start();
    blocking(move || {
        setup::pgbench(
            cluster,
            db,
            &script,
            &["-c", "1", "-t", &batches.to_string()],
        )?;
        Ok(())
    })
    .await?;
    let (secs, _, _) = span.stop();
    Ok((batches * 1000) as f64 / secs)
}
