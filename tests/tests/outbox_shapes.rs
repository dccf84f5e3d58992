//! Outboxes as applications write them, end to end with the real `walfold` binary:
//! partitioned outboxes, several outboxes in one pipeline, names in every ORM's
//! convention, and what walfold refuses (with the fix) instead of dropping events.

use walfold_tests::{caught_up, insert_event, slot_active, Daemon, TestDb};

const ID: [&str; 4] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
    "00000000-0000-4000-8000-000000000004",
];

/// Whether the slot's confirmed position is before `lsn`.
fn slot_before(db: &TestDb, lsn: &str) -> bool {
    db.psql(&format!(
        "select confirmed_flush_lsn < '{lsn}' from pg_replication_slots where slot_name = 'walfold'"
    )) == "t"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_a_table_that_is_no_outbox_stops_ingest_before_its_ack() {
    let db = TestDb::new("unmapped");
    db.psql("create table outbox2 (like outbox including defaults)");
    let mut d = Daemon::start(&db.config(""), &[]);
    let client = db.client().await;
    slot_active(&client).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;

    // An operator adds a table to the publication, not to the config. A truncate of it
    // carries no events: counted as ignored, and ingest goes on.
    db.psql("alter publication walfold_outbox add table outbox2");
    db.psql("truncate outbox2");
    db.psql(&insert_event(
        ID[1],
        "o-2",
        "OrderPaid",
        1,
        r#"{"amount": "2"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(
        db.psql("select ignored_changes from walfold.ingest_position"),
        "1"
    );

    // The WAL position right after the commit (at or after the transaction's end).
    let after = db.psql(&format!(
        "begin; {} {} commit; select pg_current_wal_lsn();",
        insert_event(ID[2], "o-3", "OrderPaid", 1, r#"{"amount": "3"}"#),
        insert_event(ID[3], "o-4", "OrderPaid", 1, r#"{"amount": "4"}"#)
            .replace("into outbox ", "into outbox2 "),
    ));
    assert_eq!(d.wait_exit("the daemon to stop").await, Some(1));
    let log = d.log_text();
    for part in [
        "sent an insert of public.outbox2, which is no [[outbox]]",
        "publication walfold_outbox",
        "add public.outbox2 as an [[outbox]]",
        "truncate of a table that is no [[outbox]], ignored",
    ] {
        assert!(log.contains(part), "no `{part}` in:\n{log}");
    }
    assert!(
        slot_before(&db, &after),
        "the slot was acknowledged past the transaction"
    );
    assert_eq!(
        db.psql(&format!(
            "select lsn < '{after}' from walfold.ingest_position"
        )),
        "t"
    );

    // Fixed: the table is an outbox now, and the transaction's events arrive.
    let fixed = db.config("[[outbox]]\ntable = \"public.outbox2\"\n");
    let _d = Daemon::start(&fixed, &[]);
    caught_up(&client, 4, 3).await;
    assert_eq!(db.psql("select count(*) from ledger"), "4");
    assert_eq!(db.psql("select sum(amount) from ledger"), "10");
}
