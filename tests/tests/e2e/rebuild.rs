//! Rebuilds, backfill, retention and dead-letter retries, with the real `walfold` binary
//! against a throwaway PostgreSQL. Expected read models are computed in SQL straight
//! from the event log or the outbox, never by walfold's own projection code.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{count, difference, eventually, walfold, Daemon, TestDb};

/// A state projection and a running total whose `sql` names `{table}`.
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

/// The suites' config with [`PROJECTIONS`], pruning left to the `prune` command.
fn builder(db: &TestDb) -> ConfigBuilder {
    walfold_tests::config_builder(&db.url())
        .set("retention", "prune_interval_s", 0)
        .text(PROJECTIONS)
}

/// [`builder`]'s config, then `extra`.
fn config(db: &TestDb, extra: &str) -> String {
    builder(db).text(extra).to_toml()
}

/// `n` events over `orders` aggregates in transactions of 10k rows, versions 1.. per order.
fn preload(db: &TestDb, n: i64, orders: i64) {
    let mut done = 0;
    while done < n {
        let k = (n - done).min(10_000);
        db.psql(&format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             select gen_random_uuid(), 'order', 'o-' || (i % {orders}), 'OrderChanged', \
                    i / {orders} + 1, \
                    jsonb_build_object('status', 's' || i, 'amount', (i % 97)::text) \
             from generate_series({from}, {to}) as i",
            from = done,
            to = done + k - 1
        ));
        done += k;
    }
}

/// Waits until every outbox row is in the log and `subscriber` has read all of it (every
/// partition). The outbox rows in these tests have distinct IDs.
async fn subscriber_caught_up(client: &tokio_postgres::Client, subscriber: &str, timeout: u64) {
    let sql = format!(
        "select (select count(*) from outbox) - (select count(*) from walfold.event_log) \
         + (select count(*) from walfold.checkpoint where subscriber_id = '{subscriber}' \
            and position < (select max(seq) from walfold.event_log)) \
         + (select count(*) from (select 1 where not exists \
            (select 1 from walfold.checkpoint where subscriber_id = '{subscriber}')) x)"
    );
    eventually(
        Duration::from_secs(timeout),
        &format!("{subscriber} to catch up"),
        || async { count(client, &sql).await == 0 },
    )
    .await;
}

async fn rebuild_state(client: &tokio_postgres::Client, subscriber: &str) -> String {
    client
        .query_opt(
            "select state from walfold.rebuild where subscriber_id = $1",
            &[&subscriber],
        )
        .await
        .ok()
        .flatten()
        .map_or_else(|| "-".into(), |r| r.get(0))
}

const TOTALS_FROM_LOG: &str = "select aggregate_id, sum((payload->>'amount')::numeric) \
     from walfold.event_log group by aggregate_id";
const STATE_FROM_LOG: &str = "select distinct on (aggregate_id) aggregate_id, \
     payload->>'status', (payload->>'amount')::numeric, version \
     from walfold.event_log order by aggregate_id, version desc";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_replays_100k_events_beside_the_live_table_and_switches_over() {
    let db = TestDb::new("rebuild");
    let (d, client) = projected(&db, &config(&db, ""), 100_000, 2_000, "orders.total.v1").await;
    // The bug the rebuild fixes: a corrupted live row.
    db.psql("update order_total set total = -1 where order_id = 'o-7'");
    let live_rows = count(&client, "select count(*) from order_total").await;
    assert_eq!(live_rows, 2_000);

    // Readers and writers keep going during the rebuild.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicI64::new(0));
    let reader = {
        let (stop, reads, url) = (stop.clone(), reads.clone(), db.url());
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let n = count(&c, "select count(*) from order_total").await;
                assert!(n >= live_rows, "a reader saw {n} rows: a half-built table");
                reads.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let writer = {
        let (stop, url) = (stop.clone(), db.url());
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            let mut written = 0i64;
            while !stop.load(Ordering::Relaxed) {
                c.batch_execute(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     select gen_random_uuid(), 'order', 'n-' || (i % 50), 'OrderChanged', 1000000 + i, \
                            jsonb_build_object('status', 'new', 'amount', '1') \
                     from generate_series(1, 20) as i",
                )
                .await
                .unwrap();
                written += 20;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            written
        })
    };

    let cfg = d.config_path().to_owned();
    let (code, out, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("public.order_total__rebuild"), "{out}");
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v3");
    assert_eq!(
        code, 2,
        "a second rebuild of the same projection is refused"
    );
    assert!(err.contains("already has a rebuild"), "{err}");
    let (code, _, err) = start_rebuild(&cfg, "order_state", "orders.total.v1");
    assert_eq!(code, 2, "a used subscriber ID is refused");
    assert!(err.contains("has been used before"), "{err}");

    // Progress is visible while it replays.
    let (code, out, _) = walfold(&["status", "--json", "-c", &cfg], &[]);
    assert_eq!(code, 0);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["rebuilds"][0]["subscriber"], "orders.total.v2");

    eventually(Duration::from_secs(180), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    // New events keep arriving after the switch, then stop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    reader.await.unwrap();
    let written = writer.await.unwrap();
    assert!(written > 0 && reads.load(Ordering::Relaxed) > 10);
    subscriber_caught_up(&client, "orders.total.v2", 60).await;

    assert_eq!(
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG
        )
        .await,
        0,
        "the rebuilt table equals the sums computed from the log, each event once"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from order_total__retired where order_id = 'o-7' and total = -1"
        )
        .await,
        1,
        "the old table is kept, retired, untouched"
    );
    assert_eq!(
        db.psql("select subscriber_id from walfold.projection where name = 'order_total'"),
        "orders.total.v2"
    );
    // The old subscriber stopped at the switch; nothing else writes the retired table.
    let (code, out, err) = walfold(&["rebuild", "order_total", "--finish", "-c", &cfg], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("subscriber = \"orders.total.v2\""), "{out}");
    assert_eq!(
        db.psql("select to_regclass('order_total__retired') is null"),
        "t"
    );
    assert_eq!(
        db.psql("select count(*) from walfold.processed_message where subscriber_id = 'orders.total.v1'"),
        "0"
    );
    assert_eq!(db.psql("select state from walfold.rebuild"), "finished");
    // A stranger reused the retired ID, its claims gone with --finish: refused, since
    // its dead letters and the rebuild that replaced it still name it.
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v1");
    assert_eq!(code, 2, "the ID a rebuild retired is refused: {err}");
    assert!(err.contains("has been used before"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_killed_midway_resumes_after_a_restart() {
    let db = TestDb::new("rebuildkill");
    let text = config(&db, "").replace(
        "version_column = \"version\"",
        "version_column = \"version\"\nrebuild_batch_size = 200",
    );
    let (mut d, client) = projected(&db, &text, 30_000, 500, "orders.state.v1").await;
    db.psql("update order_state set status = 'corrupt' where order_id in ('o-1', 'o-2')");
    let (code, out, err) = start_rebuild(d.config_path(), "order_state", "orders.state.v2");
    assert_eq!(code, 0, "{out}{err}");
    eventually(Duration::from_secs(60), "the replay to start", || async {
        count(
            &client,
            "select coalesce(max(position), 0) from walfold.checkpoint where subscriber_id = 'orders.state.v2'",
        )
        .await
            > 2_000
    })
    .await;
    assert_eq!(rebuild_state(&client, "orders.state.v2").await, "running");
    d.kill();
    let at_kill = count(
        &client,
        "select coalesce(max(position), 0) from walfold.checkpoint where subscriber_id = 'orders.state.v2'",
    )
    .await;
    assert!(at_kill < 30_000, "killed mid-rebuild (position {at_kill})");
    d.kill_and_restart(None);
    eventually(Duration::from_secs(120), "the switch-over", || async {
        rebuild_state(&client, "orders.state.v2").await == "switched"
    })
    .await;
    subscriber_caught_up(&client, "orders.state.v2", 60).await;
    assert_eq!(
        difference(
            &client,
            "select order_id, status, amount, version from order_state",
            STATE_FROM_LOG
        )
        .await,
        0,
        "the rebuilt table equals the latest version per order in the log"
    );
    assert_eq!(
        db.psql("select count(*) from order_state__retired where status = 'corrupt'"),
        "2"
    );
}

/// A rebuild claims and applies each batch in one round trip, as if nothing of it was
/// claimed before. An event its subscriber did claim before (put there by hand while
/// the daemon was down) shows in the claim's answer: that transaction is dropped and
/// the batch goes again claims first, so the event is skipped and every other applied
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_skips_the_events_its_subscriber_claimed_before() {
    let db = TestDb::new("rebuildclaimed");
    let (mut d, client) = projected(&db, &config(&db, ""), 2_000, 50, "orders.total.v1").await;
    d.kill();
    let (code, out, err) = start_rebuild(d.config_path(), "order_total", "orders.total.v2");
    assert_eq!(code, 0, "{out}{err}");
    db.psql(
        "insert into walfold.processed_message (subscriber_id, seq, message_id, processed_at) \
         select 'orders.total.v2', coalesce(claim_seq, seq), event_id, now() \
         from walfold.event_log where seq in (7, 1507)",
    );
    d.kill_and_restart(None);
    eventually(Duration::from_secs(120), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    subscriber_caught_up(&client, "orders.total.v2", 60).await;
    assert_eq!(
        difference(
            &client,
            "select order_id, total from order_total",
            "select aggregate_id, sum((payload->>'amount')::numeric) from walfold.event_log \
             where seq not in (7, 1507) group by aggregate_id"
        )
        .await,
        0,
        "the rebuilt totals hold every event once but the two claimed before"
    );
    assert_eq!(
        count(
            &client,
            "select sum(duplicates)::int8 from walfold.checkpoint where subscriber_id = 'orders.total.v2'"
        )
        .await,
        2,
        "counted as duplicates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_leaves_everything_live_untouched() {
    let db = TestDb::new("rebuildabort");
    let text = config(&db, "").replace(
        "parallelism = 2",
        "parallelism = 2\nrebuild_batch_size = 100",
    );
    let (mut d, client) = projected(&db, &text, 20_000, 300, "orders.total.v1").await;
    let snapshot = "select order_id, total from order_total";
    db.psql(&format!("create table before as {snapshot}"));
    let cfg = d.config_path().to_owned();

    // A view on the live table would follow the rename to the retired table: refused.
    db.psql("create view big_totals as select * from order_total where total > 100");
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("views public.big_totals") || err.contains("views big_totals"),
        "{err}"
    );
    db.psql("drop view big_totals");

    // Aborted by the running daemon, mid-replay.
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(60), "the replay to start", || async {
        count(&client, "select count(*) from walfold.processed_message where subscriber_id = 'orders.total.v2'").await > 0
    })
    .await;
    let (code, out, err) = walfold(&["rebuild", "order_total", "--abort", "-c", &cfg], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let check_untouched = |subscriber: &'static str| {
        let (client, db, cfg) = (&client, &db, cfg.as_str());
        async move {
            assert_eq!(rebuild_state(client, subscriber).await, "aborted");
            assert_eq!(
                db.psql("select to_regclass('order_total__rebuild') is null"),
                "t"
            );
            assert_eq!(
                difference(client, snapshot, "select * from before").await,
                0
            );
            assert_eq!(
                db.psql("select subscriber_id from walfold.projection where name = 'order_total'"),
                "orders.total.v1"
            );
            let checkpoints = format!(
                "select count(*) from walfold.checkpoint where subscriber_id = '{subscriber}'"
            );
            assert_eq!(
                count(client, &checkpoints).await,
                0,
                "its checkpoints are gone"
            );
            let (code, _, err) = walfold(&["prune", "-c", cfg], &[]);
            assert_eq!(code, 0, "{err}");
            let claims = format!(
                "select count(*) from walfold.processed_message where subscriber_id = '{subscriber}'"
            );
            assert_eq!(count(client, &claims).await, 0, "prune deleted its claims");
        }
    };
    check_untouched("orders.total.v2").await;

    // Aborted by the command itself while no daemon runs.
    d.kill();
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v3");
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = walfold(&["rebuild", "order_total", "--abort", "-c", &cfg], &[]);
    assert_eq!(code, 0, "{out}{err}");
    check_untouched("orders.total.v3").await;
    let (code, _, err) = walfold(&["rebuild", "order_total", "--finish", "-c", &cfg], &[]);
    assert_eq!(code, 2, "nothing to finish");
    assert!(err.contains("no rebuild to finish"), "{err}");

    // The live projection still follows new events.
    d.kill_and_restart(None);
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (gen_random_uuid(), 'order', 'o-1', 'OrderChanged', 999, '{\"amount\": \"1000\"}')",
    );
    eventually(
        Duration::from_secs(60),
        "the live table to move",
        || async { difference(&client, snapshot, "select * from before").await == 2 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_with_concurrent_inserts_puts_every_row_in_the_log_once() {
    let db = TestDb::new("backfill");
    preload(&db, 20_000, 1_000);
    let text = config(&db, "");
    let path = walfold_tests::write_config(&text);
    let cfg = path.to_str().unwrap().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, url) = (stop.clone(), db.url());
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                c.batch_execute(
                    "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     select gen_random_uuid(), 'order', 'w-' || i, 'OrderChanged', 1, '{\"amount\": \"1\"}' \
                     from generate_series(1, 5) as i",
                )
                .await
                .unwrap();
                n += 5;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        walfold(
            &[
                "backfill",
                "--outbox",
                "public.outbox",
                "--batch",
                "500",
                "-c",
                &cfg,
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > 0);
    let client = db.client().await;
    let during = count(&client, "select count(*) from walfold.event_log").await;
    assert!(
        during >= 20_000,
        "the backfill imported the history ({during})"
    );

    let _d = Daemon::start(&text, &[]);
    let total = 20_000 + written;
    eventually(
        Duration::from_secs(120),
        "the slot to hand over",
        || async { count(&client, "select count(*) from walfold.event_log").await >= total },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&client, "select count(*) from outbox").await, total);
    assert_eq!(
        count(&client, "select count(*) from walfold.event_log").await,
        total,
        "every outbox row once, no duplicates"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from outbox o where not exists \
             (select 1 from walfold.event_log e where e.event_id = o.id)"
        )
        .await,
        0,
        "no gap"
    );
    // A second backfill while the daemon appends is refused with the reason.
    let (code, _, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.outbox",
            "-c",
            path.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("stop it for the backfill"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_what_a_subscriber_needs_and_the_window_decides_replays() {
    let db = TestDb::new("prune");
    let retention = "dedup_retention = \"3s\"\n";
    let text = builder(&db)
        .set("retention", "event_log", "3s")
        .to_toml()
        .replace("parallelism = 2", &format!("parallelism = 2\n{retention}"));
    let (d, client) = Daemon::streaming(&db, &text).await;
    let insert = |id: &str, amount: &str| {
        db.psql(&format!(
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values ('{id}', 'order', 'o-1', 'OrderChanged', 1, '{{\"amount\": \"{amount}\"}}')"
        ))
    };
    let total = || async {
        count(
            &client,
            "select coalesce(sum(total), 0)::int8 from order_total",
        )
        .await
    };
    let old = "00000000-0000-4000-8000-000000000001";
    let recent = "00000000-0000-4000-8000-000000000002";
    insert(old, "10");
    eventually(Duration::from_secs(30), "the old event", || async {
        total().await == 10
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    insert(recent, "5");
    eventually(Duration::from_secs(30), "the recent event", || async {
        total().await == 15
    })
    .await;

    // A projection that has not run yet holds every event.
    let late = format!(
        "{text}\n[[projection]]\nname = \"late\"\nsubscriber = \"late.v1\"\n\
         sql = \"select :event_id\"\n"
    );
    let late_path = walfold_tests::write_config(&late);
    let (code, out, err) = walfold(&["prune", "-c", late_path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("and 0 events"), "{out}");
    db.psql("delete from walfold.projection where name = 'late'");

    let (code, out, err) = walfold(&["prune", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("and 1 events"),
        "only the old event goes: {out}"
    );
    let in_log =
        |id: &str| format!("select count(*) from walfold.event_log where event_id = '{id}'");
    assert_eq!(count(&client, &in_log(old)).await, 0);
    assert_eq!(
        count(&client, &in_log(recent)).await,
        1,
        "the head and the window stay"
    );
    assert_eq!(
        count(
            &client,
            &format!(
                "select count(*) filter (where subscriber_id = 'orders.total.v1') * 10 + count(*) \
                 from walfold.processed_message where message_id = '{old}'"
            )
        )
        .await,
        1,
        "order_total's old claim went (3s window); order_state keeps its claims forever"
    );

    // The producer redelivers both: the old one is outside the window and applies again,
    // the recent one is recognised.
    insert(old, "10");
    insert(recent, "5");
    eventually(Duration::from_secs(30), "the replay", || async {
        count(&client, &in_log(old)).await == 1 && total().await == 25
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(total().await, 25, "old applied again, recent not");
}

/// A stranger pruned the log to a short window, then rebuilt: the rebuild switched over
/// to a table built from the few retained events, replacing a good read model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_after_pruning_is_refused_unless_asked_to_replay_the_retained_log() {
    let db = TestDb::new("prunedrebuild");
    let text = builder(&db).set("retention", "event_log", "1s").to_toml();
    let (d, client) = Daemon::streaming(&db, &text).await;
    let cfg = d.config_path().to_owned();
    let insert = |id: &str, order: &str, amount: &str| {
        let payload = format!(r#"{{"amount": "{amount}"}}"#);
        db.psql(&walfold_tests::insert_event(
            id,
            order,
            "OrderChanged",
            1,
            &payload,
        ))
    };
    let total = || {
        count(
            &client,
            "select coalesce(sum(total), 0)::int8 from order_total",
        )
    };
    insert("00000000-0000-4000-8000-000000000001", "o-1", "10");
    insert("00000000-0000-4000-8000-000000000002", "o-2", "5");
    eventually(Duration::from_secs(30), "the first events", || async {
        total().await == 15
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    insert("00000000-0000-4000-8000-000000000003", "o-3", "1");
    eventually(Duration::from_secs(30), "the last event", || async {
        total().await == 16
    })
    .await;
    subscriber_caught_up(&client, "orders.state.v1", 30).await;
    subscriber_caught_up(&client, "orders.total.v1", 30).await;

    // Prune passes and rebuild starts take turns (the stranger started a rebuild while
    // a pass that had not seen it deleted its events): a held prune lock refuses the
    // start and keeps a pass waiting.
    let lock = db.client().await;
    lock.execute(
        "select pg_advisory_lock(x'77616c50'::int, hashtext('walfold'))",
        &[],
    )
    .await
    .unwrap();
    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a prune pass is running"), "{err}");
    let pass = {
        let cfg = cfg.clone();
        std::thread::spawn(move || walfold(&["prune", "-c", &cfg], &[]))
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!pass.is_finished(), "the pass waits for the lock");
    drop(lock);
    let (code, out, err) = pass.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("and 2 events"), "the two old events go: {out}");
    let head = count(&client, "select max(seq) from walfold.event_log").await;
    assert_eq!(
        count(&client, "select through from walfold.event_log_pruned").await,
        head - 1,
        "the horizon is the highest seq deleted"
    );

    let (code, _, err) = start_rebuild(&cfg, "order_total", "orders.total.v2");
    assert_eq!(code, 2, "a rebuild from a pruned log is refused: {err}");
    assert!(
        err.contains("pruned the event log through seq") && err.contains("--from-retained-log"),
        "{err}"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.rebuild where subscriber_id = 'orders.total.v2'"
        )
        .await
            + count(
                &client,
                "select count(*) from pg_class where relname = 'order_total__rebuild'"
            )
            .await,
        0,
        "nothing was started"
    );
    assert_eq!(total().await, 16, "the live table is untouched");

    // Asked for, it replays what the log holds: the retained event alone.
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "order_total",
            "--subscriber",
            "orders.total.v2",
            "--from-retained-log",
            "-c",
            &cfg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    // It switched once it had read as far as the live subscriber: the retained event.
    eventually(
        Duration::from_secs(30),
        "the retained event alone in the rebuilt table",
        || async { total().await == 1 },
    )
    .await;
}

/// The config with a `trail` read model (created here) of each order's steps, whose
/// check refuses a step with `bad` in it, and its `sql` projection `trail.v1` giving up
/// on an event after `max_attempts`.
fn trail(db: &TestDb, max_attempts: u32) -> String {
    db.psql(
        "create table trail (order_id text primary key, steps text not null, \
         constraint no_bad check (steps not like '%bad%'))",
    );
    config(
        db,
        &format!(
            r#"
[[projection]]
name = "trail"
subscriber = "trail.v1"
max_attempts = {max_attempts}
retry_backoff_ms = 10
sql = """
insert into trail as t (order_id, steps) values (:aggregate_id, :payload.step)
on conflict (order_id) do update set steps = t.steps || ',' || excluded.steps
"""
"#
        ),
    )
}

/// Writes `order`'s step `step` as its version `version`.
fn trail_step(db: &TestDb, order: &str, version: i64, step: &str) -> String {
    db.psql(&format!(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values (gen_random_uuid(), 'order', '{order}', 'Step', {version}, '{{\"step\": \"{step}\"}}')"
    ))
}

/// `order`'s steps in the `trail` read model.
async fn trail_of(client: &tokio_postgres::Client, order: &str) -> Option<String> {
    client
        .query_opt("select steps from trail where order_id = $1", &[&order])
        .await
        .unwrap()
        .map(|r| r.get::<_, String>(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_dead_letter_applies_once_and_releases_its_aggregate_in_order() {
    let db = TestDb::new("retry");
    let (d, client) = Daemon::streaming(&db, &trail(&db, 2)).await;
    let step = |order: &str, version: i64, step: &str| trail_step(&db, order, version, step);
    let steps = |order: &'static str| trail_of(&client, order);
    step("o-1", 1, "a");
    step("o-1", 2, "bad");
    step("o-1", 3, "c");
    step("o-2", 1, "x");
    eventually(
        Duration::from_secs(30),
        "the failure to park o-1",
        || async {
            db.psql(
                "select count(*) from walfold.parked_aggregate where subscriber_id = 'trail.v1'",
            ) == "1"
                && steps("o-2").await.as_deref() == Some("x")
                && db.psql(
                    "select count(*) from walfold.dead_letter where subscriber_id = 'trail.v1'",
                ) == "2"
        },
    )
    .await;
    assert_eq!(steps("o-1").await.as_deref(), Some("a"));
    let head = db.psql(
        "select id from walfold.dead_letter where subscriber_id = 'trail.v1' and reason = 'projection_failed'",
    );
    let cfg = d.config_path().to_owned();

    // Retried before the cause is fixed: it fails again and stays parked, nothing applied.
    let (code, _, err) = walfold(&["dead-letters", "retry", &head, "-c", &cfg], &[]);
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(30), "the retry to fail", || async {
        db.psql(&format!(
            "select status || attempts from walfold.dead_letter where id = {head}"
        )) == "open3"
    })
    .await;
    assert_eq!(steps("o-1").await.as_deref(), Some("a"));

    // Fixed, retried: the chain applies once, in order, and o-1 is released.
    db.psql("alter table trail drop constraint no_bad");
    let (code, out, err) = walfold(&["dead-letters", "retry", &head, "-c", &cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 dead letter(s) queued"), "{out}");
    eventually(Duration::from_secs(30), "the retried chain", || async {
        steps("o-1").await.as_deref() == Some("a,bad,c")
    })
    .await;
    assert_eq!(
        db.psql("select count(*) from walfold.parked_aggregate"),
        "0",
        "o-1 is released"
    );
    assert_eq!(
        db.psql("select string_agg(status, ',' order by id) from walfold.dead_letter where subscriber_id = 'trail.v1'"),
        "retried,retried"
    );
    step("o-1", 4, "d");
    eventually(Duration::from_secs(30), "o-1's next event", || async {
        steps("o-1").await.as_deref() == Some("a,bad,c,d")
    })
    .await;
    let (code, _, err) = walfold(&["dead-letters", "retry", &head, "-c", &cfg], &[]);
    assert_eq!(code, 2, "a retried dead letter is not open any more");
    assert!(err.contains("not open"), "{err}");
}

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

/// A stranger discarded the only dead letter of a parked aggregate: nothing was left to
/// retry, so the aggregate stayed parked (and `WalfoldParkedAggregates` kept firing).
/// Discarding gives the event up; with nothing else waiting, the aggregate goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discarding_the_only_dead_letter_of_a_parked_aggregate_releases_it() {
    let db = TestDb::new("discardpark");
    let (d, client) = Daemon::streaming(&db, &trail(&db, 1)).await;
    let step = |order: &str, version: i64, step: &str| trail_step(&db, order, version, step);
    let steps = |order: &'static str| trail_of(&client, order);
    let parked = || db.psql("select count(*) from walfold.parked_aggregate");
    step("o-1", 1, "a");
    step("o-1", 2, "bad");
    step("o-2", 1, "bad");
    step("o-2", 2, "y");
    eventually(Duration::from_secs(30), "both to park", || async {
        parked() == "2"
            && db.psql("select count(*) from walfold.dead_letter where subscriber_id = 'trail.v1'")
                == "3"
    })
    .await;
    let letter = |order: &str, reason: &str| {
        db.psql(&format!(
            "select id from walfold.dead_letter where aggregate_id = '{order}' and reason = '{reason}'"
        ))
    };
    let cfg = d.config_path().to_owned();
    let discard = |id: &str| {
        let (code, _, err) = walfold(
            &[
                "dead-letters",
                "discard",
                id,
                "--reason",
                "test",
                "-c",
                &cfg,
            ],
            &[],
        );
        assert_eq!(code, 0, "{err}");
    };

    // o-1: its only letter discarded, it is released and its next event applies.
    discard(&letter("o-1", "projection_failed"));
    eventually(Duration::from_secs(30), "o-1 released", || async {
        db.psql("select count(*) from walfold.parked_aggregate where aggregate_id = 'o-1'") == "0"
    })
    .await;
    step("o-1", 3, "c");
    eventually(Duration::from_secs(30), "o-1's next event", || async {
        steps("o-1").await.as_deref() == Some("a,c")
    })
    .await;

    // o-2: its head discarded while a later event waits behind it: it stays parked
    // until that one is retried or discarded (discarding a head and retrying the rest
    // skips it).
    discard(&letter("o-2", "projection_failed"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        db.psql("select count(*) from walfold.parked_aggregate where aggregate_id = 'o-2'"),
        "1",
        "o-2's waiting event still holds it"
    );
    let (code, _, err) = walfold(
        &[
            "dead-letters",
            "retry",
            &letter("o-2", "aggregate_parked"),
            "-c",
            &cfg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(30), "o-2's rest applied", || async {
        steps("o-2").await.as_deref() == Some("y") && parked() == "0"
    })
    .await;
}

/// A daemon on `text` with `events` preloaded over `orders` aggregates, once
/// `subscriber` has projected all of them.
async fn projected(
    db: &TestDb,
    text: &str,
    events: i64,
    orders: i64,
    subscriber: &str,
) -> (Daemon, tokio_postgres::Client) {
    let (d, client) = Daemon::streaming(db, text).await;
    preload(db, events, orders);
    subscriber_caught_up(&client, subscriber, 180).await;
    (d, client)
}

/// `walfold rebuild <projection> --subscriber <subscriber>` on the config at `cfg`:
/// (exit code, stdout, stderr).
fn start_rebuild(cfg: &str, projection: &str, subscriber: &str) -> (i32, String, String) {
    walfold(
        &["rebuild", projection, "--subscriber", subscriber, "-c", cfg],
        &[],
    )
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

/// Claims are keyed by seq (issue 28): an event delivered again after pruning deleted
/// it from the log is appended under a new seq but carries its first delivery's claim
/// seq, so a subscriber that keeps its claim skips it and one whose claim expired
/// applies it again (docs/PROJECTIONS.md, "Retention as replay policy"); a rebuild
/// under a new subscriber replays it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_delivered_again_after_pruning_meets_the_claims_that_are_kept() {
    let db = TestDb::new("claimseq");
    db.psql("create table short_total (order_id text primary key, total numeric not null)");
    let text = builder(&db)
        .set("retention", "event_log", "1s")
        .text(
            r#"
[[projection]]
name = "short_total"
subscriber = "short.total.v1"
dedup_retention = "2s"
sql = """
insert into short_total as t (order_id, total) values (:aggregate_id, :payload.amount::numeric)
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#,
        )
        .to_toml();
    let (d, client) = Daemon::streaming(&db, &text).await;
    let cfg = d.config_path().to_owned();
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
    let total = |table: &'static str| {
        let client = &client;
        async move {
            count(
                client,
                &format!("select coalesce(sum(total), 0)::int8 from {table}"),
            )
            .await
        }
    };
    let old = "00000000-0000-4000-8000-0000000000a1";
    let recent = "00000000-0000-4000-8000-0000000000a2";
    insert(old, "10");
    eventually(Duration::from_secs(30), "the old event", || async {
        total("order_total").await == 10 && total("short_total").await == 10
    })
    .await;
    let first_seq = count(
        &client,
        &format!("select seq from walfold.event_log where event_id = '{old}'"),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    insert(recent, "5");
    eventually(Duration::from_secs(30), "the recent event", || async {
        total("order_total").await == 15 && total("short_total").await == 15
    })
    .await;
    subscriber_caught_up(&client, "orders.total.v1", 30).await;
    subscriber_caught_up(&client, "short.total.v1", 30).await;

    // The old event leaves the log; short_total's claim on it expired, order_total's is
    // kept forever: the identity stays retired with its claim seq.
    let (code, out, err) = walfold(&["prune", "-c", &cfg], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("and 1 events"), "{out}");
    assert_eq!(
        count(
            &client,
            &format!("select claim_seq from walfold.retired_identity where event_id = '{old}'")
        )
        .await,
        first_seq
    );
    assert_eq!(
        count(
            &client,
            &format!(
                "select count(*) from walfold.processed_message where message_id = '{old}' \
                 and subscriber_id = 'short.total.v1'"
            )
        )
        .await,
        0,
        "short_total's claim went (2 s window)"
    );

    // The producer delivers it again: under a new seq, with its first claim seq.
    insert(old, "10");
    eventually(Duration::from_secs(30), "the redelivery", || async {
        total("short_total").await == 25
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "order_total to pass it",
        || async {
            count(
                &client,
                "select count(*) from walfold.checkpoint where subscriber_id = 'orders.total.v1' \
             and position >= (select max(seq) from walfold.event_log)",
            )
            .await
                == 2
        },
    )
    .await;
    assert_eq!(
        count(
            &client,
            &format!(
                "select count(*) from walfold.event_log where event_id = '{old}' \
                 and seq > {first_seq} and claim_seq = {first_seq}"
            )
        )
        .await,
        1
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        total("order_total").await,
        15,
        "order_total kept its claim: a duplicate"
    );
    assert_eq!(
        total("short_total").await,
        25,
        "short_total's claim expired: new"
    );

    // A rebuild under a new subscriber replays the retained log: the redelivered event
    // once, under its claim seq.
    let (code, _, err) = walfold(
        &[
            "rebuild",
            "order_total",
            "--subscriber",
            "orders.total.v2",
            "--from-retained-log",
            "-c",
            &cfg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    eventually(Duration::from_secs(60), "the switch-over", || async {
        rebuild_state(&client, "orders.total.v2").await == "switched"
    })
    .await;
    eventually(Duration::from_secs(30), "the rebuilt total", || async {
        total("order_total").await == 15
    })
    .await;
    assert_eq!(
        count(
            &client,
            &format!(
                "select count(*) from walfold.processed_message \
                 where subscriber_id = 'orders.total.v2' and seq = {first_seq}"
            )
        )
        .await,
        1,
        "the new subscriber claimed the first delivery's seq"
    );
}

/// A pruned event's identity (its claim seq) is kept while any projection may keep claims
/// on it: the config's longest `dedup_retention`, unless the registry knows a projection
/// the config does not name (taken out of it, or a library's Rust projection a command
/// does not see), which keeps its claims forever; then the identity stays.
#[tokio::test]
async fn a_pruned_events_identity_stays_while_a_projection_outside_the_config_may_hold_claims() {
    let db = TestDb::new("identkeep");
    db.psql("create table short_total (order_id text primary key, total numeric not null)");
    let text = walfold_tests::config_builder(&db.url())
        .set("retention", "prune_interval_s", 0)
        .set("retention", "event_log", "1s")
        .text(
            r#"
[[projection]]
name = "short_total"
subscriber = "short.total.v1"
dedup_retention = "1s"
sql = """
insert into short_total as t (order_id, total) values (:aggregate_id, :payload.amount::numeric)
on conflict (order_id) do update set total = t.total + excluded.total
"""
"#,
        )
        .to_toml();
    let (d, client) = Daemon::streaming(&db, &text).await;
    let cfg = d.config_path().to_owned();
    let old = "00000000-0000-4000-8000-0000000000b1";
    db.psql(&walfold_tests::insert_event(
        old,
        "o-1",
        "OrderChanged",
        1,
        r#"{"amount": "10"}"#,
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    db.psql(&walfold_tests::insert_event(
        "00000000-0000-4000-8000-0000000000b2",
        "o-1",
        "OrderChanged",
        2,
        r#"{"amount": "5"}"#,
    ));
    subscriber_caught_up(&client, "short.total.v1", 30).await;
    let retired = || {
        let client = &client;
        async move {
            count(
                client,
                &format!("select count(*) from walfold.retired_identity where event_id = '{old}'"),
            )
            .await
        }
    };
    let prune = || {
        let (code, out, err) = walfold(&["prune", "-c", &cfg], &[]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let out = prune();
    assert!(out.contains("and 1 events"), "{out}");
    assert_eq!(retired().await, 1, "the pruned event's identity is retired");

    // A projection the registry knows and the config does not may keep claims forever.
    db.psql(
        "insert into walfold.projection (name, subscriber_id, configured_subscriber) \
         values ('gone', 'gone.v1', 'gone.v1')",
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    prune();
    assert_eq!(
        retired().await,
        1,
        "kept past the config's 1 s: 'gone' may hold claims"
    );

    // Without it, the config's longest claim retention (1 s) bounds the identity.
    db.psql("delete from walfold.projection where name = 'gone'");
    prune();
    assert_eq!(
        retired().await,
        0,
        "past every claim retention: the identity goes"
    );
}

/// A new `subscriber` in the config for a table another subscriber built would apply
/// every event to it again (a running total doubles): refused, naming the rebuild that
/// moves it; once the table is empty, the new ID starts over from the first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_subscriber_id_is_refused_for_a_table_another_one_built() {
    let db = TestDb::new("newsub");
    let text = config(&db, "");
    let (mut d, client) = projected(&db, &text, 2_000, 50, "orders.total.v1").await;
    d.kill();
    let renamed = text.replace("orders.total.v1", "orders.total.v9");
    let mut refused = Daemon::start(&renamed, &[]);
    let code = refused.wait_exit("the daemon to refuse the new ID").await;
    assert_ne!(code, Some(0), "{}", refused.log_text());
    let log = refused.log_text();
    assert!(
        log.contains("rebuild order_total --subscriber orders.total.v9"),
        "{log}"
    );
    assert_eq!(
        count(
            &client,
            "select count(*) from walfold.checkpoint where subscriber_id = 'orders.total.v9'"
        )
        .await,
        0,
        "the new ID applied nothing"
    );
    let totals = || {
        difference(
            &client,
            "select order_id, total from order_total",
            TOTALS_FROM_LOG,
        )
    };
    assert_eq!(totals().await, 0, "the totals are untouched");

    // Emptied, the table is rebuilt from the first event under the new ID, once.
    db.psql("truncate order_total");
    let (_d, _) = Daemon::streaming(&db, &renamed).await;
    subscriber_caught_up(&client, "orders.total.v9", 60).await;
    assert_eq!(
        totals().await,
        0,
        "every event applied once under the new ID"
    );
    assert_eq!(
        db.psql("select subscriber_id from walfold.projection where name = 'order_total'"),
        "orders.total.v9"
    );
}

/// A statement that names its live table besides `{table}` cannot run on the rebuild's
/// shadow table: `walfold rebuild` refuses it up front (saying to use an alias) and
/// leaves nothing behind, instead of a replay that fails at every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_whose_statement_names_the_live_table_is_refused_up_front() {
    let db = TestDb::new("unaliased");
    let text = config(&db, "").replace(
        "insert into {table} as t (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))\n\
         on conflict (order_id) do update set total = t.total + excluded.total",
        "insert into {table} (order_id, total) values (:aggregate_id, coalesce(:payload.amount::numeric, 0))\n\
         on conflict (order_id) do update set total = order_total.total + excluded.total",
    );
    assert!(text.contains("order_total.total"), "{text}");
    let (d, client) = projected(&db, &text, 200, 10, "orders.total.v1").await;
    let (code, _, err) = start_rebuild(d.config_path(), "order_total", "orders.total.v2");
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("order_total__rebuild") && err.contains("alias"),
        "{err}"
    );
    assert_eq!(
        db.psql("select to_regclass('order_total__rebuild') is null"),
        "t"
    );
    assert_eq!(rebuild_state(&client, "orders.total.v2").await, "-");
    // The live projection goes on.
    db.psql(&walfold_tests::insert_event(
        "00000000-0000-4000-8000-0000000000c1",
        "o-1",
        "OrderChanged",
        99,
        r#"{"amount": "5"}"#,
    ));
    subscriber_caught_up(&client, "orders.total.v1", 60).await;
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
