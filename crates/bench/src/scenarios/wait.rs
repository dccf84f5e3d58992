//! Read your own writes (`--only wait`): an application commits an outbox row, reads
//! `pg_current_wal_lsn()` and calls `walfold.wait_for`, while pgbench offers `--rate`
//! single-row transactions beside it. One waiter for `--wait-rounds` rounds (its latency
//! beside the fold's own, commit to applied, of the same events), then `--waiters`
//! concurrent waiters for `--wait-secs`, and the same crowd sleeping as long instead of
//! waiting: the server CPU between the two is what the looks cost.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use walfold_tempdb::Cluster;

use super::live::SINGLE_ROW;
use super::{blocking, connect, settle, slot_active, start, Line, BACKLOG};
use crate::measure::{median, server_cpu, Span};
use crate::setup::{self, BoxError};
use crate::Args;

const INSERT: &str =
    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
     values ($1, 'waiter', $2, 'OrderPaid', 1, '{\"status\": \"paid\"}')";

const WAIT: &str = "select status, waited_ms from walfold.wait_for('applied', $1::text::pg_lsn, interval '5 seconds')";

/// What one waiter saw.
#[derive(Default)]
struct Waits {
    /// Client-side milliseconds from the commit's return to the wait's answer.
    ms: Vec<f64>,
    /// Answered `folded` but the read model did not have the event.
    misses: u64,
    /// Any other answer (`timeout`, ...).
    not_folded: u64,
}

/// One round: commit, read the position, wait, read the read model (`check`). With
/// `instead`, the round sleeps that long where it would wait: the same commits at about
/// the same pace, without a look.
async fn round(
    client: &Client,
    aggregate: &str,
    check: bool,
    instead: Option<Duration>,
    out: &mut Waits,
) -> Result<(), BoxError> {
    let id = uuid::Uuid::new_v4();
    client.execute(INSERT, &[&id, &aggregate]).await?;
    let committed = Instant::now();
    let lsn: String = client
        .query_one("select pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    if let Some(pause) = instead {
        tokio::time::sleep(pause).await;
        out.ms.push(committed.elapsed().as_secs_f64() * 1000.0);
        return Ok(());
    }
    let row = client.query_one(WAIT, &[&lsn]).await?;
    out.ms.push(committed.elapsed().as_secs_f64() * 1000.0);
    let status: String = row.get(0);
    if status != "folded" {
        out.not_folded += 1;
    } else if check {
        let found: bool = client
            .query_one(
                "select exists (select from applied where event_id = $1)",
                &[&id],
            )
            .await?
            .get(0);
        if !found {
            out.misses += 1;
        }
    }
    Ok(())
}

/// `waiters` clients doing rounds for `secs`: what they saw, the wall seconds and the
/// server's CPU seconds meanwhile.
async fn crowd(
    cluster: &'static Cluster,
    db: &'static str,
    waiters: u64,
    secs: u64,
    instead: Option<Duration>,
) -> Result<(Waits, f64, f64), BoxError> {
    let data_dir = cluster.data_dir().to_owned();
    let mut clients = Vec::new();
    for _ in 0..waiters {
        let c = connect(cluster, db).await?;
        c.execute("set track_functions = 'pl'", &[]).await?;
        clients.push(c);
    }
    let cpu0 = server_cpu(&data_dir);
    let span = Span::start();
    let until = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(w, c)| {
            tokio::spawn(async move {
                let mut out = Waits::default();
                let mut i = 0u64;
                while Instant::now() < until {
                    round(&c, &format!("m-{w}-{i}"), false, instead, &mut out).await?;
                    i += 1;
                }
                Ok::<_, BoxError>(out)
            })
        })
        .collect();
    let mut all = Waits::default();
    for t in tasks {
        let w = t.await??;
        all.ms.extend(w.ms);
        all.not_folded += w.not_folded;
    }
    let (wall, _, _) = span.stop();
    Ok((all, wall, server_cpu(&data_dir) - cpu0))
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

pub(super) async fn wait(
    cluster: &'static Cluster,
    args: &Args,
    lines: &mut Vec<Line>,
) -> Result<(), BoxError> {
    let db = "wait";
    blocking(move || {
        // The backlog's database is absent when this scenario runs alone.
        settle(cluster, BACKLOG).ok();
        setup::create_db(cluster, db)
    })
    .await?;
    let config = setup::config(cluster, db, "walfold_wait", setup::LATENCY_PROJECTION)?;
    let client = connect(cluster, db).await?;
    let (cancel, task) = start(config);
    slot_active(&client).await?;
    let rate = args.rate;
    let mut background = setup::pgbench_child(
        cluster,
        db,
        SINGLE_ROW,
        &["-c", "2", "-j", "2", "-R", &rate.to_string(), "-T", "3600"],
    )?;
    // Wait until the fold keeps up with the offered load.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // One waiter, as a web handler after its command.
    let rounds = args.wait_rounds;
    let mut one = Waits::default();
    let span = Span::start();
    for i in 0..rounds {
        round(&client, &format!("w-{i}"), true, None, &mut one).await?;
    }
    let (one_s, _, _) = span.stop();
    let fold = client
        .query_one(
            "select percentile_cont(0.5) within group (order by d), \
                    percentile_cont(0.99) within group (order by d) \
             from (select (extract(epoch from pg_xact_commit_timestamp(a.xmin) \
                                            - pg_xact_commit_timestamp(o.xmin)))::float8 * 1000 as d \
                   from outbox o join applied a on a.event_id = o.id \
                   where o.aggregate_type = 'waiter') x",
            &[],
        )
        .await?;
    let (fold_p50, fold_p99): (f64, f64) = (fold.try_get(0)?, fold.try_get(1)?);
    let p50 = median(one.ms.clone());
    lines.push(Line {
        scenario: format!(
            "wait: 1 waiter, {rounds} rounds (commit, pg_current_wal_lsn, wait_for, read) beside {rate} ev/s offered ({:.0} rounds/s)",
            rounds as f64 / one_s
        ),
        walfold: format!(
            "commit → folded answer p50 {p50:.1} ms, p99 {:.1} ms, max {:.1} ms; misses {}, not folded {}",
            quantile(&one.ms, 0.99),
            quantile(&one.ms, 1.0),
            one.misses,
            one.not_folded
        ),
        limit: format!("the fold itself, same events (commit → applied commit): p50 {fold_p50:.1} ms, p99 {fold_p99:.1} ms"),
        ratio: format!("{:.2}× (p50)", p50 / fold_p50),
        cpu: "—".into(),
        rss: "—".into(),
    });

    // Many waiters at once: what their looks cost. The same crowd then commits at about
    // the same pace, sleeping where it waited: the server CPU between the two is the cost.
    let (waiters, secs) = (args.waiters, args.wait_secs);
    client.execute("select pg_stat_reset()", &[]).await?;
    if setup::statements_enabled() {
        blocking(move || Ok(cluster.psql(db, "create extension if not exists pg_stat_statements; select pg_stat_statements_reset()")?)).await?;
    }
    let span = Span::start();
    let (many, many_s, server_s) = crowd(cluster, db, waiters, secs, None).await?;
    let (_, walfold_cpu, _) = span.stop();
    let pause = Duration::from_secs_f64(median(many.ms.clone()) / 1000.0);
    let (sleepers, sleepers_s, sleepers_server_s) =
        crowd(cluster, db, waiters, secs, Some(pause)).await?;
    let _ = background.kill();
    let _ = background.wait();
    // The waiters' sessions have ended: their function statistics are flushed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let looks = client
        .query_opt(
            "select calls from pg_stat_user_functions where funcname = 'wait_check'",
            &[],
        )
        .await?;
    let calls: i64 = match &looks {
        Some(r) => r.try_get(0)?,
        None => 0,
    };
    if setup::statements_enabled() {
        let top = blocking(move || setup::top_statements(cluster, db)).await?;
        eprintln!("busiest statements while {waiters} waiters waited:\n{top}");
    }
    let n = many.ms.len() as f64;
    let per_round = |cpu_s: f64, rounds: usize| cpu_s * 1000.0 / rounds.max(1) as f64;
    let (waiting_ms, sleeping_ms) = (
        per_round(server_s, many.ms.len()),
        per_round(sleepers_server_s, sleepers.ms.len()),
    );
    lines.push(Line {
        scenario: format!("wait: {waiters} concurrent waiters for {secs} s beside {rate} ev/s offered"),
        walfold: format!(
            "{:.0} waits/s, p50 {:.1} ms, p99 {:.1} ms, not folded {}; {:.1} looks a wait; server CPU {waiting_ms:.2} ms a round ({:.2} CPU s/s)",
            n / many_s,
            median(many.ms.clone()),
            quantile(&many.ms, 0.99),
            many.not_folded,
            calls as f64 / n.max(1.0),
            server_s / many_s,
        ),
        limit: format!(
            "the same crowd sleeping {:.0} ms instead of waiting: {:.0} rounds/s, server CPU {sleeping_ms:.2} ms a round ({:.2} CPU s/s)",
            pause.as_secs_f64() * 1000.0,
            sleepers.ms.len() as f64 / sleepers_s,
            sleepers_server_s / sleepers_s
        ),
        ratio: format!("a wait costs {:.2} ms of server CPU", waiting_ms - sleeping_ms),
        cpu: format!("{walfold_cpu:.1}"),
        rss: "—".into(),
    });
    cancel.cancel();
    task.await??;
    Ok(())
}
