//! Which source an event or a rejection is of: a rejected row identified within its
//! source, a backfill of an outbox name two sources share, the operator tools naming
//! the source.

use std::time::Duration;

use walfold_tests::{count, eventually, walfold, write_config, Daemon, TestDb};

use super::{rows, second_cluster, two_sources};

/// A WAL position and a backfilled row's digest identify a rejected row only within one
/// source's database: the same identity from another source is another row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_rejection_is_identified_within_its_source() {
    use walfold_event::{DeadLetter, Lsn, Reason, RowOrigin};
    use walfold_store::{DeadLetters, Schema};
    let db = TestDb::new("dlsource");
    walfold_store::migrate(&db.url(), &walfold_store::Schema::new("walfold"))
        .await
        .unwrap();
    let c = db.client().await;
    let letter = |origin: RowOrigin, raw: serde_json::Value| DeadLetter {
        subscriber_id: None,
        event_id: None,
        seq: None,
        aggregate_type: Some("order".into()),
        aggregate_id: Some("o-1".into()),
        reason: Reason::Malformed,
        error: "id is null".into(),
        raw: Some(raw),
        existing: None,
        attempts: 1,
        source_lsn: Some(Lsn(0x0100_0000)),
        origin: Some(origin),
    };
    let orders = DeadLetters::prepare_for(&c, &Schema::new("walfold"), Some("orders"))
        .await
        .unwrap();
    let payments = DeadLetters::prepare_for(&c, &Schema::new("walfold"), Some("payments"))
        .await
        .unwrap();
    // (A row read by the stream and by a backfill is recorded once: each kind gets a
    // row of its own here.)
    for (origin, raw) in [
        (
            RowOrigin::Wal {
                lsn: Lsn(0x0100_0040),
                index: 0,
                element: 0,
            },
            serde_json::json!({"id": null, "streamed": true}),
        ),
        (
            RowOrigin::Backfill {
                digest: uuid::Uuid::from_u128(7),
            },
            serde_json::json!({"id": null, "backfilled": true}),
        ),
    ] {
        let l = letter(origin, raw);
        assert!(orders.record(&c, &l).await.unwrap().is_some());
        assert!(
            orders.record(&c, &l).await.unwrap().is_none(),
            "a replay of the same source records nothing twice"
        );
        assert!(
            payments.record(&c, &l).await.unwrap().is_some(),
            "the same identity in another source's database is another row"
        );
    }
    assert_eq!(
        count(
            &c,
            "select count(*) from walfold.dead_letter where source in ('orders', 'payments')"
        )
        .await,
        4
    );
}

/// Two services whose outboxes are both `public.outbox`: a backfill of that name is
/// refused as ambiguous (exit 2), naming both sources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_reaches_the_second_source_of_a_shared_outbox_name() {
    let a = TestDb::new("bfa");
    let b = TestDb::on(second_cluster(), "bfb");
    let target = TestDb::new("bft");
    a.psql(&rows("a", 5));
    b.psql(&rows("b", 7));
    let path = write_config(&two_sources("bf", &a.url(), &b.url(), &target.url(), ""));
    let path = path.to_str().unwrap();
    let (code, out, err) = walfold(&["backfill", "-c", path, "--outbox", "public.outbox"], &[]);
    let t = target.client().await;
    let from_a = count(
        &t,
        "select count(*) from walfold.event_log where source = 'a'",
    )
    .await;
    let from_b = count(
        &t,
        "select count(*) from walfold.event_log where source = 'b'",
    )
    .await;
    let refused = code == 2 && err.contains('a') && err.contains('b');
    assert!(
        refused || (code == 0 && from_a == 5 && from_b == 7),
        "backfill --outbox public.outbox: exit {code}, {from_a} rows of a and {from_b} of b \
         in the log (b's 7 rows cannot be backfilled);\nstdout {out}\nstderr {err}"
    );
}

/// The operator tools name an event's or a rejection's source: `dead-letters list`
/// (a source column, and `source` in `--json`), `walfold events` (`source`), and
/// `events --subscriber` of a `sources = [...]` projection calls another source's event
/// filtered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_tools_name_the_source() {
    let a = TestDb::new("ota");
    let b = TestDb::on(second_cluster(), "otb");
    let target = TestDb::new("ott");
    target.psql("create table only_b (event_id uuid primary key)");
    let cfg = two_sources(
        "ot",
        &a.url(),
        &b.url(),
        &target.url(),
        r#"
[[projection]]
name = "only_b"
subscriber = "only_b.v1"
sources = ["b"]
sql = "insert into only_b (event_id) values (:event_id)"
"#,
    );
    let mut daemon = Daemon::start(&cfg, &[]);
    for db in [&a, &b] {
        let c = db.client().await;
        eventually(Duration::from_secs(60), "the slot to stream", || async {
            count(&c, "select count(*) from pg_replication_slots where active").await == 1
        })
        .await;
    }
    a.psql(&rows("ot-a", 1));
    b.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (null, 'order', 'x', 'Placed', 1, '{}')",
    );
    let t = target.client().await;
    eventually(
        Duration::from_secs(60),
        "the event and the rejection",
        || async {
            count(&t, "select count(*) from walfold.event_log").await == 1
                && count(&t, "select count(*) from walfold.dead_letter").await == 1
                && count(
                    &t,
                    "select count(*) from walfold.checkpoint where subscriber_id = 'only_b.v1' \
                 and position >= 1",
                )
                .await
                    >= 1
        },
    )
    .await;
    let path = daemon.config_path().to_owned();
    let mut problems = Vec::new();
    let (_, json, _) = walfold(&["dead-letters", "list", "-c", &path, "--json"], &[]);
    if !json.contains("\"source\": \"b\"") && !json.contains("\"source\":\"b\"") {
        problems.push(format!("dead-letters list --json names no source:\n{json}"));
    }
    let (_, table, _) = walfold(&["dead-letters", "list", "-c", &path], &[]);
    if !table.to_lowercase().contains("source") {
        problems.push(format!(
            "dead-letters list shows no source column:\n{table}"
        ));
    }
    let (_, events, _) = walfold(&["events", "-c", &path, "--subscriber", "only_b.v1"], &[]);
    if !events.contains("\"source\":\"a\"") {
        problems.push(format!("events prints no source:\n{events}"));
    }
    let (_, from_a, _) = walfold(&["events", "-c", &path, "--source", "a"], &[]);
    let (_, from_b, _) = walfold(&["events", "-c", &path, "--source", "b"], &[]);
    if from_a.lines().count() != 1 || !from_b.trim().is_empty() {
        problems.push(format!(
            "events --source: a gave {from_a:?}, b (only a rejected row) gave {from_b:?}"
        ));
    }
    if !events.contains("\"outcome\":\"filtered\"") {
        problems.push(format!(
            "events --subscriber only_b.v1 does not call source a's event filtered:\n{events}"
        ));
    }
    let (code, out, err) = walfold(&["events", "-c", &path, "--source", "nope"], &[]);
    if code != 0 || !out.trim().is_empty() || !err.contains("no [[source]] named nope") {
        problems.push(format!(
            "events --source of an unknown source says nothing: {code} {out:?} {err:?}"
        ));
    }
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
