//! The replication slot: lost, invalidated or advanced behind walfold's back (a gap
//! recorded and backfilled, or a refusal), and moving on an idle database.

use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, eventually, free_port, http_get, slot_active, walfold, write_config, write_events,
    Daemon, TestDb,
};

use super::paid;

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

/// Found upgrading from a release that acknowledged an idle slot's keepalives without
/// recording them: its final standby status on SIGTERM passed its recorded position, and
/// once anything of this release wrote the position before streaming (here an operator's
/// backfill; at start, a gap's backfill), the next start took the difference for a slot
/// moved by someone else: an ERROR, a slot gap and the `WalfoldSlotGap` page, with nothing
/// lost. Only a position written while this release streams from the slot vouches for
/// the acknowledgements after it; and a slot advanced past outbox rows after that is
/// still a gap, backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_releases_final_acknowledgement_is_no_gap_but_a_later_advance_is() {
    let db = TestDb::new("olderack");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(1, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    // As an older release leaves it: its writes never vouched for its acknowledgements,
    // and its final one went past what it recorded (WAL of other tables only).
    db.psql("update walfold.ingest_position set acks_recorded = false");
    db.psql("create table elsewhere (x int); insert into elsewhere values (1)");
    db.psql("select pg_replication_slot_advance('walfold', pg_current_wal_lsn())");
    // The operator backfills before starting the new release: a write of the position.
    let (code, out, err) = walfold(
        &[
            "backfill",
            "-c",
            d.config_path(),
            "--outbox",
            "public.outbox",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(2, "o-2", "10"));
    caught_up(&client, 2, 3).await;
    assert_eq!(
        db.psql("select count(*) from walfold.slot_gap"),
        "0",
        "{}",
        d.log_text()
    );
    assert!(!d
        .log_text()
        .contains("moved past walfold's ingest position"));
    // What the rule must still catch: stopped again, an event, the slot moved past it.
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql(&paid(3, "o-3", "10"));
    db.psql("select pg_replication_slot_advance('walfold', pg_current_wal_lsn())");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    caught_up(&client, 3, 3).await;
    assert_eq!(
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'advanced' \
             and filled_at is not null"
        ),
        "1",
        "{}",
        d.log_text()
    );
    assert_eq!(
        db.psql("select string_agg(order_id, ',' order by order_id) from order_total"),
        "o-1,o-2,o-3"
    );
}
