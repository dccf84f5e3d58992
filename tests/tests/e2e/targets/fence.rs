//! The leader's fence on an extra target: a deposed leader's transaction there lands
//! before the new leader's takeover or fails, in the store and with two real daemons.

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{count, eventually, slot_active, walfold, Daemon, TestDb};

use super::rows;

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
