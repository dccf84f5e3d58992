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

/// Found on a first start: a scrape that came before the migration logged `WARN …
/// relation "walfold.projection" does not exist`. Until walfold's schema exists the
/// database gauges are left out silently; the first thing a new user reads in the log
/// is not a warning about walfold's own tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_scraped_from_the_first_moment_warns_about_nothing_of_its_own() {
    let db = TestDb::new("firststart");
    let port = walfold_tests::free_port();
    let d = Daemon::start(
        &db.config(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")),
        &[],
    );
    // Scrape as fast as the listener answers, from before the schema exists until the
    // daemon streams, and a little beyond.
    let client = db.client().await;
    let start = std::time::Instant::now();
    let mut scraped_before_schema = false;
    let mut streaming_since = None;
    while start.elapsed() < Duration::from_secs(30) {
        let (code, _) = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
            .await
            .unwrap();
        // Readiness reads the same tables.
        tokio::task::spawn_blocking(move || http_get(port, "/readyz"))
            .await
            .unwrap();
        let schema = db.psql("select to_regclass('walfold.projection') is not null") == "t";
        if code == 200 && !schema {
            scraped_before_schema = true;
        }
        if streaming_since.is_none()
            && walfold_tests::count(
                &client,
                "select count(*) from pg_replication_slots where active",
            )
            .await
                > 0
        {
            streaming_since = Some(std::time::Instant::now());
        }
        if streaming_since.is_some_and(|s| s.elapsed() > Duration::from_secs(2)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(streaming_since.is_some(), "{}", d.log_text());
    let log = d.log_text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .filter(|l| l.contains("walfold.") || l.contains("relation") || l.contains("gauges"))
        .collect();
    assert!(
        warnings.is_empty(),
        "a first start warned about walfold's own schema (scraped before it existed: \
         {scraped_before_schema}):\n{}",
        warnings.join("\n")
    );
}
