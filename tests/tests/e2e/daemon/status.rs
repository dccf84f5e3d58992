//! What `/readyz` and `walfold status` say: an unreachable database named as such, a
//! projection removed from the config shown as unused.

use std::time::Duration;

use walfold_tests::{caught_up, eventually, http_get, walfold, write_config, Daemon, TestDb};

use super::paid;

/// A daemon whose database does not answer is not ready and says so: not "another
/// instance leads", which sends an operator looking for an instance that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_an_unreachable_database_not_another_leader() {
    let port = walfold_tests::free_port();
    let dead = walfold_tests::free_port();
    let text = walfold_tests::config_for(
        &format!("postgresql://postgres@127.0.0.1:{dead}/nowhere"),
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let _d = Daemon::start(&text, &[]);
    let mut last = (0, String::new());
    eventually(Duration::from_secs(30), "/readyz to answer", || {
        last = http_get(port, "/readyz");
        let answered = last.0 != 0;
        async move { answered }
    })
    .await;
    let (code, why) = http_get(port, "/readyz");
    assert_eq!(code, 503, "{why}");
    assert!(
        why.contains("not leading") && why.contains(&dead.to_string()),
        "{why}"
    );
    assert!(!why.contains("another instance"), "{why}");
}

/// Found by a stranger: a projection removed from the config kept its registry row, and
/// `walfold status` showed its subscriber as live with a lag that only grew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projection_removed_from_the_config_shows_as_unused_without_lag() {
    let db = TestDb::new("removed_projection");
    let (d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(3, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    drop(d);
    // The ledger is the last [[projection]] of the standard config.
    let full = db.config("");
    let without_ledger = &full[..full.rfind("[[projection]]").unwrap()];
    assert!(!without_ledger.contains("orders.ledger.v1"));
    let cfg = write_config(without_ledger);
    let (_d, client) = Daemon::streaming(&db, without_ledger).await;
    db.psql(&paid(4, "o-2", "5"));
    eventually(Duration::from_secs(30), "the two projections", || async {
        walfold_tests::count(
            &client,
            "select count(*) from walfold.checkpoint where subscriber_id <> 'orders.ledger.v1' \
             and position >= 2",
        )
        .await
            >= 3
    })
    .await;
    let (code, out, err) = walfold(&["status", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}{err}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("orders.ledger.v1"))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .collect();
    assert_eq!((row[2], row[3], row[9]), ("-", "-", "unused"), "{out}");
}
