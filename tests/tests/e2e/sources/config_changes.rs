//! Sources changed in the config or on the server: a grown config keeps the first
//! source's history, a new slot name skips no waiting events, two sources on one
//! database are found, a dropped publication stops naming the source.

use std::time::Duration;

use walfold_tests::{count, eventually, walfold, write_config, Daemon, TestDb};

use super::{rows, second_cluster, two_sources};

/// Growing a single-source deployment into two: the first source keeps its slot and the
/// name `default` its events carry, so a projection filtered to it sees its whole
/// history; renaming it later is said in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_config_keeps_the_first_sources_history() {
    let a = TestDb::new("gra");
    let b = TestDb::on(second_cluster(), "grb");
    let target = TestDb::new("grt");
    target.psql("create table only_a (event_id uuid primary key)");
    let single = format!(
        r#"
[source]
url = "{}"
slot = "gr_a"
heartbeat_interval_s = 1
[target]
url = "{}"
[[outbox]]
table = "public.outbox"
[[projection]]
name = "ledger"
subscriber = "ledger.v1"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :source, 0)"
"#,
        a.url(),
        target.url()
    );
    let mut daemon = Daemon::start(&single, &[]);
    let c = a.client().await;
    eventually(Duration::from_secs(60), "the slot to stream", || async {
        count(&c, "select count(*) from pg_replication_slots where active").await == 1
    })
    .await;
    a.psql(&rows("before", 5));
    let t = target.client().await;
    eventually(Duration::from_secs(60), "the first events", || async {
        count(&t, "select count(*) from walfold.event_log").await == 5
    })
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));

    // The second source is added; the first keeps its slot and its name.
    let grown = two_sources(
        "gr",
        &a.url(),
        &b.url(),
        &target.url(),
        r#"
[[projection]]
name = "only_a"
subscriber = "only_a.v1"
sources = ["default"]
sql = "insert into only_a (event_id) values (:event_id)"
"#,
    )
    .replace("name = \"a\"", "name = \"default\"")
    .replace("source = \"a\"", "source = \"default\"");
    let mut daemon = Daemon::start(&grown, &[]);
    eventually(Duration::from_secs(60), "source a streaming", || async {
        count(&c, "select count(*) from pg_replication_slots where active").await == 1
    })
    .await;
    a.psql(&rows("after", 3));
    eventually(
        Duration::from_secs(60),
        "all of the first source's events",
        || async {
            count(
                &t,
                "select count(*) from walfold.event_log where source = 'default'",
            )
            .await
                == 8
                && count(&t, "select count(*) from only_a").await == 8
        },
    )
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));

    // Renamed: the log says what the events before carry.
    let renamed = grown
        .replace("name = \"default\"", "name = \"shop\"")
        .replace("source = \"default\"", "source = \"shop\"")
        .replace(
            "sources = [\"default\"]",
            // A projection's sources are part of its definition: the operator says the
            // rename folds the same events (tests/tests/e2e/definitions.rs).
            "sources = [\"shop\"]\non_definition_change = \"accept\"",
        );
    let mut daemon = Daemon::start(&renamed, &[]);
    eventually(
        Duration::from_secs(60),
        "the rename to be noticed",
        || async { daemon.log_text().contains("this slot's source was renamed") },
    )
    .await;
    a.psql(&rows("renamed", 2));
    eventually(
        Duration::from_secs(60),
        "the renamed source's events",
        || async {
            count(
                &t,
                "select count(*) from walfold.event_log where source = 'shop'",
            )
            .await
                == 2
                && count(&t, "select count(*) from only_a").await == 10
        },
    )
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
}

/// Changing a source's `slot` while events wait in the old slot: that source's start is
/// refused (the new slot would begin after them), naming the old slot and the fix; the
/// other source goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sources_new_slot_name_does_not_skip_waiting_events() {
    let a = TestDb::new("sla");
    let b = TestDb::on(second_cluster(), "slb");
    let target = TestDb::new("slt");
    let cfg = two_sources("sl", &a.url(), &b.url(), &target.url(), "");
    let mut daemon = Daemon::start(&cfg, &[]);
    let c = a.client().await;
    eventually(Duration::from_secs(60), "the slot to stream", || async {
        count(&c, "select count(*) from pg_replication_slots where active").await == 1
    })
    .await;
    a.psql(&rows("sl-before", 3));
    let t = target.client().await;
    eventually(Duration::from_secs(60), "the first events", || async {
        count(
            &t,
            "select count(*) from walfold.event_log where source = 'a'",
        )
        .await
            == 3
    })
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
    // Written while the daemon is stopped: they wait in slot sl_a.
    a.psql(&rows("sl-waiting", 4));
    let renamed = cfg.replace("slot = \"sl_a\"", "slot = \"sl_a2\"");
    let mut daemon = Daemon::start(&renamed, &[]);
    eventually(
        Duration::from_secs(60),
        "the start with a new slot name to be refused",
        || async { daemon.log_text().contains("ingest of this source stopped") },
    )
    .await;
    b.psql(&rows("sl-b", 2));
    eventually(Duration::from_secs(60), "source b to go on", || async {
        count(
            &t,
            "select count(*) from walfold.event_log where source = 'b'",
        )
        .await
            == 2
    })
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
    let log = daemon.log_text();
    assert!(
        log.contains("source `a` ingested through slot sl_a")
            && log.contains("Set the source's slot back to `sl_a`"),
        "{log}"
    );
    assert_eq!(
        count(
            &c,
            "select count(*) from pg_replication_slots where slot_name = 'sl_a2'"
        )
        .await,
        0,
        "no new slot was created"
    );
    // Set back: the waiting events arrive.
    let mut daemon = Daemon::start(&cfg, &[]);
    eventually(Duration::from_secs(60), "the waiting events", || async {
        count(
            &t,
            "select count(*) from walfold.event_log where source = 'a'",
        )
        .await
            == 7
    })
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
}

/// Two sources on one database under different URLs (`localhost` and `127.0.0.1`):
/// `walfold doctor` says they are the same database, and the daemon refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_two_sources_on_one_database() {
    let a = TestDb::new("samea");
    let target = TestDb::new("samet");
    let other_url = a.url().replacen("127.0.0.1", "localhost", 1);
    assert_ne!(other_url, a.url());
    let path = write_config(&two_sources(
        "same",
        &a.url(),
        &other_url,
        &target.url(),
        "",
    ));
    let (code, out, err) = walfold(&["doctor", "-c", path.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        out.contains("FAIL  sources a and b are the same database"),
        "{out}{err}"
    );
    // Each source's checks say which source they are about.
    assert!(out.contains("source a: wal_level = logical"), "{out}");
    assert!(out.contains("source b: wal_level = logical"), "{out}");
    // The daemon refuses to start on it.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut daemon = Daemon::start(&text, &[]);
    let code = daemon.wait_exit("the daemon to refuse").await;
    assert_ne!(code, Some(0));
    let log = daemon.log_text();
    assert!(
        log.contains("sources a and b are the same database"),
        "{log}"
    );
    assert_eq!(
        count(
            &a.client().await,
            "select count(*) from pg_replication_slots"
        )
        .await,
        0,
        "no slot was created"
    );
}

/// A source's publication dropped (and created again by walfold on the reconnect, which
/// the slot cannot see): that source's ingest stops naming the source, the slot and the
/// fix, and the other source goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_publication_stops_with_the_source_and_the_fix() {
    let a = TestDb::new("dpa");
    let b = TestDb::on(second_cluster(), "dpb");
    let target = TestDb::new("dpt");
    let mut daemon = Daemon::start(
        &two_sources("dp", &a.url(), &b.url(), &target.url(), ""),
        &[],
    );
    let c = a.client().await;
    eventually(Duration::from_secs(60), "the slot to stream", || async {
        count(&c, "select count(*) from pg_replication_slots where active").await == 1
    })
    .await;
    a.psql("drop publication walfold_outbox");
    a.psql(&rows("dp", 1));
    eventually(Duration::from_secs(60), "source a to stop", || async {
        daemon.log_text().contains("ingest of this source stopped")
    })
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("replication slot dp_a of source `a` cannot go on")
            && log.contains("pg_drop_replication_slot('dp_a')"),
        "{log}"
    );
    b.psql(&rows("dpb", 3));
    let t = target.client().await;
    eventually(Duration::from_secs(60), "source b to go on", || async {
        count(&t, "select count(*) from ledger where order_id = 'b'").await == 3
    })
    .await;
    assert!(daemon.exited().is_none(), "{}", daemon.log_text());
}

/// Issue 44 (3): a definite error of one source (its slot lost under `on_slot_lost =
/// "stop"`) stops that source's ingest only, loudly (an ERROR, `walfold_ingest_stopped`,
/// `/readyz` and `walfold status` naming it and why); the other source's events go on
/// into every projection. Before, the daemon stopped. With one source left none, the
/// daemon stops as before (`daemon/slot.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_stops_only_its_source() {
    let a = TestDb::new("lsa");
    let b = TestDb::on(second_cluster(), "lsb");
    let target = TestDb::new("lst");
    let port = walfold_tests::free_port();
    let cfg = two_sources(
        "ls",
        &a.url(),
        &b.url(),
        &target.url(),
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let mut daemon = Daemon::start(&cfg, &[]);
    let t = target.client().await;
    let streaming = |db: &TestDb, slot: &str| {
        let sql = format!(
            "select count(*) from pg_replication_slots where slot_name = '{slot}' and active"
        );
        let db_url = db.url();
        async move {
            let c = walfold_pg::connect(&db_url).await.unwrap();
            eventually(Duration::from_secs(60), "the slot to stream", || async {
                count(&c, &sql).await == 1
            })
            .await;
        }
    };
    streaming(&a, "ls_a").await;
    streaming(&b, "ls_b").await;
    a.psql(&rows("a1", 4));
    b.psql(&rows("b1", 4));
    eventually(Duration::from_secs(60), "both sources' events", || async {
        count(&t, "select count(*) from ledger").await == 8
    })
    .await;
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
    a.psql("select pg_drop_replication_slot('ls_a')");
    daemon.kill_and_restart(None);
    streaming(&b, "ls_b").await;
    b.psql(&rows("b2", 5));
    eventually(Duration::from_secs(60), "source b to go on", || async {
        count(&t, "select count(*) from ledger where order_id = 'b'").await == 9
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "/readyz to name source a",
        || async {
            let (code, body) = walfold_tests::http_get(port, "/readyz");
            code == 503
                && body.contains("ingest of source a stopped")
                && body.contains("is missing, but walfold had ingested through it")
        },
    )
    .await;
    let (_, metrics) = walfold_tests::http_get(port, "/metrics");
    assert!(
        metrics.contains("walfold_ingest_stopped{source=\"a\"} 1"),
        "{metrics}"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("ERROR") && log.contains("ingest of this source stopped"),
        "{log}"
    );
    let path = walfold_tests::write_config(&cfg);
    let (_, out, err) = walfold_tests::walfold(&["status", "-c", path.to_str().unwrap()], &[]);
    assert!(
        out.contains("source a: INGEST STOPPED") && out.contains("slot ls_a: MISSING"),
        "{out}{err}"
    );
    assert!(!out.contains("source b: INGEST STOPPED"), "{out}");
    // Nothing of a was lost or read twice meanwhile; a's new writes wait on its server.
    a.psql(&rows("a2", 2));
    b.psql(&rows("b3", 1));
    eventually(Duration::from_secs(60), "source b's next event", || async {
        count(&t, "select count(*) from ledger where order_id = 'b'").await == 10
    })
    .await;
    assert_eq!(
        count(&t, "select count(*) from ledger where order_id = 'a'").await,
        4
    );
    assert!(daemon.exited().is_none(), "{}", daemon.log_text());
}
