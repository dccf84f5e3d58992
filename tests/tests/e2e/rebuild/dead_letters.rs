//! Dead letters retried and discarded: a retried one applies once and releases its
//! aggregate in order; discarding a parked aggregate's only one releases it.

use std::time::Duration;

use walfold_tests::{eventually, walfold, Daemon, TestDb};

use super::config;

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
