//! Clean stops, crashes at random and at the exact crash windows, server restarts and a
//! second daemon leading: nothing lost, nothing applied twice.

use std::time::{Duration, Instant};

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, eventually, lines_of, slot_active, spawn_walfold, walfold, write_config,
    write_events, Daemon, Rng, TestDb,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_acknowledges_and_exits_0() {
    let db = TestDb::new("sigterm");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let expected = write_events(db.url(), 30, 10, 7, Duration::from_millis(5), 7).await;
    caught_up(&client, expected.distinct(), 3).await;
    let (code, out, _) = walfold(
        &["status", "--json", "-c", d_config(&db).to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(status["event_log_head"].as_i64().unwrap() >= expected.distinct());
    assert_eq!(status["subscribers"].as_array().unwrap().len(), 3);

    assert_eq!(
        d.terminate(Duration::from_secs(30)),
        Some(0),
        "{}",
        d.log_text()
    );
    let log = d.log_text();
    assert!(log.contains("walfold stopped cleanly"), "{log}");
    // The slot was acknowledged up to what is durable in the event log, not beyond.
    let row = client
        .query_one(
            "select (s.confirmed_flush_lsn >= i.lsn), (s.confirmed_flush_lsn::text), i.lsn::text \
             from pg_replication_slots s, walfold.ingest_position i where s.slot_name = 'walfold'",
            &[],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "slot {} behind durable {}",
        row.get::<_, String>(1),
        row.get::<_, String>(2)
    );
    expected.check(&client).await;
}

fn d_config(db: &TestDb) -> std::path::PathBuf {
    write_config(&db.config(""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_and_applies_nothing_twice() {
    let db = TestDb::new("sigkill");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let mut rng = Rng::from_time();
    let writer = tokio::spawn(write_events(
        db.url(),
        200,
        15,
        25,
        Duration::from_millis(10),
        rng.next_u64(),
    ));
    let started = Instant::now();
    let mut kills = 0;
    while !writer.is_finished() || kills < 3 {
        tokio::time::sleep(Duration::from_millis(200 + rng.below(800))).await;
        d.kill_and_restart(None);
        kills += 1;
    }
    let expected = writer.await.unwrap();
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    eprintln!(
        "sigkill: {} rows written, {} distinct events, {} kills, {:?}",
        expected.rows_written,
        expected.distinct(),
        kills,
        started.elapsed()
    );
}

/// Runs the daemon with `failpoint=n` armed while events stream, waits for the abort,
/// restarts it unarmed and checks the read models against the fold.
async fn crash_at(
    failpoint: &str,
    n: u32,
    seed: u64,
) -> (tokio_postgres::Client, walfold_tests::Expected) {
    let db = TestDb::new(failpoint);
    let arm = format!("{failpoint}={n}");
    let mut d = Daemon::start(&db.config(""), &[("WALFOLD_FAILPOINTS", &arm)]);
    d.assert_failpoints_compiled();
    let client = db.client().await;
    slot_active(&client).await;
    let expected = write_events(db.url(), 20, 10, 5, Duration::from_millis(20), seed).await;
    d.wait_exit("the failpoint to abort the daemon").await;
    assert!(d.log_text().contains(&format!("failpoint {failpoint} hit")));
    d.kill_and_restart(Some(&[]));
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    (client, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_event_log_commit_before_the_ack_replays_as_duplicates() {
    let (client, expected) = crash_at("after_append_commit", 3, 11).await;
    let dupes: i64 = client
        .query_one("select duplicates from walfold.ingest_position", &[])
        .await
        .unwrap()
        .get(0);
    let repeats = expected.rows_written as i64 - expected.distinct();
    assert!(
        dupes > repeats,
        "the unacknowledged batch was replayed and recognised: {dupes} duplicates, {repeats} producer repeats"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_projection_commit_applies_nothing_twice() {
    // The third commit: each of the three projections commits at least once, however the
    // events fall into batches (under load one batch each is possible, and a fourth
    // commit never came).
    crash_at("after_projection_commit", 3, 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_stream_is_survived() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "restart");
    let d = Daemon::start(&db.config(""), &[]);
    {
        let client = db.client().await;
        slot_active(&client).await;
    }
    let writer = tokio::spawn(write_events(
        db.url(),
        150,
        10,
        10,
        Duration::from_millis(10),
        17,
    ));
    for mode in ["fast", "immediate", "fast"] {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let mode = mode.to_owned();
        tokio::task::spawn_blocking(move || cluster.restart(&mode).expect("restart"))
            .await
            .unwrap();
    }
    let expected = writer.await.unwrap();
    let client = db.client().await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;

    // `rebuild --wait` follows through the database going away and coming back (a
    // stranger's exited 1 at the restart), and on to the switch-over.
    drop(d);
    drop(client);
    let cfg = write_config(&db.config(""));
    let mut wait = spawn_walfold(
        &[
            "rebuild",
            "order_state",
            "--subscriber",
            "orders.state.v2",
            "--wait",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    let said = lines_of(wait.stderr.take().unwrap());
    let out = lines_of(wait.stdout.take().unwrap());
    let saying = |what: &'static str| {
        let said = said.clone();
        move || {
            let said = said.clone();
            async move { said.lock().unwrap().iter().any(|l| l.contains(what)) }
        }
    };
    eventually(
        Duration::from_secs(30),
        "a progress line",
        saying("rebuild of order_state → orders.state.v2: "),
    )
    .await;
    tokio::task::spawn_blocking(move || cluster.stop("fast").expect("stop"))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the follower to say it cannot read",
        saying("cannot read the rebuild's progress"),
    )
    .await;
    tokio::task::spawn_blocking(move || cluster.start_again().expect("start"))
        .await
        .unwrap();
    assert!(
        wait.try_wait().unwrap().is_none(),
        "--wait exited: {:?}",
        said.lock().unwrap()
    );
    let _d = Daemon::start(&db.config(""), &[]);
    let status = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::task::spawn_blocking(move || wait.wait().unwrap()),
    )
    .await
    .expect("--wait to end at the switch-over")
    .unwrap();
    assert_eq!(status.code(), Some(0), "{:?}", said.lock().unwrap());
    assert!(
        out.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("rebuild of order_state switched over: orders.state.v2")),
        "{:?}",
        out.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_shares_the_work_and_leads_when_the_leader_is_killed() {
    let db = TestDb::new("two");
    let (mut first, client) = Daemon::streaming(&db, &db.config("")).await;
    let second = Daemon::start(&db.config(""), &[]);
    eventually(
        Duration::from_secs(30),
        "the second daemon to take work",
        || {
            let working = second.log_text().contains("took a work unit");
            async move { working }
        },
    )
    .await;
    // Only the leader streams: one walsender.
    assert_eq!(
        db.psql("select count(*) from pg_stat_activity where application_name = 'walfold' and backend_type = 'walsender'"),
        "1"
    );
    let writer = tokio::spawn(write_events(
        db.url(),
        60,
        10,
        8,
        Duration::from_millis(10),
        23,
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.kill();
    let expected = writer.await.unwrap();
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
    let mut second = second;
    assert!(second.exited().is_none(), "{}", second.log_text());
    assert!(second
        .log_text()
        .contains("leading: this instance reads the slot"));
}
