//! Read your own writes (issue 41): an application commits on the source, reads
//! `pg_current_wal_lsn()`, waits for a projection through `walfold.wait_for` (SQL) or
//! `GET /wait` (HTTP), then reads the read model, and finds its write every time, under
//! background load, through a rebuild's switch-over; a paused projection answers why at
//! once, a wait past its timeout says so, a position from the future is an error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use walfold_tests::{count, eventually, free_port, http_get, walfold, Daemon, TestDb};

/// A state projection and a running total (two partitions) that a rebuild can replace.
const PROJECTIONS: &str = r#"
[[projection]]
name = "order_state"
subscriber = "orders.state.v1"
table = "public.order_state"
key = "order_id"
version_column = "version"
columns = { status = ":payload.status", amount = ":payload.amount::numeric" }

[[projection]]
name = "order_total"
subscriber = "orders.total.v1"
target = "public.order_total"
parallelism = 2
sql = """
insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#;

/// The config with [`PROJECTIONS`] and the listener on `port`.
fn config(db: &TestDb, port: u16) -> String {
    walfold_tests::config_builder(&db.url())
        .set("retention", "prune_interval_s", 0)
        .text(PROJECTIONS)
        .text(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"))
        .to_toml()
}

/// Writes small transactions of background events on their own aggregates until `stop`.
fn background(db: &TestDb, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let url = db.url();
    tokio::spawn(async move {
        let client = walfold_pg::connect(&url).await.expect("connect");
        let mut written = 0u64;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            client
                .batch_execute(&format!(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     select gen_random_uuid(), 'order', 'bg-' || ({n} * 10 + g), 'OrderPaid', 1, \
                     '{{\"status\": \"paid\", \"amount\": \"1\"}}' from generate_series(1, 10) g"
                ))
                .await
                .expect("background insert");
            written += 10;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        written
    })
}

/// Commits one event of a new aggregate `id` with `amount` and returns the source's WAL
/// position read right after the commit.
async fn commit(client: &tokio_postgres::Client, id: &str, amount: i64) -> String {
    client
        .execute(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values (gen_random_uuid(), 'order', $1, 'OrderPlaced', 1, \
             jsonb_build_object('status', 'placed', 'amount', $2::text))",
            &[&id, &amount.to_string()],
        )
        .await
        .expect("commit");
    client
        .query_one("select pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0)
}

/// `walfold.wait_for` over SQL: (status, reason).
async fn wait_sql(
    client: &tokio_postgres::Client,
    projection: &str,
    lsn: &str,
    timeout_ms: u64,
) -> Result<(String, Option<String>), String> {
    let row = client
        .query_one(
            "select status, reason from walfold.wait_for($1, $2::text::pg_lsn, make_interval(secs => $3))",
            &[&projection, &lsn, &(timeout_ms as f64 / 1000.0)],
        )
        .await
        .map_err(|e| walfold_pg::describe(&e))?;
    Ok((row.get(0), row.get(1)))
}

/// `GET /wait`: (HTTP status, JSON body).
async fn wait_http(
    port: u16,
    projection: &str,
    lsn: &str,
    timeout_ms: u64,
) -> (u16, serde_json::Value) {
    let path = format!("/wait?projection={projection}&lsn={lsn}&timeout_ms={timeout_ms}");
    let (code, body) = tokio::task::spawn_blocking(move || http_get(port, &path))
        .await
        .unwrap();
    let json = serde_json::from_str(body.trim()).unwrap_or(serde_json::Value::String(body));
    (code, json)
}

/// Waits until the listener answers.
async fn listening(port: u16) {
    eventually(Duration::from_secs(30), "the listener", || async move {
        tokio::task::spawn_blocking(move || http_get(port, "/healthz").0 == 200)
            .await
            .unwrap()
    })
    .await;
}

/// 200 rounds under background load: 100 through SQL on the state projection, 100 over
/// HTTP on the two-partition total. Every read after a folded answer finds the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_after_a_wait_finds_the_write_under_load() {
    let db = TestDb::new("ryw");
    let port = free_port();
    let (_d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    listening(port).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = background(&db, stop.clone());
    let mut misses = 0;
    let mut waited = Vec::new();
    let started = Instant::now();
    for i in 0..200 {
        let id = format!("ryw-{i}");
        let lsn = commit(&client, &id, i + 1).await;
        let t = Instant::now();
        if i % 2 == 0 {
            let (status, reason) = wait_sql(&client, "order_state", &lsn, 10_000)
                .await
                .unwrap();
            assert_eq!(status, "folded", "{reason:?}");
            waited.push(t.elapsed());
            let seen = count(
                &client,
                &format!("select count(*) from order_state where order_id = '{id}'"),
            )
            .await;
            misses += 1 - seen;
        } else {
            let (code, body) = wait_http(port, "order_total", &lsn, 10_000).await;
            assert_eq!(code, 200, "{body}");
            assert_eq!(body["status"], "folded", "{body}");
            assert_eq!(body["subscriber"], "orders.total.v1", "{body}");
            waited.push(t.elapsed());
            let total = count(
                &client,
                &format!(
                    "select coalesce(sum(total), 0)::int8 from order_total where order_id = '{id}'"
                ),
            )
            .await;
            misses += i64::from(total != i + 1);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let background = load.await.unwrap();
    waited.sort();
    eprintln!(
        "200 rounds in {:?} beside {background} background events: wait p50 {:?} p99 {:?}",
        started.elapsed(),
        waited[100],
        waited[197]
    );
    assert!(background > 0);
    assert_eq!(misses, 0, "reads that missed their own write");

    // Freshness for everyone else: the status and the metrics say how far each
    // projection has folded the source, and how old its newest folded commit is.
    let last = commit(&client, "ryw-last", 1).await;
    assert_eq!(
        wait_sql(&client, "order_state", &last, 10_000)
            .await
            .unwrap()
            .0,
        "folded"
    );
    let status = walfold_tests::status(&client).await.expect("status");
    let state = status
        .subscribers
        .iter()
        .find(|s| s.subscriber == "orders.state.v1")
        .expect("orders.state.v1");
    let folded = &state.folded[0];
    assert_eq!(folded.source, "default", "{folded:?}");
    let at_least: bool = client
        .query_one(
            "select $1::text::pg_lsn >= $2::text::pg_lsn",
            &[&folded.lsn, &last],
        )
        .await
        .unwrap()
        .get(0);
    assert!(at_least, "{folded:?} covers {last}");
    assert!(
        folded.newest_commit_age_s.is_some_and(|a| a < 60.0),
        "{folded:?}"
    );
    let metrics = tokio::task::spawn_blocking(move || http_get(port, "/metrics").1)
        .await
        .unwrap();
    for series in [
        r#"walfold_projection_folded_lsn{projection="order_state",subscriber="orders.state.v1",source="default"}"#,
        r#"walfold_projection_folded_age_seconds{projection="order_total",subscriber="orders.total.v1",source="default"}"#,
    ] {
        assert!(metrics.contains(series), "no {series} in\n{metrics}");
    }
}

/// A paused projection answers with why at once (not at its timeout), over SQL and HTTP;
/// once the cause is fixed the same wait is folded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_paused_projection_says_why_at_once() {
    let db = TestDb::new("rywpause");
    let port = free_port();
    let (_d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    listening(port).await;
    let lsn = commit(&client, "p-0", 1).await;
    assert_eq!(
        wait_sql(&client, "order_state", &lsn, 10_000)
            .await
            .unwrap()
            .0,
        "folded"
    );

    db.psql("alter table order_state rename to order_state_away");
    let lsn = commit(&client, "p-1", 1).await;
    // The partition pauses at its first try; from then on the answer is immediate.
    eventually(Duration::from_secs(30), "the pause", || async {
        count(&client, "select count(*) from walfold.projection_pause").await > 0
    })
    .await;
    let t = Instant::now();
    let (status, reason) = wait_sql(&client, "order_state", &lsn, 10_000)
        .await
        .unwrap();
    assert_eq!(status, "paused", "{reason:?}");
    assert!(
        reason.as_deref().unwrap_or("").contains("order_state"),
        "{reason:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "answered at once: {:?}",
        t.elapsed()
    );
    let (code, body) = wait_http(port, "order_state", &lsn, 10_000).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["status"], "paused", "{body}");
    // The other projection is not held by it.
    assert_eq!(
        wait_sql(&client, "order_total", &lsn, 10_000)
            .await
            .unwrap()
            .0,
        "folded"
    );

    // Fixed: the answer is "paused" until the partition's next try resumes it, then
    // "folded".
    db.psql("alter table order_state_away rename to order_state");
    eventually(Duration::from_secs(30), "the wait to be folded", || async {
        wait_sql(&client, "order_state", &lsn, 1_000)
            .await
            .unwrap()
            .0
            == "folded"
    })
    .await;
    assert_eq!(
        count(
            &client,
            "select count(*) from order_state where order_id = 'p-1'"
        )
        .await,
        1
    );
}

/// A wait that nothing can satisfy in time answers timeout after its timeout (SQL) and
/// 504 (HTTP); a position past the source's WAL and an unknown projection are errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_its_timeout_says_so_and_a_future_position_is_an_error() {
    let db = TestDb::new("rywtimeout");
    let port = free_port();
    let (mut d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    listening(port).await;
    let lsn = commit(&client, "t-0", 1).await;
    assert_eq!(
        wait_sql(&client, "order_state", &lsn, 10_000)
            .await
            .unwrap()
            .0,
        "folded"
    );

    // Far past the source's WAL: an error, not a wait (once walfold has read the
    // source's position after the call began: within about a second).
    let future: String = client
        .query_one("select (pg_current_wal_lsn() + 1e9)::text", &[])
        .await
        .unwrap()
        .get(0);
    let t = Instant::now();
    let e = wait_sql(&client, "order_state", &future, 10_000)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("past the WAL"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let (code, body) = wait_http(port, "order_state", &future, 10_000).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = wait_http(port, "no_such", &lsn, 100).await;
    assert_eq!(code, 404, "{body}");
    let e = wait_sql(&client, "no_such", &lsn, 100).await.unwrap_err();
    assert!(e.to_string().contains("no projection named no_such"), "{e}");

    // walfold stopped: the commit is never read, the wait ends at its timeout.
    d.kill();
    let lsn = commit(&client, "t-1", 1).await;
    let t = Instant::now();
    let (status, reason) = wait_sql(&client, "order_state", &lsn, 300).await.unwrap();
    assert_eq!(status, "timeout", "{reason:?}");
    assert!(reason.unwrap_or_default().contains("ingest has read"));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // Started again, it reads the commit and the same wait is folded.
    d.kill_and_restart(None);
    listening(port).await;
    let (code, body) = wait_http(port, "order_state", &lsn, 15_000).await;
    assert_eq!(code, 200, "{body}");
}

/// Commit-and-wait rounds on the rebuilt projection keep finding their writes while a
/// rebuild replays, switches over and serves under its new subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_follows_a_rebuild_through_its_switch_over() {
    let db = TestDb::new("rywrebuild");
    let port = free_port();
    let (d, client) = Daemon::streaming(&db, &config(&db, port)).await;
    listening(port).await;
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         select gen_random_uuid(), 'order', 'pre-' || (g % 500), 'OrderPaid', g / 500 + 1, \
         '{\"amount\": \"1\"}' from generate_series(0, 29999) g",
    );
    let lsn = commit(&client, "r-warm", 1).await;
    assert_eq!(
        wait_sql(&client, "order_total", &lsn, 30_000)
            .await
            .unwrap()
            .0,
        "folded"
    );
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "order_total",
            "--subscriber",
            "orders.total.v2",
            "-c",
            d.config_path(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let state = || async {
        client
            .query_opt(
                "select state from walfold.rebuild where subscriber_id = 'orders.total.v2'",
                &[],
            )
            .await
            .unwrap()
            .map_or_else(|| "-".to_owned(), |r| r.get(0))
    };
    let mut misses = 0;
    let mut subscribers = std::collections::BTreeSet::new();
    let mut after_switch = 0;
    let start = Instant::now();
    let mut i = 0;
    while after_switch < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no switch-over in 90 s"
        );
        i += 1;
        let id = format!("r-{i}");
        let lsn = commit(&client, &id, i).await;
        let (code, body) = if i % 2 == 0 {
            wait_http(port, "order_total", &lsn, 15_000).await
        } else {
            let (status, reason) = wait_sql(&client, "order_total", &lsn, 15_000)
                .await
                .unwrap();
            let sub: String = client
                .query_one(
                    "select subscriber_id from walfold.projection where name = 'order_total'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (
                if status == "folded" { 200 } else { 0 },
                serde_json::json!({"status": status, "reason": reason, "subscriber": sub}),
            )
        };
        assert_eq!(code, 200, "{body}");
        subscribers.insert(body["subscriber"].as_str().unwrap_or("").to_owned());
        let total = count(
            &client,
            &format!(
                "select coalesce(sum(total), 0)::int8 from order_total where order_id = '{id}'"
            ),
        )
        .await;
        misses += i64::from(total != i);
        if state().await == "switched" {
            after_switch += 1;
        }
    }
    eprintln!("{i} rounds through the rebuild, subscribers {subscribers:?}");
    assert!(
        subscribers.contains("orders.total.v1") && subscribers.contains("orders.total.v2"),
        "answered by the live subscriber before the switch-over and the new one after: {subscribers:?}"
    );
    assert_eq!(misses, 0, "reads that missed their own write");
}
