//! The publication changed under walfold: renamed, an outbox taken out while running, a
//! change undone at once or while stopped. Refused or backfilled, never rows lost.

use std::time::Duration;

use walfold_tests::{caught_up, walfold, write_config, write_events, Daemon, TestDb};

use super::paid;

/// A stranger renamed `source.publication` on a running deployment: walfold tried to
/// create the new one, its error led them to create it, and the stream then stopped
/// with the advice to drop the slot, which loses events. A slot walfold has read from
/// cannot use a publication created after its changes: walfold refuses at start and
/// names the publication that still publishes the outbox, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_publication_is_refused_with_the_old_name_not_created() {
    let db = TestDb::new("pubrename");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let first = write_events(db.url(), 3, 5, 2, Duration::from_millis(5), 43).await;
    caught_up(&client, first.distinct(), 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let more = write_events(db.url(), 2, 5, 2, Duration::from_millis(5), 47).await;

    let renamed = [("WALFOLD_SOURCE__PUBLICATION", "walfold_renamed")];
    let mut d = Daemon::start(&db.config(""), &renamed);
    d.wait_exit("the daemon to refuse").await;
    assert_eq!(d.exited().unwrap().code(), Some(1));
    let log = d.log_text();
    assert!(
        log.contains("publication walfold_renamed does not exist")
            && log.contains("set source.publication back to walfold_outbox"),
        "{log}"
    );
    assert_eq!(
        db.psql("select count(*) from pg_publication where pubname = 'walfold_renamed'"),
        "0",
        "not created"
    );
    // doctor says the same, instead of "walfold creates it on start".
    let cfg = write_config(&db.config(""));
    let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &renamed);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  publication walfold_renamed does not exist, and walfold has read slot walfold through walfold_outbox")
            && out.contains("set source.publication back to walfold_outbox"),
        "{out}"
    );
    // Created by hand, as the stranger did: newer than the changes the slot holds, so
    // still refused, with the same fix (not the advice to drop the slot).
    db.psql(
        "create publication walfold_renamed for table outbox with (publish = 'insert, truncate')",
    );
    let mut d = Daemon::start(&db.config(""), &renamed);
    d.wait_exit("the daemon to refuse again").await;
    let log = d.log_text();
    assert!(
        log.contains("is not the one it was read through (walfold_outbox)")
            && log.contains("set source.publication back to walfold_outbox"),
        "{log}"
    );

    // The old name carries on from the slot: nothing written meanwhile is lost.
    let _d = Daemon::start(&db.config(""), &[]);
    caught_up(&client, first.distinct() + more.distinct(), 3).await;

    // Dropped for good, no other publication has the outbox: the slot must go.
    drop(_d);
    db.psql("drop publication walfold_outbox");
    let mut d = Daemon::start(&db.config(""), &[]);
    d.wait_exit("the daemon to refuse").await;
    let log = d.log_text();
    assert!(
        log.contains("publication walfold_outbox does not exist")
            && log.contains("pg_drop_replication_slot('walfold')")
            && !log.contains("walfold_renamed"),
        "the slot was read through walfold_outbox: no other publication is offered\n{log}"
    );
}

/// Found by a stranger: an outbox taken out of the publication while walfold ran made
/// its events stop coming, with nothing said (pgoutput just filters them). The running
/// ingest checks the publication, stops naming the change and how to get the rows back,
/// and a backfill does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_taken_out_of_the_publication_while_running_stops_ingest_with_the_way_back() {
    let db = TestDb::new("pubdrop");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    let event = |n: u32, order: &str| paid(n, order, "10");
    db.psql(&event(1, "o-1"));
    caught_up(&client, 1, 3).await;
    db.psql("alter publication walfold_outbox drop table outbox");
    db.psql(&event(2, "o-2"));
    assert_eq!(d.wait_exit("the daemon to stop").await, Some(1));
    let log = d.log_text();
    assert!(
        log.contains(
            "while walfold ran, outbox table public.outbox is no longer in publication \
             walfold_outbox"
        ) && log.contains("walfold backfill --outbox public.outbox"),
        "{log}"
    );
    // The way back the message gives.
    db.psql("alter publication walfold_outbox add table outbox");
    let cfg = write_config(&db.config(""));
    let (code, out, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.outbox",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (_d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&event(3, "o-3"));
    caught_up(&client, 3, 3).await;
    assert_eq!(
        db.psql("select string_agg(order_id, ',' order by order_id) from order_total"),
        "o-1,o-2,o-3"
    );
}

/// Found by a second stranger: an outbox taken out of the publication and put back
/// before the next check (or while walfold was stopped) lost the rows written between,
/// silently. Any rewrite of the publication changes its catalog rows' xmins: walfold
/// records them, and a change is a slot gap from the position it last checked at,
/// backfilled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_undone_at_once_or_while_stopped_loses_nothing() {
    let db = TestDb::new("pubblip");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(1, "o-1", "10"));
    caught_up(&client, 1, 3).await;
    // Out and back within one session: no check sees the publication without it.
    db.psql(&format!(
        "alter publication walfold_outbox drop table outbox; {} \
         alter publication walfold_outbox add table outbox;",
        paid(2, "o-2", "10")
    ));
    db.psql(&paid(3, "o-3", "10"));
    caught_up(&client, 3, 3).await;
    // The same while stopped.
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql(&format!(
        "alter publication walfold_outbox drop table outbox; {} \
         alter publication walfold_outbox add table outbox;",
        paid(4, "o-4", "10")
    ));
    let (_d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&paid(5, "o-5", "10"));
    caught_up(&client, 5, 3).await;
    assert_eq!(
        db.psql(
            "select string_agg(order_id || '=' || total, ',' order by order_id) from order_total"
        ),
        "o-1=10,o-2=10,o-3=10,o-4=10,o-5=10"
    );
    assert_eq!(
        db.psql(
            "select count(*) from walfold.slot_gap where reason = 'publication' \
             and filled_at is not null"
        ),
        "2"
    );
}
