//! Several sources: two source servers, each with its outbox, folded into read models
//! on the main target and on a second target server (three clusters in all), through an
//! outage of one source and SIGKILLs of the daemon.

use std::sync::OnceLock;
use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    count, eventually, free_port, http_get, status, walfold, write_config, write_events, Daemon,
    Expected, TestDb, PROJECTIONS,
};

// Seeds are odd and distinct: `write_events` seeds its generator with `seed | 1`, and
// two writers with one stream would write the same event IDs on both sources.

/// The second source's server: its own cluster, stopped and started by the test.
fn second_cluster() -> &'static Cluster {
    static SECOND: OnceLock<Cluster> = OnceLock::new();
    SECOND.get_or_init(|| Cluster::start(Options::default()).expect("second cluster"))
}

/// The second target's server.
fn third_cluster() -> &'static Cluster {
    static THIRD: OnceLock<Cluster> = OnceLock::new();
    THIRD.get_or_init(|| Cluster::start(Options::default()).expect("third cluster"))
}

const READ_MODELS: &str = "
create table by_source (event_id uuid primary key, source text not null, order_id text not null);
create table payments_ledger (event_id uuid primary key, amount numeric not null);
";

fn config(orders: &str, payments: &str, target: &str, reporting: &str, port: u16) -> String {
    format!(
        r#"
[[source]]
name = "orders"
url = "{orders}"
slot = "walfold_orders"
heartbeat_interval_s = 1

[[source]]
name = "payments"
url = "{payments}"
slot = "walfold_payments"
heartbeat_interval_s = 1

[target]
url = "{target}"

[targets.reporting]
url = "{reporting}"

[[outbox]]
source = "orders"
table = "public.outbox"

[[outbox]]
source = "payments"
table = "public.outbox"

[pipeline]
max_backoff_ms = 500
shutdown_timeout_s = 20

[metrics]
listen = "127.0.0.1:{port}"

[log]
level = "info"

{PROJECTIONS}
[[projection]]
name = "by_source"
subscriber = "orders.by_source.v1"
sql = "insert into by_source (event_id, source, order_id) values (:event_id, :source, :aggregate_id)"

[[projection]]
name = "payments_ledger"
subscriber = "payments.ledger.v1"
sources = ["payments"]
sql = "insert into payments_ledger (event_id, amount) values (:event_id, coalesce(:payload.amount::numeric, 0))"

[[projection]]
name = "reporting_total"
subscriber = "reporting.total.v1"
database = "reporting"
sql = """
insert into order_total (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = order_total.total + excluded.total
"""
"#
    )
}

fn merge(into: &mut Expected, from: Expected) {
    into.events.extend(from.events);
    into.rows_written += from.rows_written;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_fold_into_one_read_model_through_outages_and_kills() {
    let orders = TestDb::new("orders");
    let payments = TestDb::on(second_cluster(), "payments");
    let target = TestDb::new("main");
    target.psql(READ_MODELS);
    let reporting = TestDb::on(third_cluster(), "reporting");
    let port = free_port();
    let mut daemon = Daemon::start(
        &config(
            &orders.url(),
            &payments.url(),
            &target.url(),
            &reporting.url(),
            port,
        ),
        &[],
    );
    let t = target.client().await;
    let in_log = |source: &'static str| {
        let t = &t;
        async move {
            count(
                t,
                &format!("select count(*) from walfold.event_log where source = '{source}'"),
            )
            .await
        }
    };

    // Rows written before a slot exists are not in its stream (that is what a backfill
    // is for): write once both slots stream.
    for (db, slot) in [(&orders, "walfold_orders"), (&payments, "walfold_payments")] {
        let c = db.client().await;
        eventually(Duration::from_secs(60), "the slot to stream", || async {
            count(
                &c,
                &format!("select count(*) from pg_replication_slots where slot_name = '{slot}' and active"),
            )
            .await
                == 1
        })
        .await;
    }

    // Both sources stream, interleaved in one log.
    let mut expected = Expected::default();
    let (a, b) = tokio::join!(
        write_events(orders.url(), 60, 5, 20, Duration::from_millis(5), 101),
        write_events(payments.url(), 60, 5, 20, Duration::from_millis(5), 203),
    );
    let from_payments: Vec<uuid::Uuid> = b.events.keys().copied().collect();
    merge(&mut expected, a);
    merge(&mut expected, b);

    // The same event ID on both sources: with the same content it is one event; with
    // other content the second copy is quarantined as an id_conflict.
    let same = uuid::Uuid::new_v4();
    let other = uuid::Uuid::new_v4();
    let row = |id: uuid::Uuid, amount: &str| {
        format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values ('{id}', 'order', 'shared', 'OrderChanged', 1, '{{\"status\": \"v1\", \"amount\": \"{amount}\"}}')"
        )
    };
    orders.psql(&format!("{}; {}", row(same, "1.00"), row(other, "2.00")));
    eventually(Duration::from_secs(60), "the orders copies in the log", || async {
        count(
            &t,
            &format!("select count(*) from walfold.event_log where event_id in ('{same}', '{other}')"),
        )
        .await
            == 2
    })
    .await;
    payments.psql(&format!("{}; {}", row(same, "1.00"), row(other, "9.99")));
    expected.events.insert(same, ("shared".into(), 1, 100));
    expected.events.insert(other, ("shared".into(), 1, 200));
    eventually(Duration::from_secs(60), "the id_conflict from payments", || async {
        count(
            &t,
            &format!(
                "select count(*) from walfold.dead_letter where reason = 'id_conflict' and event_id = '{other}'"
            ),
        )
        .await
            == 1
    })
    .await;

    // The payments server goes away for 10 s: orders keep flowing meanwhile.
    second_cluster().stop("immediate").unwrap();
    let down = std::time::Instant::now();
    let before = in_log("orders").await;
    let during = write_events(orders.url(), 40, 5, 20, Duration::from_millis(20), 305).await;
    let written_during = during.distinct();
    merge(&mut expected, during);
    eventually(
        Duration::from_secs(30),
        "orders flowing while payments is down",
        || async { in_log("orders").await >= before + written_during },
    )
    .await;
    let (code, body) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("payments"),
        "readiness names the source: {body}"
    );
    let (_, cli, _) = walfold_tests::walfold(&["status", "--config", daemon.config_path()], &[]);
    assert!(
        cli.contains("source payments: slot walfold_payments: UNREACHABLE"),
        "status shows the source that is down:\n{cli}"
    );
    // Down for 10 s in all.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down.elapsed())).await;
    second_cluster().start_again().unwrap();
    eprintln!(
        "payments was down for {:.1} s",
        down.elapsed().as_secs_f64()
    );

    // Back: its events arrive, with kills of the daemon while both stream.
    let writers = tokio::spawn(async move {
        let o = orders.url();
        let p = payments.url();
        let (a, b) = tokio::join!(
            write_events(o, 80, 5, 20, Duration::from_millis(15), 407),
            write_events(p, 80, 5, 20, Duration::from_millis(15), 509),
        );
        (a, b, orders, payments)
    });
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        daemon.kill_and_restart(None);
    }
    let (a, b, orders, payments) = writers.await.unwrap();
    let late_payments: Vec<uuid::Uuid> = b.events.keys().copied().collect();
    merge(&mut expected, a);
    merge(&mut expected, b);

    let settled = || async {
        count(&t, "select count(*) from walfold.event_log").await == expected.distinct()
            && status(&t).await.is_some_and(|s| {
                s.subscribers.len() >= 5 && s.subscribers.iter().all(|sub| sub.lag_events == 0)
            })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !settled().await {
        if std::time::Instant::now() > deadline {
            let missing: Vec<String> = {
                let ids: Vec<uuid::Uuid> = expected.events.keys().copied().collect();
                t.query(
                    "select i::text from unnest($1::uuid[]) i \
                     where not exists (select from walfold.event_log where event_id = i)",
                    &[&ids],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
            };
            let ids: Vec<uuid::Uuid> = missing.iter().map(|m| m.parse().unwrap()).collect();
            for (name, db) in [("orders", &orders), ("payments", &payments)] {
                let c = db.client().await;
                let rows = c
                    .query(
                        "select count(*), min(xmin::text), max(xmin::text) from outbox where id = any($1)",
                        &[&ids],
                    )
                    .await
                    .unwrap();
                let slots = db.psql("select slot_name, confirmed_flush_lsn, restart_lsn, pg_current_wal_lsn() from pg_replication_slots");
                eprintln!(
                    "{name}: missing rows here {:?} {:?} {:?}; slots {slots}",
                    rows[0].get::<_, i64>(0),
                    rows[0].get::<_, Option<String>>(1),
                    rows[0].get::<_, Option<String>>(2)
                );
            }
            eprintln!(
                "ingest {}",
                target.psql("select slot, lsn, appended, duplicates from walfold.ingest_position")
            );
            eprintln!("log {}", target.psql("select source, count(*), min(seq), max(seq) from walfold.event_log group by source"));
            panic!(
                "not settled: {} in the log, {} expected, missing {} {missing:?}; status {:#?}",
                count(&t, "select count(*) from walfold.event_log").await,
                expected.distinct(),
                missing.len(),
                status(&t).await.map(|s| s.subscribers)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    expected.check(&t).await;
    // The second target folds the same events of both sources.
    let r = reporting.client().await;
    let head = count(&t, "select max(seq) from walfold.event_log").await;
    eventually(
        Duration::from_secs(60),
        "the second target to catch up",
        || async {
            count(
                &r,
                &format!(
                    "select count(*) from walfold.checkpoint \
                 where subscriber_id = 'reporting.total.v1' and position >= {head}"
                ),
            )
            .await
                == 1
        },
    )
    .await;
    assert_eq!(
        count(
            &r,
            "select coalesce((sum(total) * 100)::int8, 0) from order_total"
        )
        .await,
        expected.total_cents(),
        "the second target's sum over the distinct events of both sources"
    );
    assert_eq!(
        count(&r, "select count(*) from walfold.dead_letter").await,
        0
    );

    // `:source` and `sources = [...]`.
    let payments_ids: Vec<uuid::Uuid> = from_payments.into_iter().chain(late_payments).collect();
    assert_eq!(
        count(&t, "select count(*) from payments_ledger").await,
        payments_ids.len() as i64,
        "the payments-only projection sees exactly the payments events"
    );
    assert_eq!(
        count(
            &t,
            "select count(*) from payments_ledger p join by_source b using (event_id) \
             where b.source = 'payments'"
        )
        .await,
        payments_ids.len() as i64
    );
    assert_eq!(
        count(&t, "select count(*) from by_source").await,
        expected.distinct()
    );
    assert_eq!(
        count(
            &t,
            &format!(
                "select count(*) from by_source where event_id = '{same}' and source = 'orders'"
            )
        )
        .await,
        1,
        "a cross-source duplicate is the first source's event"
    );

    // Nothing a slot confirmed before a kill was missing from the log: every distinct
    // event of both sources is in it once (checked above).
    assert_eq!(
        count(
            &t,
            "select count(*) from walfold.dead_letter where reason <> 'id_conflict'"
        )
        .await,
        0,
        "an outage dead-letters nothing"
    );
    eprintln!(
        "figures: {} events from orders, {} from payments in the log ({} distinct written, \
         {} rows); payments down 10 s; 3 SIGKILLs while both streamed",
        in_log("orders").await,
        in_log("payments").await,
        expected.distinct(),
        expected.rows_written
    );
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));

    // A backfill reads the source that holds the outbox; both have `public.outbox`.
    let path = daemon.config_path().to_owned();
    let (code, _, err) = walfold_tests::walfold(
        &["backfill", "--config", &path, "--outbox", "public.outbox"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is an outbox of the sources orders, payments: name one with --source"),
        "{err}"
    );
    let (code, out, err) = walfold_tests::walfold(
        &[
            "backfill",
            "--config",
            &path,
            "--outbox",
            "public.outbox",
            "--source",
            "payments",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        count(&t, "select count(*) from walfold.event_log").await,
        expected.distinct(),
        "the backfilled payments rows were all in the log already"
    );

    // A source's slot renamed by mistake: doctor names the slot walfold ingested through.
    let renamed = std::fs::read_to_string(&path).unwrap().replace(
        "slot = \"walfold_payments\"",
        "slot = \"walfold_payments_v2\"",
    );
    let renamed = walfold_tests::write_config(&renamed);
    let (_, out, err) =
        walfold_tests::walfold(&["doctor", "--config", renamed.to_str().unwrap()], &[]);
    assert!(
        out.contains("walfold ingested through slot walfold_payments (up to")
            && out.contains("which no [[source]] uses now"),
        "{out}{err}"
    );
}

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

// Found by trying the feature as a stranger would (two sources named `a` and `b`).

fn two_sources(tag: &str, a: &str, b: &str, target: &str, extra: &str) -> String {
    format!(
        r#"
[[source]]
name = "a"
url = "{a}"
slot = "{tag}_a"
heartbeat_interval_s = 1

[[source]]
name = "b"
url = "{b}"
slot = "{tag}_b"
heartbeat_interval_s = 1

[target]
url = "{target}"

[[outbox]]
source = "a"
table = "public.outbox"

[[outbox]]
source = "b"
table = "public.outbox"

[pipeline]
max_backoff_ms = 500

[[projection]]
name = "ledger"
subscriber = "ledger.v1"
sql = "insert into ledger (event_id, order_id, amount) values (:event_id, :source, 0)"
{extra}
"#
    )
}

fn rows(tag: &str, n: usize) -> String {
    format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select md5('{tag}' || i)::uuid, 'order', '{tag}-' || i, 'Placed', 1, '{{}}' \
         from generate_series(1, {n}) i"
    )
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

fn gauge(metrics: &str, name: &str, source: &str) -> Option<f64> {
    let prefix = format!("{name}{{source=\"{source}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// A source whose server is down shows in /metrics: its `slot_active` drops to 0 and
/// its `seconds_since_feedback` (known without any database) keeps counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_is_down_shows_in_metrics() {
    let a = TestDb::new("mda");
    let b = TestDb::on(second_cluster(), "mdb");
    let target = TestDb::new("mdt");
    let port = free_port();
    let extra = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let mut daemon = Daemon::start(
        &two_sources("md", &a.url(), &b.url(), &target.url(), &extra),
        &[],
    );
    eventually(
        Duration::from_secs(60),
        "both sources streaming",
        || async {
            let (_, m) = http_get(port, "/metrics");
            gauge(&m, "walfold_slot_active", "a") == Some(1.0)
                && gauge(&m, "walfold_slot_active", "b") == Some(1.0)
        },
    )
    .await;
    second_cluster().stop("fast").unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (code, ready) = http_get(port, "/readyz");
    let (_, m) = http_get(port, "/metrics");
    second_cluster().start_again().unwrap();
    assert_eq!(code, 503, "{ready}");
    let active = gauge(&m, "walfold_slot_active", "b");
    let feedback = gauge(&m, "walfold_seconds_since_feedback", "b");
    assert!(
        active != Some(1.0) && feedback.is_some_and(|s| s >= 10.0),
        "15 s after source b's server stopped: slot_active{{b}} = {active:?}, \
         seconds_since_feedback{{b}} = {feedback:?} (readyz: {ready})"
    );
    assert_eq!(daemon.terminate(Duration::from_secs(30)), Some(0));
}

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
        .replace("sources = [\"default\"]", "sources = [\"shop\"]");
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

/// Changing a source's `slot` while events wait in the old slot: the start is refused
/// (the new slot would begin after them), naming the old slot and the fix.
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
    let code = daemon
        .wait_exit("the start with a new slot name to be refused")
        .await;
    assert_ne!(code, Some(0));
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
/// the slot cannot see): the daemon stops naming the source, the slot and the fix.
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
    let code = daemon.wait_exit("the daemon to stop").await;
    assert_ne!(code, Some(0));
    let log = daemon.log_text();
    assert!(
        log.contains("replication slot dp_a of source `a` cannot go on")
            && log.contains("pg_drop_replication_slot('dp_a')"),
        "{log}"
    );
}
