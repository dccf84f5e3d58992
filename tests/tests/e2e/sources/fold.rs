//! Two sources fold into one read model through an outage of one and SIGKILLs of the
//! daemon; a source that is down shows in the metrics.

use std::sync::OnceLock;
use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    count, eventually, free_port, http_get, status, write_events, Daemon, Expected, TestDb,
    PROJECTIONS,
};

use super::{second_cluster, two_sources};

// Seeds are odd and distinct: `write_events` seeds its generator with `seed | 1`, and
// two writers with one stream would write the same event IDs on both sources.

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
