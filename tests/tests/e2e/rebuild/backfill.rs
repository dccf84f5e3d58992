//! `walfold backfill` while the application keeps inserting: every row in the log once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use walfold_tests::{count, eventually, walfold, Daemon, TestDb};

use super::{config, preload};

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
