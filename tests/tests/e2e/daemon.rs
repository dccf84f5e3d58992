//! The real `walfold` binary: configuration errors, clean stops, crashes at random and
//! at the exact crash windows, server restarts, and setup errors.

use std::time::{Duration, Instant};

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, config_for, eventually, free_port, http_get, lines_of, slot_active, spawn_walfold,
    walfold, write_config, write_events, Daemon, Rng, TestDb,
};

#[test]
fn bad_configuration_exits_2_and_names_the_key() {
    let good = config_for("postgresql://postgres@127.0.0.1:1/x", "");
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            good.replace("[source]", "[source]\ncolour = \"red\""),
            vec![],
            "colour",
        ),
        (
            good.replace("url = \"postgresql://postgres@127.0.0.1:1/x\"", ""),
            vec![],
            "url",
        ),
        (
            good.replace(":payload.note", ":paylod.note"),
            vec![],
            "projection[0].columns.note",
        ),
        (
            good.replace("parallelism = 2", "parallelism = 0"),
            vec![],
            "projection[1].parallelism",
        ),
        (
            good.clone(),
            vec![("WALFOLD_PROJECTION__9__NAME", "x")],
            "WALFOLD_PROJECTION__9__NAME",
        ),
        (
            good.clone(),
            vec![("WALFOLD_SOURCE__SLOT", "Not-A-Slot")],
            "source.slot",
        ),
        ("this is not toml".into(), vec![], "invalid config"),
    ];
    for (text, envs, key) in cases {
        let path = write_config(&text);
        let (code, _, stderr) = walfold(&["run", "-c", path.to_str().unwrap()], &envs);
        assert_eq!(code, 2, "expected exit 2 for {key}: {stderr}");
        assert!(
            stderr.contains(key),
            "stderr does not name {key}:\n{stderr}"
        );
    }
    let (code, _, stderr) = walfold(&["run", "-c", "/nonexistent/walfold.toml"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read config file"), "{stderr}");
    let (code, _, _) = walfold(&["frobnicate"], &[]);
    assert_eq!(code, 2, "usage errors exit 2");
}

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
async fn wal_level_replica_is_refused_with_the_fix() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            extra_settings: vec![("wal_level".into(), "replica".into())],
            ..Options::default()
        })
        .expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "replica");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to exit").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    assert!(
        d.log_text().contains("set wal_level=logical"),
        "{}",
        d.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_outbox_table_is_refused_with_the_fix() {
    let db = TestDb::new("nooutbox");
    db.psql("drop table outbox");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to exit").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    let log = d.log_text();
    assert!(
        log.contains("outbox table public.outbox does not exist"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_and_verified_tls_with_a_least_privilege_role() {
    let db = TestDb::new("scram");
    let cluster = db.cluster;
    let ca = cluster
        .ca_cert()
        .expect("tls cluster")
        .display()
        .to_string();
    db.psql(&format!(
        "grant create on database {} to walfold_scram; \
         alter table outbox owner to walfold_scram; alter table order_state owner to walfold_scram; \
         alter table order_total owner to walfold_scram; alter table ledger owner to walfold_scram;",
        db.name
    ));
    let url = format!(
        "postgresql://walfold_scram:walfold-secret@localhost:{}/{}?sslmode=verify-full&sslrootcert={ca}",
        cluster.port(),
        db.name
    );
    let (_d, client) = Daemon::streaming(&db, &config_for(&url, "")).await;
    // Every walfold connection is TLS and SCRAM-authenticated as the limited role.
    let sql = "select count(*), coalesce(bool_and(s.ssl), false) from pg_stat_activity a \
               join pg_stat_ssl s using (pid) where a.usename = 'walfold_scram'";
    eventually(Duration::from_secs(30), "walfold's connections", || async {
        client
            .query_one(sql, &[])
            .await
            .is_ok_and(|r| r.get::<_, i64>(0) >= 4)
    })
    .await;
    let row = client.query_one(sql, &[]).await.unwrap();
    assert!(row.get::<_, bool>(1), "a connection without TLS");
    let expected = write_events(db.url(), 5, 10, 3, Duration::from_millis(5), 19).await;
    caught_up(&client, expected.distinct(), 3).await;
    expected.check(&client).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_stops_the_daemon_unless_recreate_records_the_gap() {
    let db = TestDb::new("lostslot");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let expected = write_events(db.url(), 3, 5, 2, Duration::from_millis(5), 29).await;
    caught_up(&client, expected.distinct(), 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql("select pg_drop_replication_slot('walfold')");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to refuse").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    let log = d.log_text();
    assert!(
        log.contains("is missing, but walfold had ingested through it"),
        "{log}"
    );
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots where slot_name = 'walfold'"),
        "0"
    );
    let cfg = write_config(&db.config(""));
    let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "doctor fails on a lost slot:\n{out}");
    assert!(out.contains("FAIL  slot walfold is missing"), "{out}");
    let (code, out, err) = walfold(&["status", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "status fails on a lost slot:\n{out}{err}");
    assert!(
        out.contains("slot walfold: MISSING, but walfold had ingested through it")
            && out.contains("on_slot_lost = \"recreate\"")
            && err.contains("the slot of source default is missing"),
        "{out}{err}"
    );

    // Opted in: recreated, with the skipped range recorded and exported, and new events flow.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let envs = [
        ("WALFOLD_SOURCE__ON_SLOT_LOST", "recreate"),
        ("WALFOLD_METRICS__LISTEN", listen.as_str()),
    ];
    // Killed right after creating the new slot: the gap was recorded before it.
    let mut armed = envs.to_vec();
    armed.push(("WALFOLD_FAILPOINTS", "after_slot_recreated=1"));
    let mut d = Daemon::start(&db.config(""), &armed);
    d.assert_failpoints_compiled();
    d.wait_exit("the failpoint").await;
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots where slot_name = 'walfold'"),
        "1"
    );
    assert_eq!(
        db.psql("select reason || ':' || (to_lsn is null) from walfold.slot_gap"),
        "missing:true"
    );
    d.kill_and_restart(Some(&envs));
    slot_active(&client).await;
    assert_eq!(
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'missing' and to_lsn >= from_lsn"
        ),
        "1",
        "the restart closed the gap at the new slot's start"
    );
    let before = expected.distinct();
    let more = write_events(db.url(), 2, 5, 2, Duration::from_millis(5), 31).await;
    caught_up(&client, before + more.distinct(), 3).await;
    let (status, body) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    for line in [
        "walfold_slot_gaps{source=\"default\"} 1",
        "walfold_database_up 1",
        "walfold_leader 1",
        "walfold_slot_active{source=\"default\"} 1",
        "walfold_applied_total{subscriber=\"orders.ledger.v1\"}",
        "walfold_subscriber_lag_events{subscriber=\"orders.ledger.v1\"} 0",
        "walfold_apply_seconds_bucket{",
    ] {
        assert!(body.contains(line), "no `{line}` in:\n{body}");
    }
    assert!(
        body.contains("walfold_events_appended_total{source=\"default\"} ")
            && !body.contains("walfold_events_appended_total{source=\"default\"} 0"),
        "appends are counted:\n{body}"
    );
    assert_eq!(http_get(port, "/healthz").0, 200);
    eventually(Duration::from_secs(30), "/readyz", || async {
        http_get(port, "/readyz").0 == 200
    })
    .await;
    let (code, out, _) = walfold(&["status", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("slot gaps: 1"), "{out}");
    let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warn  max_slot_wal_keep_size = -1"), "{out}");
    assert!(out.contains("ok    slot walfold active = true"), "{out}");
}

/// A stranger renamed `source.publication` on a running deployment: walfold tried to
/// create the new one, its error led them to create it, and the stream then stopped
/// with the advice to drop the slot, which loses events. A slot walfold has read from
/// cannot use a publication created after its changes: walfold refuses at start and
/// names the publication that still publishes the outbox, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_publication_is_refused_with_the_old_name_not_created() {
    let db = TestDb::new("pubrename");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let first = write_events(db.url(), 3, 5, 2, Duration::from_millis(5), 43).await;
    caught_up(&client, first.distinct(), 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let more = write_events(db.url(), 2, 5, 2, Duration::from_millis(5), 47).await;

    let renamed = [("WALFOLD_SOURCE__PUBLICATION", "walfold_renamed")];
    let mut d = Daemon::start(&db.config(""), &renamed);
    d.wait_exit("the daemon to refuse").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    let log = d.log_text();
    assert!(
        log.contains("publication walfold_renamed does not exist")
            && log.contains("set source.publication back to walfold_outbox"),
        "{log}"
    );
    assert_eq!(
        db.psql("select count(*) from pg_publication where pubname = 'walfold_renamed'"),
        "0",
        "not created"
    );
    // doctor says the same, instead of "walfold creates it on start".
    let cfg = write_config(&db.config(""));
    let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &renamed);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  publication walfold_renamed does not exist, and walfold has read slot walfold through walfold_outbox")
            && out.contains("set source.publication back to walfold_outbox"),
        "{out}"
    );
    // Created by hand, as the stranger did: newer than the changes the slot holds, so
    // still refused, with the same fix (not the advice to drop the slot).
    db.psql(
        "create publication walfold_renamed for table outbox with (publish = 'insert, truncate')",
    );
    let mut d = Daemon::start(&db.config(""), &renamed);
    d.wait_exit("the daemon to refuse again").await;
    let log = d.log_text();
    assert!(
        log.contains("is not the one it was read through (walfold_outbox)")
            && log.contains("set source.publication back to walfold_outbox"),
        "{log}"
    );

    // The old name carries on from the slot: nothing written meanwhile is lost.
    let _d = Daemon::start(&db.config(""), &[]);
    caught_up(&client, first.distinct() + more.distinct(), 3).await;

    // Dropped for good, no other publication has the outbox: the slot must go.
    drop(_d);
    db.psql("drop publication walfold_outbox");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to refuse").await;
    let log = d.log_text();
    assert!(
        log.contains("publication walfold_outbox does not exist")
            && log.contains("pg_drop_replication_slot('walfold')")
            && !log.contains("walfold_renamed"),
        "the slot was read through walfold_outbox: no other publication is offered\n{log}"
    );
}

/// Waits until the slot's confirmed position reaches `lsn` (passes it when `past`).
async fn slot_reaches(client: &tokio_postgres::Client, lsn: &str, past: bool, timeout: Duration) {
    let sql = format!(
        "select confirmed_flush_lsn {} $1::text::pg_lsn from pg_replication_slots \
         where slot_name = 'walfold'",
        if past { ">" } else { ">=" }
    );
    eventually(timeout, &format!("the slot to reach {lsn}"), || async {
        client
            .query_one(&sql, &[&lsn])
            .await
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false)
    })
    .await;
}

/// Starts the daemon with heartbeats every `secs` seconds (0: off) and waits for it to stream.
async fn start_with_heartbeat(db: &TestDb, secs: u64) -> (Daemon, tokio_postgres::Client) {
    let config = db.config("").replace(
        "[[outbox]]",
        &format!("heartbeat_interval_s = {secs}\n\n[[outbox]]"),
    );
    let (d, client) = Daemon::streaming(db, &config).await;
    (d, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_moves_when_only_other_tables_are_written() {
    let db = TestDb::new("filtered");
    // Heartbeats off: the reader acknowledges the server's keepalives between
    // transactions, once everything before them is durable.
    let (_d, client) = start_with_heartbeat(&db, 0).await;
    db.psql("create table busy (n int, pad text)");
    for _ in 0..5 {
        db.psql("insert into busy select i, repeat('x', 200) from generate_series(1, 20000) i");
    }
    let written: String = db.psql("select pg_current_wal_lsn()::text");
    slot_reaches(&client, &written, false, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_move_the_slot_on_an_idle_database() {
    let db = TestDb::new("heartbeat");
    let (_d, client) = start_with_heartbeat(&db, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_from: String = db.psql("select pg_current_wal_lsn()::text");
    // Nothing is written; without heartbeats the server would stay silent for
    // wal_sender_timeout / 2 (30 s).
    slot_reaches(&client, &idle_from, true, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_does_not_write() {
    let db = TestDb::new("idle");
    let (_d, _client) = start_with_heartbeat(&db, 0).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = || {
        db.psql("select n_tup_upd + n_tup_ins from pg_stat_user_tables where relname = 'ingest_position'")
    };
    let before: i64 = writes().parse().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after: i64 = writes().parse().unwrap();
    // Acknowledging a keepalive must not write: the write would make WAL and the next
    // keepalive, a loop of hundreds of writes a second.
    assert!(
        after - before <= 1,
        "{} ingest_position writes in 3 idle seconds",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_malformed_row_is_dead_lettered_once() {
    let db = TestDb::new("dl_once");
    let mut d = Daemon::start(
        &db.config(""),
        &[("WALFOLD_FAILPOINTS", "after_append_commit=1")],
    );
    d.assert_failpoints_compiled();
    let client = db.client().await;
    slot_active(&client).await;
    // The malformed row first, so it is in the batch that commits just before the crash.
    let good: String = (1..=5)
        .map(|i| {
            walfold_tests::insert_event(
                &format!("00000000-0000-4000-8000-{i:012}"),
                "o-1",
                "OrderPaid",
                i,
                r#"{"status": "paid", "amount": "1"}"#,
            )
        })
        .collect();
    db.psql(&format!(
        "begin; insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (null, 'order', 'o-9', 'OrderPaid', 1, '{{}}'); {good} commit;"
    ));
    d.wait_exit("the failpoint to abort the daemon").await;
    d.kill_and_restart(Some(&[]));
    caught_up(&client, 5, 3).await;
    // The five events were projected before the crash: wait for the replay itself (its
    // append counts the row again), then look at the dead letters it left.
    eventually(
        Duration::from_secs(30),
        "the replay to see the row again",
        || async {
            db.psql("select malformed from walfold.ingest_position")
                .parse::<i64>()
                .unwrap()
                >= 2
        },
    )
    .await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_listed_and_discarded() {
    let db = TestDb::new("dlcli");
    let config = db.config("");
    let (_d, _client) = Daemon::streaming(&db, &config).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (null, 'order', 'o-1', 'OrderPaid', 1, '{\"a\": 1}')",
    );
    eventually(Duration::from_secs(30), "the dead letter", || async {
        db.psql("select count(*) from walfold.dead_letter") == "1"
    })
    .await;
    let path = write_config(&config);
    let cfg = path.to_str().unwrap();
    let (code, out, err) = walfold(&["dead-letters", "list", "--json", "-c", cfg], &[]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = &list[0];
    assert_eq!(entry["reason"], "malformed");
    assert_eq!(entry["raw"]["aggregate_id"], "o-1");
    let id = entry["id"].as_i64().unwrap().to_string();
    let (code, out, _) = walfold(
        &["dead-letters", "list", "--subscriber", "ingest", "-c", cfg],
        &[],
    );
    assert_eq!(code, 0);
    assert!(out.contains("column `id` is null"), "{out}");

    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "discard",
            &id,
            "--reason",
            "test row",
            "-c",
            cfg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = walfold(&["dead-letters", "list", "--json", "-c", cfg], &[]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!([])
    );
    let (_, out, _) = walfold(&["dead-letters", "list", "--all", "--json", "-c", cfg], &[]);
    let all: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(all[0]["status"], "discarded");
    assert_eq!(all[0]["resolution"], "test row");
    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "discard",
            &id,
            "--reason",
            "again",
            "-c",
            cfg,
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no open dead letter"), "{err}");
}

/// A slot invalidated because it held more WAL than `max_slot_wal_keep_size` while the
/// daemon was down: refused by default, recreated with the gap on record when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_refused_or_recreated_with_the_gap_recorded() {
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options {
            extra_settings: vec![
                ("max_slot_wal_keep_size".into(), "32MB".into()),
                ("max_wal_size".into(), "64MB".into()),
                ("min_wal_size".into(), "32MB".into()),
            ],
            ..Options::default()
        })
        .expect("private cluster"),
    ));
    let db = TestDb::on(cluster, "invalidated");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let expected = write_events(db.url(), 3, 5, 2, Duration::from_millis(5), 37).await;
    caught_up(&client, expected.distinct(), 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql("create table filler (x text)");
    for _ in 0..6 {
        db.psql("insert into filler select repeat('x', 1000) from generate_series(1, 20000); checkpoint;");
    }
    assert_eq!(
        db.psql("select wal_status from pg_replication_slots where slot_name = 'walfold'"),
        "lost"
    );
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to refuse").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    assert!(
        d.log_text().contains("was invalidated (wal_status=lost)"),
        "{}",
        d.log_text()
    );

    let _d = Daemon::start(
        &db.config(""),
        &[("WALFOLD_SOURCE__ON_SLOT_LOST", "recreate")],
    );
    // The slot shows active while it is being created, before the gap is closed.
    eventually(Duration::from_secs(30), "the gap to be closed", || async {
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'invalidated' and to_lsn > from_lsn",
        ) == "1"
    })
    .await;
    slot_active(&client).await;
    let more = write_events(db.url(), 2, 5, 2, Duration::from_millis(5), 41).await;
    caught_up(&client, expected.distinct() + more.distinct(), 3).await;
}

/// A daemon whose database does not answer is not ready and says so: not "another
/// instance leads", which sends an operator looking for an instance that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_an_unreachable_database_not_another_leader() {
    let port = walfold_tests::free_port();
    let dead = walfold_tests::free_port();
    let text = walfold_tests::config_for(
        &format!("postgresql://postgres@127.0.0.1:{dead}/nowhere"),
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let _d = Daemon::start(&text, &[]);
    let mut last = (0, String::new());
    eventually(Duration::from_secs(30), "/readyz to answer", || {
        last = http_get(port, "/readyz");
        let answered = last.0 != 0;
        async move { answered }
    })
    .await;
    let (code, why) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{why}");
    assert!(
        why.contains("not leading") && why.contains(&dead.to_string()),
        "{why}"
    );
    assert!(!why.contains("another instance"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_producer_is_said_once_not_once_per_batch() {
    let db = TestDb::new("retrying");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    let retry = paid(1, "o-1", "10");
    // Each retry its own transaction, most of them their own batch: a line per batch
    // flooded a stranger's log.
    for _ in 0..20 {
        db.psql(&retry);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    eventually(Duration::from_secs(30), "19 duplicates counted", || async {
        walfold_tests::status(&client)
            .await
            .and_then(|s| s.ingest)
            .is_some_and(|i| i.duplicates == 19)
    })
    .await;
    caught_up(&client, 1, 3).await;
    let log = d.log_text();
    let said = log
        .lines()
        .filter(|l| l.contains("repeated event IDs"))
        .count();
    assert_eq!(said, 1, "{log}");
    assert_eq!(
        db.psql("select total from order_total where order_id = 'o-1'"),
        "10"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_malformed_rows_makes_a_dead_letter_each_not_a_log_line_each() {
    let db = TestDb::new("malformed_batch");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    // A producer's bad batch: 300 rows without an aggregate ID, then a good one.
    db.psql(
        "begin; insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', null, 'OrderPaid', 1, '{\"amount\": \"1\"}' \
         from generate_series(1, 300); commit;",
    );
    db.psql(&paid(2, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    assert_eq!(
        db.psql("select count(*) from walfold.dead_letter where reason = 'malformed'"),
        "300"
    );
    let log = d.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("malformed outbox row"))
        .count();
    assert!((20..=22).contains(&lines), "{lines} lines:\n{log}");
    assert!(log.contains("at most 20 lines a minute from here"), "{log}");
}

/// Found by a stranger: an outbox taken out of the publication while walfold ran made
/// its events stop coming, with nothing said (pgoutput just filters them). The running
/// ingest checks the publication, stops naming the change and how to get the rows back,
/// and a backfill does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_taken_out_of_the_publication_while_running_stops_ingest_with_the_way_back() {
    let db = TestDb::new("pubdrop");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let event = |n: u32, order: &str| paid(n, order, "10");
    db.psql(&event(1, "o-1"));
    caught_up(&client, 1, 3).await;
    db.psql("alter publication walfold_outbox drop table outbox");
    db.psql(&event(2, "o-2"));
    assert_eq!(d.wait_exit("the daemon to stop").await, Some(1));
    let log = d.log_text();
    assert!(
        log.contains(
            "while walfold ran, outbox table public.outbox is no longer in publication \
             walfold_outbox"
        ) && log.contains("walfold backfill --outbox public.outbox"),
        "{log}"
    );
    // The way back the message gives.
    db.psql("alter publication walfold_outbox add table outbox");
    let cfg = write_config(&db.config(""));
    let (code, out, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.outbox",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (_d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&event(3, "o-3"));
    caught_up(&client, 3, 3).await;
    assert_eq!(
        db.psql("select string_agg(order_id, ',' order by order_id) from order_total"),
        "o-1,o-2,o-3"
    );
}

/// Found by a stranger: a role with REPLICATION advanced walfold's slot while it was
/// stopped, and the event committed in between was never folded, with nothing said.
/// walfold acknowledges only positions it recorded, so a slot past the recorded position
/// was moved by someone else: the range is recorded as a gap and backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_advanced_behind_walfolds_back_is_a_gap_that_is_backfilled() {
    let db = TestDb::new("advanced");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let event = |n: u32, order: &str| paid(n, order, "10");
    db.psql(&event(1, "o-1"));
    caught_up(&client, 1, 3).await;
    // Idle, then killed: what it acknowledged meanwhile it had recorded (no false gap).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    d.kill_and_restart(None);
    slot_active(&client).await;
    db.psql(&event(2, "o-2"));
    caught_up(&client, 2, 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(db.psql("select count(*) from walfold.slot_gap"), "0");
    // Stopped; an event; the slot moved past it by hand.
    db.psql(&event(3, "o-3"));
    db.psql("select pg_replication_slot_advance('walfold', pg_current_wal_lsn())");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    caught_up(&client, 3, 3).await;
    assert_eq!(
        db.psql("select string_agg(order_id, ',' order by order_id) from order_total"),
        "o-1,o-2,o-3"
    );
    assert_eq!(
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'advanced' \
             and filled_at is not null"
        ),
        "1"
    );
    assert!(
        d.log_text()
            .contains("the slot was moved past walfold's ingest position"),
        "{}",
        d.log_text()
    );
}

/// Found by a stranger: a projection removed from the config kept its registry row, and
/// `walfold status` showed its subscriber as live with a lag that only grew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_removed_from_the_config_shows_as_unused_without_lag() {
    let db = TestDb::new("removed_projection");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(3, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    drop(d);
    // The ledger is the last [[projection]] of the standard config.
    let full = db.config("");
    let without_ledger = &full[..full.rfind("[[projection]]").unwrap()];
    assert!(!without_ledger.contains("orders.ledger.v1"));
    let cfg = write_config(without_ledger);
    let (_d, client) = Daemon::streaming(&db, without_ledger).await;
    db.psql(&paid(4, "o-2", "5"));
    eventually(Duration::from_secs(30), "the two projections", || async {
        walfold_tests::count(
            &client,
            "select count(*) from walfold.checkpoint where subscriber_id <> 'orders.ledger.v1' \
             and position >= 2",
        )
        .await
            >= 3
    })
    .await;
    let (code, out, err) = walfold(&["status", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("orders.ledger.v1"))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .collect();
    assert_eq!((row[2], row[3], row[9]), ("-", "-", "unused"), "{out}");
}

/// Found by a second stranger: an outbox taken out of the publication and put back
/// before the next check (or while walfold was stopped) lost the rows written between,
/// silently. Any rewrite of the publication changes its catalog rows' xmins: walfold
/// records them, and a change is a slot gap from the position it last checked at,
/// backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_undone_at_once_or_while_stopped_loses_nothing() {
    let db = TestDb::new("pubblip");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(1, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    // Out and back within one session: no check sees the publication without it.
    db.psql(&format!(
        "alter publication walfold_outbox drop table outbox; {} \
         alter publication walfold_outbox add table outbox;",
        paid(2, "o-2", "10")
    ));
    db.psql(&paid(3, "o-3", "10"));
    caught_up(&client, 3, 3).await;
    // The same while stopped.
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql(&format!(
        "alter publication walfold_outbox drop table outbox; {} \
         alter publication walfold_outbox add table outbox;",
        paid(4, "o-4", "10")
    ));
    let (_d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(5, "o-5", "10"));
    caught_up(&client, 5, 3).await;
    assert_eq!(
        db.psql(
            "select string_agg(order_id || '=' || total, ',' order by order_id) from order_total"
        ),
        "o-1=10,o-2=10,o-3=10,o-4=10,o-5=10"
    );
    assert_eq!(
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'publication' \
             and filled_at is not null"
        ),
        "2"
    );
}

/// Event `n` (its ID `5f0c6a1e-…-n`), an `OrderPaid` of `amount` for `order`, as an
/// outbox insert.
fn paid(n: u32, order: &str, amount: &str) -> String {
    walfold_tests::insert_event(
        &format!("5f0c6a1e-0000-4000-8000-{n:012}"),
        order,
        "OrderPaid",
        1,
        &format!(r#"{{"status": "paid", "amount": "{amount}"}}"#),
    )
}
