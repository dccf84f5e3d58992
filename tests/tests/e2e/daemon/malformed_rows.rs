//! Malformed rows and producers that retry: a dead letter each, once, listed and
//! discarded; said once in the log, not once per row or batch.

use std::time::Duration;

use walfold_tests::{caught_up, eventually, slot_active, walfold, write_config, Daemon, TestDb};

use super::paid;

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
