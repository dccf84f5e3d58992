//! The fault-injection soak: 200k outbox events from concurrent writers (with repeated
//! IDs, out-of-order versions and malformed rows) while the daemon is SIGKILLed, the
//! server restarted (fast and immediate) and the walsender terminated, at random. The
//! read models must equal an independent fold of the distinct events, and the dead
//! letters exactly the malformed rows. Prints its figures (nextest shows them: see
//! `.config/nextest.toml`).

use std::time::{Duration, Instant};

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{caught_up, slot_active, write_events, Daemon, Expected, Rng, TestDb};

const WRITERS: usize = 4;
const TXNS: usize = 500;
const PER_TXN: usize = 100;

/// The daemon's peak RSS so far (VmHWM), in KiB.
fn peak_rss_kib(d: &Daemon) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", d.child.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_200k_events_through_kills_restarts_and_cut_connections() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "soak");
    let mut d = Daemon::start(&db.config(""), &[]);
    slot_active(&db.client().await).await;
    let started = Instant::now();
    let mut rng = Rng::from_time();

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(write_events(
                db.url(),
                TXNS,
                PER_TXN,
                2_000,
                Duration::from_millis(15),
                rng.next_u64() ^ w as u64,
            ))
        })
        .collect();
    let bad = {
        let url = db.url();
        tokio::spawn(async move {
            for i in 0..40 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if let Ok(c) = walfold_pg::connect(&url).await {
                    let _ = c
                        .execute(
                            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                             values (null, 'order', 'bad', 'Broken', 1, jsonb_build_object('n', $1::int))",
                            &[&i],
                        )
                        .await;
                }
            }
        })
    };

    let (mut kills, mut fast, mut immediate, mut cuts, mut peak) = (0, 0, 0, 0, 0u64);
    while writers.iter().any(|w| !w.is_finished()) {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(700))).await;
        match rng.below(4) {
            0 => {
                peak = peak.max(peak_rss_kib(&d));
                d.kill_and_restart(None);
                kills += 1;
            }
            1 | 2 => {
                let mode = if rng.below(2) == 0 {
                    "fast"
                } else {
                    "immediate"
                };
                let m = mode.to_owned();
                tokio::task::spawn_blocking(move || cluster.restart(&m).expect("restart"))
                    .await
                    .unwrap();
                if mode == "fast" {
                    fast += 1;
                } else {
                    immediate += 1;
                }
            }
            _ => {
                if let Ok(c) = walfold_pg::connect(&db.url()).await {
                    let n = c
                        .execute(
                            "select pg_terminate_backend(pid) from pg_stat_replication",
                            &[],
                        )
                        .await
                        .unwrap_or(0);
                    cuts += n;
                }
            }
        }
    }
    let mut expected = Expected::default();
    for w in writers {
        let e = w.await.unwrap();
        expected.rows_written += e.rows_written;
        expected.events.extend(e.events);
    }
    bad.await.unwrap();
    let written_s = started.elapsed().as_secs_f64();

    let client = db.client().await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    let malformed = db.psql("select count(*) from outbox where id is null");
    assert_eq!(
        db.psql(
            "select count(*) from walfold.dead_letter where subscriber_id is null and reason = 'malformed'"
        ),
        malformed,
        "exactly the injected bad rows are dead letters"
    );
    assert_eq!(
        db.psql("select count(*) from walfold.dead_letter where subscriber_id is not null"),
        "0"
    );
    assert!(d.exited().is_none(), "{}", d.log_text());
    peak = peak.max(peak_rss_kib(&d));
    println!(
        "soak: {} outbox rows ({} distinct events, {} malformed) from {WRITERS} writers in {written_s:.1} s; \
         {kills} daemon SIGKILLs, {fast} fast and {immediate} immediate server restarts, {cuts} walsenders terminated; \
         caught up and checked after {:.1} s; peak daemon RSS {} MiB",
        expected.rows_written,
        expected.distinct(),
        malformed,
        started.elapsed().as_secs_f64(),
        peak / 1024
    );
}

/// One transaction writing 1 GB to a table outside the publication, with a few outbox
/// rows in it: the server decodes and spills it (pgoutput sends only the outbox rows),
/// and walfold's memory stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gb_non_outbox_transaction_passes_without_growing_memory() {
    let db = TestDb::new("bigtxn");
    db.psql("create table bulk (id bigint, filler text)");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    let before_kib = peak_rss_kib(&d);
    let started = Instant::now();
    db.psql(
        "begin; \
         insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
           values (gen_random_uuid(), 'order', 'big-1', 'OrderChanged', 1, '{\"amount\": \"1\"}'); \
         insert into bulk select g, repeat(md5(g::text), 32) from generate_series(1, 1000000) g; \
         insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
           values (gen_random_uuid(), 'order', 'big-2', 'OrderChanged', 1, '{\"amount\": \"2\"}'); \
         commit;",
    );
    let bytes: i64 = db
        .psql("select pg_total_relation_size('bulk')")
        .parse()
        .unwrap();
    assert!(bytes > 1_000_000_000, "the transaction wrote {bytes} bytes");
    caught_up(&client, 2, 3).await;
    let lsn = db.psql("select pg_current_wal_lsn()");
    walfold_tests::eventually(Duration::from_secs(60), "the slot to pass the transaction", || async {
        client
            .query_one(
                "select confirmed_flush_lsn >= $1::text::pg_lsn from pg_replication_slots where slot_name = 'walfold'",
                &[&lsn],
            )
            .await
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false)
    })
    .await;
    assert_eq!(db.psql("select count(*) from ledger"), "2");
    let peak_kib = peak_rss_kib(&d);
    println!(
        "1 GB transaction ({} MB in bulk, 2 outbox rows): through in {:.1} s; daemon peak RSS {} MiB before, {} MiB after",
        bytes / 1_000_000,
        started.elapsed().as_secs_f64(),
        before_kib / 1024,
        peak_kib / 1024
    );
    assert!(peak_kib < 128 * 1024, "peak RSS {peak_kib} KiB");
    db.psql("drop table bulk");
}

/// One source transaction of 1M outbox rows with `logical_decoding_work_mem` at its
/// default: streamed while it runs (protocol 2), staged in bounded batches and moved into
/// the log at its commit. The source spills nothing and the daemon's memory stays
/// bounded (no projections here: the bound is about ingest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1m_row_outbox_transaction_streams_through_in_bounded_memory() {
    let db = TestDb::new("millionrows");
    let config = walfold_tests::config_for(&db.url(), "")
        .split("[[projection]]")
        .next()
        .unwrap()
        .to_owned();
    let (d, client) = Daemon::streaming(&db, &config).await;
    let started = Instant::now();
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'o-' || (g % 10000), 'OrderChanged', g, \
                jsonb_build_object('status', 'paid', 'amount', (g % 1000)::text, \
                                   'note', repeat('n', 120)) \
         from generate_series(1, 1000000) g",
    );
    let committed = Instant::now();
    walfold_tests::eventually(Duration::from_secs(300), "1M events in the log", || async {
        client
            .query_one("select count(*) from walfold.event_log where seq > 0", &[])
            .await
            .is_ok_and(|r| r.get::<_, i64>(0) == 1_000_000)
    })
    .await;
    let after_commit = committed.elapsed();
    let peak_kib = peak_rss_kib(&d);
    let stats = client
        .query_one(
            "select spill_bytes, stream_txns, stream_bytes from pg_stat_replication_slots \
             where slot_name = 'walfold'",
            &[],
        )
        .await
        .unwrap();
    let (spill, streams, stream_bytes): (i64, i64, i64) =
        (stats.get(0), stats.get(1), stats.get(2));
    println!(
        "1M-row transaction: insert+commit {:.1} s, in the event log {:.1} s after its commit; \
         source spill_bytes {spill}, stream_txns {streams}, stream_bytes {stream_bytes}; daemon peak RSS {} MiB",
        (committed - started).as_secs_f64(),
        after_commit.as_secs_f64(),
        peak_kib / 1024
    );
    assert_eq!(spill, 0, "the source spilled the transaction");
    assert!(streams >= 1, "the transaction was not streamed");
    assert!(peak_kib < 128 * 1024, "peak RSS {peak_kib} KiB");
}
