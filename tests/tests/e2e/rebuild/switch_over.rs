//! A rebuild's switch-over: only once it has read as far as the live subscriber, tried
//! again when it fails, the retired table dropped after its delay, the retired
//! subscriber exporting no lag.

use std::time::Duration;

use walfold_tests::{count, difference, eventually, walfold, Daemon, TestDb};

use super::{
    config, projected, rebuild_state, start_rebuild, subscriber_caught_up, TOTALS_FROM_LOG,
};

/// A stranger rebuilt a small projection (nine events, within the switch-over's slack of
/// the head): it switched over before replaying anything, readers saw an empty table,
/// and the event the new table refuses was dead-lettered only after the switch. The
/// switch waits until the rebuild has read as far as the live subscriber, with no open
/// dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_rebuild_switches_only_after_replaying_as_far_as_the_live_one() {
    let db = TestDb::new("smallrebuild");
    let (d, client) = Daemon::streaming(&db, &config(&db, "")).await;
    let cfg = d.config_path().to_owned();
    for i in 1..=8 {
        db.psql(&walfold_tests::insert_event(
            &uuid::Uuid::new_v4().to_string(),
            &format!("o-{i}"),
            "OrderPaid",
            1,
            r#"{"amount": "1"}"#,
        ));
    }
    db.psql(&walfold_tests::insert_event(
        &uuid::Uuid::new_v4().to_string(),
        "bad-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    let rows = || count(&client, "select count(*) from order_total");
    eventually(Duration::from_secs(30), "nine rows", || async {
        rows().await == 9
    })
    .await;
    subscriber_caught_up(&client, "orders.total.v1", 30).await;
    // The shadow table is created like the live one: it refuses bad-1, the live one
    // holds it (not valid: existing rows are not checked).
    db.psql("alter table order_total add constraint no_bad check (order_id <> 'bad-1') not valid");

    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 0, "{err}");
    let letter = || {
        db.psql("select coalesce(max(id)::text, '') from walfold.dead_letter where subscriber_id = 'orders.total.v2'")
    };
    eventually(Duration::from_secs(30), "bad-1's dead letter", || async {
        !letter().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        rebuild_state(&client, "orders.total.v2").await,
        "running",
        "the open dead letter holds the switch"
    );
    assert_eq!(rows().await, 9, "the live table still serves every row");

    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "discard",
            &letter(),
            "--reason",
            "test",
            "-c",
            &cfg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(30), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    assert_eq!(
        rows().await,
        8,
        "the rebuilt table is whole from the first read after the switch"
    );
}

/// A daemon on `text` with 2 000 events projected, and a rebuild of order_total under
/// orders.total.v2 started.
async fn small_rebuild(db: &TestDb, text: &str) -> (Daemon, tokio_postgres::Client) {
    let (d, client) = projected(db, text, 2_000, 50, "orders.total.v1").await;
    let (code, _, err) = start_rebuild(d.config_path(), "order_total", "orders.total.v2");
    assert_eq!(code, 0, "{err}");
    (d, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_retired_after_finishes_a_switched_rebuild_by_itself() {
    let db = TestDb::new("retire");
    let text = config(&db, "").replace(
        "parallelism = 2",
        "parallelism = 2\ndrop_retired_after = \"2s\"",
    );
    let (_d, client) = small_rebuild(&db, &text).await;
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await != "running"
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the retired table to be dropped",
        || async { rebuild_state(&client, "orders.total.v2").await == "finished" },
    )
    .await;
    assert_eq!(
        db.psql("select to_regclass('order_total__retired') is null"),
        "t"
    );
    subscriber_caught_up(&client, "orders.total.v2", 60).await;
    assert_eq!(
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG
        )
        .await,
        0
    );
}

/// A switch-over that fails (the retired name was taken meanwhile) is tried again after
/// its backoff, and nothing live changes until it succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_switch_over_is_tried_again() {
    let db = TestDb::new("switchretry");
    let (d, client) = small_rebuild(&db, &config(&db, "")).await;
    db.psql("create table order_total__retired (x int)");
    eventually(Duration::from_secs(60), "a failed switch-over", || async {
        d.log_text().contains("switch-over failed")
    })
    .await;
    assert_eq!(rebuild_state(&client, "orders.total.v2").await, "running");
    assert_eq!(
        db.psql("select subscriber_id from walfold.projection where name = 'order_total'"),
        "orders.total.v1"
    );
    // The operator sees why, not only the daemon's log (a stranger's `--wait` blamed
    // dead letters the rebuild did not have).
    eventually(Duration::from_secs(10), "the failure in status", || async {
        let (code, out, _) = walfold(&["status", "-c", d.config_path()], &[]);
        code == 0 && out.contains("switch-over failed") && out.contains("order_total__retired")
    })
    .await;
    let (_, out, _) = walfold(&["status", "--json", "-c", d.config_path()], &[]);
    let status: serde_json::Value = serde_json::from_str(&out).expect("status --json");
    let rebuild = &status["rebuilds"][0];
    assert!(
        rebuild["switch_error"]
            .as_str()
            .is_some_and(|e| e.contains("already exists")),
        "{rebuild}"
    );
    assert_eq!(rebuild["open_dead_letters"], 0, "{rebuild}");
    db.psql("drop table order_total__retired");
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    assert_eq!(
        db.psql("select coalesce(switch_error, 'none') from walfold.rebuild"),
        "none",
        "a successful switch-over forgets the failure"
    );
    subscriber_caught_up(&client, "orders.total.v2", 60).await;
    assert_eq!(
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG
        )
        .await,
        0
    );
}

/// After a switch-over the retired subscriber stays until `--finish`, falling behind by
/// design: it exports no lag (which would page `WalfoldSubscriberLagging`), the one now
/// serving does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_subscriber_exports_no_lag() {
    let db = TestDb::new("retiredlag");
    let port = walfold_tests::free_port();
    let text = config(&db, &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let (_d, client) = small_rebuild(&db, &text).await;
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await != "running"
    })
    .await;
    db.psql(&walfold_tests::insert_event(
        &uuid::Uuid::new_v4().to_string(),
        "o-late",
        "OrderPaid",
        1,
        r#"{"amount": "1.00"}"#,
    ));
    subscriber_caught_up(&client, "orders.total.v2", 60).await;
    eventually(
        Duration::from_secs(30),
        "the serving subscriber's lag",
        || async {
            let (_, body) = walfold_tests::http_get(port, "/metrics");
            body.contains("walfold_subscriber_lag_events{subscriber=\"orders.total.v2\"} 0")
        },
    )
    .await;
    let (_, body) = walfold_tests::http_get(port, "/metrics");
    assert!(
        !body.contains("walfold_subscriber_lag_events{subscriber=\"orders.total.v1\"}")
            && !body.contains("walfold_subscriber_lag_seconds{subscriber=\"orders.total.v1\"}"),
        "the retired subscriber exports lag:\n{body}"
    );
    // Nor does `walfold status` show one (a stranger read the retired one's growing lag
    // as a stuck projection): it says which subscriber serves and which is retired.
    let cfg = walfold_tests::write_config(&text);
    let (code, out, err) = walfold(&["status", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let row = |subscriber: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(subscriber))
            .unwrap_or_else(|| panic!("no row of {subscriber}: {out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let (retired, serving) = (row("orders.total.v1"), row("orders.total.v2"));
    assert_eq!(
        (retired[2].as_str(), retired[3].as_str()),
        ("-", "-"),
        "{out}"
    );
    assert_eq!(retired[9], "retired", "{out}");
    assert_eq!(serving[9], "live", "{out}");
    let (_, json, _) = walfold(&["status", "--json", "-c", cfg.to_str().unwrap()], &[]);
    assert!(json.contains("\"serves\": \"retired\""), "{json}");
}
