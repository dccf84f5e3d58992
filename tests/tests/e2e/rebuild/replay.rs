//! A rebuild replays the log beside the live table: at scale, after a kill, past the
//! events its subscriber claimed before, and an abort that leaves everything live alone.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_tests::{count, difference, eventually, walfold, TestDb};

use super::{
    config, projected, rebuild_state, start_rebuild, subscriber_caught_up, TOTALS_FROM_LOG,
};

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
