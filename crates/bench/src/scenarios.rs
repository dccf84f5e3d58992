//! The scenarios. Each measures walfold and, in the same run, the limit it is judged
//! against: pg_recvlogical draining an identical slot, pgbench driving the same claim +
//! guarded upsert SQL, pgbench writing the outbox as fast as it can.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use walfold_config::Config;
use walfold_engine::Pipeline;
use walfold_tempdb::Cluster;

use crate::measure::{median, rss_mib, Span};
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
    if args.only.as_deref() == Some("sources") {
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

async fn decode_and_drain(
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

async fn live(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = "live";
    blocking(move || {
        settle(cluster, BACKLOG)?;
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
    let script = "\\set aid random(1, 10000)\n\
        insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
        values (gen_random_uuid(), 'order', 'o-' || :aid, 'OrderPaid', 1, \
        '{\"status\": \"paid\", \"amount\": \"12.25\", \"currency\": \"EUR\", \"customer\": \"6512bd43d9caa6e02c990b0a82652dca\", \"sku\": \"c20ad4d76fe97759aa27a0c99bff6710\", \"note\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}');\n";
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
    lines.push(Line {
        scenario: format!("3. live latency, {rate} ev/s offered for {secs} s ({written} events)"),
        walfold: format!("p50 {p50:.1} ms, p95 {p95:.1} ms, p99 {p99:.1} ms, max {max:.1} ms"),
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

async fn big_transaction(
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
async fn one_transaction(
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

/// The same backlog drained (event log and the two drain projections) once from one
/// source and once split over two sources (two databases, two slots, two readers and
/// appenders taking turns in one log): what the second source costs or gains.
async fn several_sources(
    cluster: &'static Cluster,
    n: u64,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let half = n / 2;
    let n = half * 2;
    blocking(move || {
        for (db, rows) in [("src_one", n), ("src_a", half), ("src_b", half)] {
            setup::create_db(cluster, db)?;
            setup::create_slot(cluster, db, &format!("walfold_{db}"))?;
            setup::write_backlog(cluster, db, rows)?;
        }
        for db in ["tgt_one", "tgt_two"] {
            setup::create_db(cluster, db)?;
        }
        Ok(())
    })
    .await?;
    let url = |db: &str| format!("{}?sslmode=disable", cluster.url(db));
    let source = |name: &str, db: &str| {
        format!(
            "[[source]]\nname = \"{name}\"\nurl = \"{}\"\nslot = \"walfold_{db}\"\n\n\
             [[outbox]]\nsource = \"{name}\"\ntable = \"public.outbox\"\n\n",
            url(db)
        )
    };
    let mut rates = Vec::new();
    for (label, sources, target) in [
        ("one source", source("one", "src_one"), "tgt_one"),
        (
            "two sources",
            format!("{}{}", source("a", "src_a"), source("b", "src_b")),
            "tgt_two",
        ),
    ] {
        let text = format!(
            "{sources}[target]\nurl = \"{}\"\n\n[log]\nlevel = \"warn\"\n{}",
            url(target),
            setup::DRAIN_PROJECTIONS
        );
        let config = Config::from_toml(&text, Vec::<(String, String)>::new())?;
        let client = connect(cluster, target).await?;
        reset_peak_rss();
        let span = Span::start();
        let (cancel, task) = start(config);
        wait_subscribers(&client, n as i64, 2, Duration::from_secs(1800)).await?;
        let (wall, cpu, _) = span.stop();
        let (_, peak) = rss_mib();
        cancel.cancel();
        task.await??;
        eprintln!("{label}: {n} events drained in {wall:.1} s");
        rates.push(n as f64 / wall);
        lines.push(Line {
            scenario: format!("8. drain {n} events (log + 2 projections), {label}"),
            walfold: format!("{:.0} ev/s", n as f64 / wall),
            limit: if rates.len() == 1 {
                "the one-source drain of the same run".into()
            } else {
                format!("{:.0} ev/s (one source, same run)", rates[0])
            },
            ratio: if rates.len() == 1 {
                "1.00×".into()
            } else {
                format!("{:.2}×", rates[1] / rates[0])
            },
            cpu: format!("{cpu:.1}"),
            rss: format!("{peak:.0}"),
        });
    }
    Ok(())
}

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
async fn history(
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
