//! Projections on another server (`[targets.NAME]`, `projection.database`): their read
//! models and state live on a second PostgreSQL cluster while the event log stays on
//! the first. One daemon config, one second cluster, in phases: the second target
//! folds what the main one folds; it is stopped mid-stream and only its projections
//! pause; the daemon is SIGKILLed repeatedly while events stream; its projection is
//! rebuilt under a new subscriber. And the fence holds on an extra target: a deposed
//! leader's transaction there lands before the new leader's takeover or fails.

use std::time::Duration;

use tokio_postgres::Client;
use walfold_config::builder::ConfigBuilder;
use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, count, eventually, free_port, http_get, slot_active, walfold, write_events, Daemon,
    Expected, Rng, TestDb,
};

/// The second target's projections: a running sum (rebuildable: it names `{table}`)
/// with two partitions, and a guarded state upsert.
const REPORTING: &str = r#"
[[projection]]
name = "reporting_total"
subscriber = "reporting.total.v1"
database = "reporting"
parallelism = 2
max_attempts = 2
retry_backoff_ms = 10
target = "public.order_total"
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""

[[projection]]
name = "reporting_state"
subscriber = "reporting.state.v1"
database = "reporting"
table = "public.order_state"
key = "order_id"
version_column = "version"
dedup_retention = "1s"
max_attempts = 2
retry_backoff_ms = 10
columns = { status = ":payload.status", amount = ":payload.amount::numeric" }
"#;

/// Waits until every partition of each of `subscribers` on the second target has read
/// the main log to its head (and the log holds `events`).
async fn reporting_caught_up(main: &Client, rep: &Client, events: i64, subscribers: &[&str]) {
    eventually(
        Duration::from_secs(90),
        "the second target's projections to catch up",
        || async {
            let head = count(main, "select coalesce(max(seq), 0) from walfold.event_log").await;
            if count(main, "select count(*) from walfold.event_log").await < events {
                return false;
            }
            for s in subscribers {
                let Ok(row) = rep
                    .query_one(
                        "select count(*), coalesce(min(position), 0), coalesce(max(partitions), 1)::int8 \
                         from walfold.checkpoint where subscriber_id = $1",
                        &[s],
                    )
                    .await
                else {
                    return false;
                };
                let (n, min, partitions): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                if n < partitions || min < head {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// The second target's read models against the independent fold, and against the
/// same projections on the main target.
async fn check_reporting(expected: &Expected, main: &Client, rep: &Client) {
    let total: Option<i64> = rep
        .query_one("select (sum(total) * 100)::int8 from order_total", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        total.unwrap_or(0),
        expected.total_cents(),
        "the second target's sum over distinct event IDs"
    );
    let mut latest: std::collections::BTreeMap<String, i64> = Default::default();
    for (order, version, _) in expected.events.values() {
        let v = latest.entry(order.clone()).or_insert(0);
        *v = (*v).max(*version);
    }
    let rows = rep
        .query("select order_id, version from order_state", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), latest.len(), "one state row per order");
    for row in rows {
        let order: String = row.get(0);
        assert_eq!(Some(&row.get::<_, i64>(1)), latest.get(&order), "{order}");
    }
    // The same fold as the main target's projection of the same events.
    let main_totals: Vec<(String, String)> = main
        .query(
            "select order_id, total::text from order_total order by 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let rep_totals: Vec<(String, String)> = rep
        .query(
            "select order_id, total::text from order_total order by 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(main_totals, rep_totals, "both targets fold the same events");
    assert_eq!(
        count(rep, "select count(*) from walfold.dead_letter").await,
        0,
        "nothing dead-lettered on the second target"
    );
    assert_eq!(
        count(rep, "select count(*) from walfold.event_log").await,
        0,
        "the event log stays on the main target"
    );
}

fn merge(into: &mut Expected, more: Expected) {
    into.rows_written += more.rows_written;
    into.events.extend(more.events);
}

fn paused_gauge(port: u16, subscriber: &str) -> Option<i64> {
    let (_, body) = http_get(port, "/metrics");
    let prefix = format!("walfold_projection_paused{{subscriber=\"{subscriber}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_on_a_second_target_fold_exactly_through_its_outage_crashes_and_a_rebuild() {
    let second: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("second cluster"),
    ));
    let db = TestDb::new("targets");
    let reporting = TestDb::on(second, "reporting");
    let port = free_port();
    let config = db.config(&format!(
        r#"
[metrics]
listen = "127.0.0.1:{port}"

[retention]
prune_interval_s = 0
event_log = "1s"

[targets.reporting]
url = "{}"
{REPORTING}"#,
        reporting.url()
    ));
    let path = walfold_tests::write_config(&config);
    let (code, out, err) = walfold(&["migrate", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("on target reporting is up to date"), "{out}");
    let mut d = Daemon::start(&config, &[]);
    d.assert_failpoints_compiled();
    let main = db.client().await;
    slot_active(&main).await;
    let rep_subscribers = ["reporting.total.v1", "reporting.state.v1"];

    // (a) The second target folds what the main target folds.
    let mut expected = write_events(db.url(), 60, 10, 12, Duration::from_millis(5), 3).await;
    caught_up(&main, expected.distinct(), 3).await;
    {
        let rep = reporting.client().await;
        reporting_caught_up(&main, &rep, expected.distinct(), &rep_subscribers).await;
        expected.check(&main).await;
        check_reporting(&expected, &main, &rep).await;
    }
    eventually(
        Duration::from_secs(20),
        "the metrics to show the second target's subscribers caught up",
        || async {
            let (_, body) = http_get(port, "/metrics");
            body.contains("walfold_subscriber_lag_events{subscriber=\"reporting.total.v1\"} 0")
        },
    )
    .await;
    let (code, out, err) = walfold(&["status", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("target reporting: reachable"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("reporting.total.v1") && l.trim_end().ends_with("reporting")),
        "each subscriber names its target:\n{out}"
    );

    let (code, out, err) = walfold(
        &[
            "events",
            "--subscriber",
            "reporting.state.v1",
            "--aggregate",
            "o-1",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let outcomes: Vec<String> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["subscriber"]["outcome"].as_str().unwrap_or("").to_owned()
        })
        .collect();
    assert!(!outcomes.is_empty(), "{out}");
    assert!(
        outcomes.iter().all(|o| o == "applied" || o == "stale"),
        "what the second target's subscriber did is read there: {outcomes:?}"
    );

    // (b) The second target stops mid-stream: its projections pause, the main target's
    // go on; once it is back they catch up exactly.
    let writer = tokio::spawn(write_events(
        db.url(),
        180,
        5,
        12,
        Duration::from_millis(40),
        5,
    ));
    tokio::time::sleep(Duration::from_millis(800)).await;
    second.stop("fast").expect("stop the second cluster");
    eventually(
        Duration::from_secs(30),
        "the second target's projections to show as paused",
        || async { paused_gauge(port, "reporting.total.v1").is_some_and(|n| n > 0) },
    )
    .await;
    let (code, why) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{why}");
    // status still shows what it can and exits 1, naming the target it could not reach.
    let (code, out, err) = walfold(&["status", "--json", "-c", d.config_path()], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unreachable: target reporting"), "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    let targets = s["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 1, "{out}");
    assert_eq!(targets[0]["name"], "reporting");
    assert_eq!(targets[0]["reachable"], false, "{out}");
    let more = writer.await.unwrap();
    merge(&mut expected, more);
    // Meanwhile the main target's projections have folded everything.
    caught_up(&main, expected.distinct(), 3).await;
    expected.check(&main).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        paused_gauge(port, "reporting.total.v1").is_some_and(|n| n > 0),
        "still paused while the target is down"
    );
    second
        .start_again()
        .expect("start the second cluster again");
    {
        let rep = reporting.client().await;
        reporting_caught_up(&main, &rep, expected.distinct(), &rep_subscribers).await;
        check_reporting(&expected, &main, &rep).await;
    }
    eventually(Duration::from_secs(30), "the pause to end", || async {
        paused_gauge(port, "reporting.total.v1") == Some(0)
            && paused_gauge(port, "reporting.state.v1") == Some(0)
    })
    .await;
    let log = d.log_text();
    assert!(
        log.contains("target unreachable") || log.contains("projection paused"),
        "the pause is logged:\n{log}"
    );

    // (b2) A read model on the second target loses a column: an error of that target's
    // environment. Only that projection pauses, recorded there and shown with its
    // target; putting the column back resumes it.
    let writer = tokio::spawn(write_events(
        db.url(),
        60,
        5,
        12,
        Duration::from_millis(20),
        13,
    ));
    reporting.psql("alter table order_state drop column amount");
    eventually(
        Duration::from_secs(30),
        "reporting_state to pause on its target",
        || async {
            let (_, out, _) = walfold(&["status", "--json", "-c", d.config_path()], &[]);
            serde_json::from_str::<serde_json::Value>(&out)
                .ok()
                .and_then(|s| {
                    s["subscribers"].as_array().and_then(|subs| {
                        subs.iter()
                            .find(|x| x["subscriber"] == "reporting.state.v1")
                            .map(|x| {
                                x["target"] == "reporting" && x["paused"]["sqlstate"] == "42703"
                            })
                    })
                })
                .unwrap_or(false)
        },
    )
    .await;
    let (_, out, _) = walfold(&["status", "-c", d.config_path()], &[]);
    assert!(
        out.contains("PAUSED reporting.state.v1 on target reporting"),
        "{out}"
    );
    assert!(
        paused_gauge(port, "reporting.total.v1") == Some(0),
        "the other projection on that target goes on"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    reporting.psql("alter table order_state add column amount numeric");
    let more = writer.await.unwrap();
    merge(&mut expected, more);
    caught_up(&main, expected.distinct(), 3).await;
    {
        let rep = reporting.client().await;
        reporting_caught_up(&main, &rep, expected.distinct(), &rep_subscribers).await;
        check_reporting(&expected, &main, &rep).await;
    }

    // (c) SIGKILLs of the daemon while events stream.
    let writer = tokio::spawn(write_events(
        db.url(),
        200,
        5,
        12,
        Duration::from_millis(15),
        7,
    ));
    let mut rng = Rng::from_time();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400 + rng.below(1200))).await;
        d.kill_and_restart(None);
    }
    let more = writer.await.unwrap();
    merge(&mut expected, more);
    caught_up(&main, expected.distinct(), 3).await;
    expected.check(&main).await;
    {
        let rep = reporting.client().await;
        reporting_caught_up(&main, &rep, expected.distinct(), &rep_subscribers).await;
        check_reporting(&expected, &main, &rep).await;
    }

    // (d) A rebuild of the second target's projection under a new subscriber ID, while
    // events stream: it replays the main log on the second target and switches there.
    // An ID the main target's projection uses is refused, as on its own target (a
    // stranger's rebuild took one, and the two targets' metrics merged).
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "reporting_total",
            "--subscriber",
            "orders.state.v1",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("has been used before"), "{err}");
    let writer = tokio::spawn(write_events(
        db.url(),
        60,
        5,
        12,
        Duration::from_millis(20),
        11,
    ));
    let (code, out, err) = walfold(
        &[
            "rebuild",
            "reporting_total",
            "--subscriber",
            "reporting.total.v2",
            "--wait",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("switched over"), "{out}\n{err}");
    let more = writer.await.unwrap();
    merge(&mut expected, more);
    caught_up(&main, expected.distinct(), 3).await;
    let rep = reporting.client().await;
    reporting_caught_up(
        &main,
        &rep,
        expected.distinct(),
        &["reporting.total.v2", "reporting.state.v1"],
    )
    .await;
    check_reporting(&expected, &main, &rep).await;
    assert_eq!(
        count(
            &rep,
            "select count(*) from walfold.projection where name = 'reporting_total' \
             and subscriber_id = 'reporting.total.v2'"
        )
        .await,
        1,
        "the second target records the new subscriber"
    );
    assert_eq!(
        count(
            &rep,
            "select count(*) from walfold.rebuild where state = 'switched'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&main, "select count(*) from walfold.rebuild").await,
        0,
        "the rebuild is the second target's, not the main one's"
    );
    drop(rep);

    // (e) Pruning waits for every target: with the second target down, nothing of the
    // log goes; once it is back and has read everything, all but the head goes, and the
    // second target's expired claims with it.
    second.stop("fast").expect("stop the second cluster");
    let in_log = count(&main, "select count(*) from walfold.event_log").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (code, out, err) = walfold(&["prune", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("cannot prune on target reporting"),
        "{out}\n{err}"
    );
    assert_eq!(
        count(&main, "select count(*) from walfold.event_log").await,
        in_log,
        "the log keeps everything while a target cannot say what it has passed"
    );
    second
        .start_again()
        .expect("start the second cluster again");
    let rep = reporting.client().await;
    reporting_caught_up(
        &main,
        &rep,
        expected.distinct(),
        &["reporting.total.v2", "reporting.state.v1"],
    )
    .await;
    let (code, out, err) = walfold(&["prune", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        count(&main, "select count(*) from walfold.event_log").await,
        1,
        "every subscriber on every target has passed all but the head: {out}"
    );
    assert_eq!(
        count(
            &rep,
            "select count(*) from walfold.processed_message where subscriber_id = 'reporting.state.v1'"
        )
        .await,
        0,
        "the second target's claims past dedup_retention are pruned there"
    );
    assert!(
        count(
            &rep,
            "select count(*) from walfold.processed_message where subscriber_id = 'reporting.total.v2'"
        )
        .await
            > 0,
        "claims kept forever stay"
    );

    // (f) Dead letters on both targets: listed with their target, discarded by target.
    db.psql(&walfold_tests::insert_event(
        "7d5c4c1e-8a8f-4d3e-9d55-3c1c2f1a0b01",
        "o-bad",
        "OrderChanged",
        1,
        r#"{"status": "v1", "amount": "not a number"}"#,
    ));
    eventually(
        Duration::from_secs(60),
        "the bad event to be dead-lettered on both targets",
        || async {
            count(
                &rep,
                "select count(*) from walfold.dead_letter where status = 'open'",
            )
            .await
                == 2
                && count(
                    &main,
                    "select count(*) from walfold.dead_letter where status = 'open' and subscriber_id is not null",
                )
                .await
                    == 3
        },
    )
    .await;
    let (code, out, err) = walfold(&["dead-letters", "list", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.lines().next().unwrap_or("").contains("target"), "{out}");
    let on_reporting: Vec<&str> = out
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("reporting"))
        .collect();
    assert_eq!(on_reporting.len(), 2, "{out}");
    let (code, out, err) = walfold(
        &["dead-letters", "list", "--json", "-c", d.config_path()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let letters: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<String> = letters
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["target"] == "reporting")
        .map(|l| l["id"].to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{out}");
    for id in &ids {
        let (code, out, err) = walfold(
            &[
                "dead-letters",
                "discard",
                id,
                "--target",
                "reporting",
                "--reason",
                "test",
                "-c",
                d.config_path(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{out}\n{err}");
    }
    assert_eq!(
        count(
            &rep,
            "select count(*) from walfold.dead_letter where status = 'open'"
        )
        .await,
        0
    );
    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "discard",
            "1",
            "--target",
            "nowhere",
            "--reason",
            "x",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the targets are: main, reporting"), "{err}");
    let (code, out, err) = walfold(&["doctor", "-c", d.config_path()], &[]);
    assert!(
        out.contains("target reporting reachable"),
        "{code}\n{out}\n{err}"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// The fence on an extra target: a leader takes it over by waiting for the previous
/// leader's in-flight transaction there (which lands, before any write of the new
/// one), and from then on every transaction of the previous leader there fails, as
/// does its attempt to take the target over again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write_on_an_extra_target_after_the_new_one_took_it_over() {
    use walfold_store::{Leadership, Schema, StoreError};
    let main = TestDb::new("fence_main");
    let extra = TestDb::new("fence_extra");
    for url in [main.url(), extra.url()] {
        walfold_store::migrate(&url, &Schema::new("walfold"))
            .await
            .unwrap();
    }
    let control_a = main.client().await;
    let a = Leadership::take_over(&control_a, &Schema::new("walfold"), uuid::Uuid::new_v4())
        .await
        .unwrap();
    let a_main = a.fence();
    let a_lease = a_main
        .extend_to(&extra.url(), &Schema::new("walfold"), None)
        .await
        .unwrap();
    let a_extra = a_lease.fence();
    let mut a_client = extra.client().await;
    // A's transaction on the extra target, in flight when A is deposed.
    let tx = a_client.transaction().await.unwrap();
    a_extra.check(&tx).await.unwrap();
    tx.batch_execute("insert into ledger values (gen_random_uuid(), 'before', 1)")
        .await
        .unwrap();
    // A is gone from the main target; B leads there.
    drop(a);
    let control_b = main.client().await;
    let b = Leadership::take_over(&control_b, &Schema::new("walfold"), uuid::Uuid::new_v4())
        .await
        .unwrap();
    assert!(b.fence().epoch() > a_main.epoch());
    let takeover = {
        let (fence, url) = (b.fence(), extra.url());
        tokio::spawn(async move { fence.extend_to(&url, &Schema::new("walfold"), None).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !takeover.is_finished(),
        "the takeover waits for the previous leader's in-flight transaction"
    );
    tx.commit()
        .await
        .expect("A's transaction lands before B writes there");
    let b_lease = takeover.await.unwrap().unwrap();
    // Every later transaction of A on the extra target fails.
    let tx = a_client.transaction().await.unwrap();
    assert!(matches!(a_extra.check(&tx).await, Err(StoreError::Fenced)));
    drop(tx);
    // And A cannot take the target over again: a newer leader has written there.
    assert!(matches!(
        a_main
            .extend_to(&extra.url(), &Schema::new("walfold"), None)
            .await,
        Err(StoreError::Fenced)
    ));
    // B's transactions pass.
    let mut b_client = extra.client().await;
    let tx = b_client.transaction().await.unwrap();
    b_lease.fence().check(&tx).await.unwrap();
    tx.batch_execute("insert into ledger values (gen_random_uuid(), 'after', 1)")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(&extra.client().await, "select count(*) from ledger").await,
        2
    );
    // B taking the target over again (a reconnect) needs no wait and keeps its epoch.
    let again = b
        .fence()
        .extend_to(&extra.url(), &Schema::new("walfold"), None)
        .await
        .unwrap();
    let tx = b_client.transaction().await.unwrap();
    again.fence().check(&tx).await.unwrap();
}

/// Rows of `sql` on `client`, as text, sorted.
async fn rows(client: &Client, sql: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = client
        .query(sql, &[])
        .await
        .map(|rs| rs.iter().map(|r| (r.get(0), r.get(1))).collect())
        .unwrap_or_default();
    rows.sort();
    rows
}

/// The real daemons: leader A's heartbeats stall for 8 s, and its projector holds every
/// transaction open before its fence check (failpoints); B finds it dead, takes over, takes the extra target over and switches a
/// rebuild there while events stream. A's sessions are ended before its work moves,
/// and the extra target's sum equals the fold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_an_extra_target_over_from_a_deposed_daemon() {
    let db = TestDb::new("deposed_main");
    let extra = TestDb::new("deposed_extra");
    let config = |name: &str| {
        ConfigBuilder::new(&db.url())
            .outbox_table("public.outbox")
            .set("target", "url", format!("{}?application_name={name}", db.url()))
            .set(
                "targets.extra",
                "url",
                format!("{}?application_name={name}", extra.url()),
            )
            .set("pipeline", "max_backoff_ms", 500)
            .set("retention", "prune_interval_s", 0)
            .set("cluster", "lease_s", 3)
            .text(
                r#"
[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
database = "extra"
target = "public.order_total"
batch_size = 10
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#,
            )
            .to_toml()
    };
    // A's projector holds each transaction open for 1.5 s before its fence check, so
    // one is in flight on the extra target when B takes it over.
    let a = Daemon::start(
        &config("walfold-a"),
        &[(
            "WALFOLD_FAILPOINTS",
            "leader_heartbeat=sleep:8000,projector_commit=sleep:1500",
        )],
    );
    a.assert_failpoints_compiled();
    let main = db.client().await;
    slot_active(&main).await;
    let b = Daemon::start(&config("walfold-b"), &[]);
    eventually(Duration::from_secs(30), "B to join", || {
        let joined = b.log_text().contains("instance started");
        async move { joined }
    })
    .await;
    let writer = {
        let url = db.url();
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            for i in 0..120 {
                c.batch_execute(&format!(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     values (gen_random_uuid(), 'order', 'o-{}', 'OrderPaid', {}, '{{\"amount\": \"{i}\"}}')",
                    i % 5 + 1,
                    1000 + i
                ))
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A's heartbeats stall for 8 s (the failpoint) while its work goes on: B finds it
    // dead after its 3 s lease, ends its sessions and leads.
    eventually(
        Duration::from_secs(30),
        "B to lead on the extra target",
        || {
            let leads = b.log_text().contains("leading on an extra target");
            async move { leads }
        },
    )
    .await;
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "order_total",
            "--subscriber",
            "orders.total.v2",
            "-c",
            b.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let ext = extra.client().await;
    eventually(Duration::from_secs(60), "B's switch-over", || async {
        count(
            &ext,
            "select count(*) from walfold.rebuild where subscriber_id = 'orders.total.v2' \
             and state = 'switched'",
        )
        .await
            == 1
    })
    .await;
    writer.await.unwrap();
    let fold = "select aggregate_id, sum((payload->>'amount')::numeric)::text \
                from (select distinct on (id) * from outbox) o group by aggregate_id";
    let totals = "select order_id, total::text from order_total";
    eventually(
        Duration::from_secs(60),
        "the extra target's sums to equal the fold",
        || async { rows(&main, fold).await == rows(&ext, totals).await },
    )
    .await;
    // And they stay equal: nothing of A's lands later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rows(&main, fold).await, rows(&ext, totals).await);
    // B ended the sessions of the stalled A before taking its work over: A's open
    // transactions there could not land.
    assert!(
        b.log_text().contains("ended the sessions of"),
        "B did not end the stalled instance's sessions:\n{}",
        b.log_text()
    );
    assert!(
        b.log_text().contains("rebuild switched over"),
        "{}",
        b.log_text()
    );
}

/// Found by a stranger: an extra target taken out of the config (its projections with
/// it) while it holds state keeps holding the event log where it last did, so a prune
/// never deletes what its projections have not read, and putting it back folds
/// everything.
const REMOVED_TARGET: &str = r#"
[[projection]]
name = "reporting_total"
subscriber = "reporting.total.v1"
database = "reporting"
target = "public.order_total"
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#;

async fn sum(c: &tokio_postgres::Client) -> i64 {
    count(
        c,
        "select coalesce((sum(total) * 100)::int8, 0) from order_total",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_taken_out_of_the_config_still_holds_the_log_for_its_projections() {
    let second: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("second cluster"),
    ));
    let db = TestDb::new("stranger2");
    let reporting = TestDb::on(second, "reporting");
    let common = "[retention]\nprune_interval_s = 0\nevent_log = \"1s\"\n";
    let full = db.config(&format!(
        "{common}\n[targets.reporting]\nurl = \"{}\"\n{REMOVED_TARGET}",
        reporting.url()
    ));
    let without = db.config(common);

    // 1. Both targets fold the first batch.
    let mut d = Daemon::start(&full, &[]);
    let main = db.client().await;
    slot_active(&main).await;
    let rep = reporting.client().await;
    let first = write_events(db.url(), 20, 5, 8, Duration::from_millis(5), 3).await;
    caught_up(&main, first.distinct(), 3).await;
    eventually(
        Duration::from_secs(60),
        "reporting to fold the first batch",
        || async { sum(&rep).await == first.total_cents() },
    )
    .await;
    d.terminate(Duration::from_secs(20));

    // 2. The operator takes the reporting target out of the config for a while.
    let mut d = Daemon::start(&without, &[]);
    slot_active(&main).await;
    let second_batch = write_events(db.url(), 20, 5, 8, Duration::from_millis(5), 7).await;
    let mut all = first;
    all.rows_written += second_batch.rows_written;
    all.events.extend(second_batch.events);
    caught_up(&main, all.distinct(), 3).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let path = walfold_tests::write_config(&without);
    let (code, out, err) = walfold(&["prune", "-c", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("target reporting is no longer in the config"),
        "prune says what holds the log: {out}{err}"
    );
    d.terminate(Duration::from_secs(20));

    // 3. It is put back: its projection folds every event, the pruned-meanwhile ones too.
    let _d = Daemon::start(&full, &[]);
    slot_active(&main).await;
    eventually(
        Duration::from_secs(60),
        "reporting to fold both batches",
        || async { sum(&rep).await == all.total_cents() },
    )
    .await;
}

/// Found by a stranger: a projection moved from an extra target back to the main one
/// leaves its old checkpoints behind; they fall behind by design and must not make
/// `/readyz` fail (readiness is about the (target, subscriber) that serves now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_moved_off_a_target_leaves_readiness_to_where_it_serves() {
    let second: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("second cluster"),
    ));
    let db = TestDb::new("moved");
    let reporting = TestDb::on(second, "reporting");
    let port = free_port();
    let common = format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\nready_max_lag_s = 1\n\n\
         [targets.reporting]\nurl = \"{}\"\n",
        reporting.url()
    );
    let on_reporting = db.config(&common).replace(
        "parallelism = 2\n",
        "parallelism = 2\ndatabase = \"reporting\"\n",
    );
    let mut d = Daemon::start(&on_reporting, &[]);
    let main = db.client().await;
    slot_active(&main).await;
    let first = write_events(db.url(), 10, 5, 8, Duration::from_millis(5), 3).await;
    let rep = reporting.client().await;
    reporting_caught_up(&main, &rep, first.distinct(), &["orders.total.v1"]).await;
    d.terminate(Duration::from_secs(20));

    // Moved to the main target: it starts there afresh; its checkpoints on reporting stay.
    let _d = Daemon::start(&db.config(&common), &[]);
    slot_active(&main).await;
    let more = write_events(db.url(), 10, 5, 8, Duration::from_millis(5), 9).await;
    caught_up(&main, first.distinct() + more.distinct(), 3).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    eventually(
        Duration::from_secs(30),
        "the daemon to be ready",
        || async { http_get(port, "/readyz").0 == 200 },
    )
    .await;
}

/// Claims on a second target are keyed by the main log's seqs (issue 28): an event
/// delivered again after pruning deleted it from the log carries its first delivery's
/// claim seq, which the second target's kept claim meets: a duplicate there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_delivered_again_after_pruning_is_a_duplicate_on_a_second_target() {
    let second: &'static Cluster = Box::leak(Box::new(
        Cluster::start(Options::default()).expect("second cluster"),
    ));
    let db = TestDb::new("claimseq2");
    let reporting = TestDb::on(second, "reporting");
    let text = db.config(&format!(
        "[retention]\nprune_interval_s = 0\nevent_log = \"1s\"\n\n[targets.reporting]\nurl = \"{}\"\n{REMOVED_TARGET}",
        reporting.url()
    ));
    let d = Daemon::start(&text, &[]);
    let main = db.client().await;
    slot_active(&main).await;
    let rep = reporting.client().await;
    let insert = |id: &str, amount: &str| {
        let payload = format!(r#"{{"amount": "{amount}"}}"#);
        db.psql(&walfold_tests::insert_event(
            id,
            "o-1",
            "OrderChanged",
            1,
            &payload,
        ))
    };
    let old = "00000000-0000-4000-8000-0000000000b1";
    insert(old, "10");
    eventually(
        Duration::from_secs(60),
        "the old event on reporting",
        || async { sum(&rep).await == 1000 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    insert("00000000-0000-4000-8000-0000000000b2", "5");
    eventually(
        Duration::from_secs(60),
        "the recent event on reporting",
        || async { sum(&rep).await == 1500 },
    )
    .await;
    reporting_caught_up(&main, &rep, 2, &["reporting.total.v1"]).await;
    let (code, out, err) = walfold(&["prune", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        count(
            &main,
            &format!("select count(*) from walfold.event_log where event_id = '{old}'")
        )
        .await,
        0,
        "the old event left the log: {out}"
    );

    insert(old, "10");
    eventually(
        Duration::from_secs(60),
        "the redelivery in the log",
        || async {
            count(
                &main,
                &format!("select count(*) from walfold.event_log where event_id = '{old}'"),
            )
            .await
                == 1
        },
    )
    .await;
    reporting_caught_up(&main, &rep, 2, &["reporting.total.v1"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        sum(&rep).await,
        1500,
        "the second target's kept claim met it"
    );
    assert!(
        count(
            &rep,
            "select coalesce(sum(duplicates), 0)::int8 from walfold.checkpoint \
             where subscriber_id = 'reporting.total.v1'"
        )
        .await
            >= 1
    );
}
