//! Pruning and the replay window: what a subscriber needs is kept, a rebuild after
//! pruning is refused unless asked, an event delivered again after pruning meets the
//! claims that are kept, a pruned event's identity stays while claims may hold it.

use std::time::Duration;

use walfold_tests::{count, eventually, walfold, Daemon, TestDb};

use super::{builder, rebuild_state, start_rebuild, subscriber_caught_up};

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
