//! A target taken out of the config still holds the log for its projections; a
//! projection moved off a target leaves readiness to where it serves.

use std::time::Duration;

use walfold_tempdb::{Cluster, Options};
use walfold_tests::{
    caught_up, eventually, free_port, http_get, slot_active, walfold, write_events, Daemon, TestDb,
};

use super::{reporting_caught_up, sum, REMOVED_TARGET};

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
