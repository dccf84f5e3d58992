//! Message outboxes (`pg_logical_emit_message`): beside a table outbox, alone on an empty
//! publication, and what is no event rejected.

use std::time::Duration;

use walfold_tests::{caught_up, insert_event, Daemon, TestDb};

use super::{ingested_through, ID};

/// `pg_logical_emit_message(transactional, prefix, json)` as an SQL statement.
fn emit(transactional: bool, prefix: &str, content: &str) -> String {
    walfold_tests::emit_message(transactional, prefix, &format!("'{content}'"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_outboxes_flow_beside_a_table_outbox_and_reject_what_is_no_event() {
    let db = TestDb::new("messages");
    db.psql(
        "create table outbox_naive (like outbox); \
         alter table outbox_naive alter column occurred_at type timestamp; \
         create extension pg_walinspect;",
    );
    db.psql(walfold_tests::REVOKE_PUBLIC_EMIT);
    // Two message outboxes (one with camelCase keys) beside two table outboxes.
    let config = db.config(
        r#"
[[outbox]]
message_prefix = "walfold:orders"

[[outbox]]
message_prefix = "shop"
aggregate_type = "aggregateType"
aggregate_id = "aggregateId"
event_type = "type"
occurred_at = "occurredAt"

[[outbox]]
table = "public.outbox_naive"
"#,
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql("select pg_copy_logical_replication_slot('walfold', 'replay')");
    let event = |id: &str, version: i64, status: &str| {
        format!(
            r#"{{"id": "{id}", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderStatus", "version": {version}, "payload": {{"status": "{status}", "amount": "5"}}}}"#
        )
    };
    let rows = [
        // One business transaction: a row, then a message, in commit order.
        format!(
            "begin; {} {} {} commit;",
            insert_event(ID[0], "o-1", "OrderStatus", 1, r#"{"status": "placed", "amount": "5"}"#),
            emit(true, "walfold:orders", &event(ID[1], 2, "paid")),
            emit(true, "someone.else", "not for walfold"),
        ),
        // Rolled back: its message is never an event.
        format!(
            "begin; {} rollback;",
            emit(true, "walfold:orders", &event(ID[2], 3, "refunded"))
        ),
        // Keys of its own; an ISO 8601 time without offset (UTC); a version as a string;
        // a number as the aggregate ID.
        emit(
            true,
            "shop",
            &format!(
                r#"{{"id": "{}", "aggregateType": "order", "aggregateId": 7, "type": "OrderStatus", "version": "1", "payload": {{"status": "placed"}}, "occurredAt": "2026-12-01T10:00:00.5"}}"#,
                ID[3]
            ),
        ),
        // The same event again (a duplicate), and its ID with other content (id_conflict).
        emit(true, "walfold:orders", &event(ID[1], 2, "paid")),
        emit(true, "walfold:orders", &event(ID[1], 2, "cancelled")),
        // Malformed: not JSON, no ID, a JSON array, \u0000, non-transactional.
        emit(true, "walfold:orders", "{oops"),
        emit(true, "walfold:orders", r#"{"aggregate_type": "order", "aggregate_id": "o-2", "event_type": "X", "payload": {}}"#),
        emit(true, "walfold:orders", "[1, 2]"),
        emit(true, "walfold:orders", r#"{"id": "00000000-0000-4000-8000-0000000000ff", "aggregate_type": "order", "aggregate_id": "o-3", "event_type": "X", "payload": {"a": "\u0000"}}"#),
        emit(false, "walfold:orders", &event("00000000-0000-4000-8000-0000000000fe", 9, "lost")),
        // A timestamp without time zone is read as UTC.
        "insert into outbox_naive (id, aggregate_type, aggregate_id, event_type, version, payload, occurred_at) \
         values ('00000000-0000-4000-8000-0000000000aa', 'order', 'o-4', 'OrderStatus', 1, '{\"status\": \"placed\"}', '2026-12-01 10:00:00');"
            .to_owned(),
    ];
    for sql in &rows {
        db.psql(sql);
    }
    let to = db.psql("select pg_current_wal_lsn()");
    ingested_through(&db, "walfold", &to).await;

    let check = |db: &TestDb| {
        assert_eq!(
            db.psql(
                "select string_agg(event_id::text || ' ' || aggregate_id || ' ' || coalesce(version::text, '-'), ',' order by seq) from walfold.event_log"
            ),
            format!(
                "{} o-1 1,{} o-1 2,{} 7 1,00000000-0000-4000-8000-0000000000aa o-4 1",
                ID[0], ID[1], ID[3]
            ),
            "the row and the message in commit order; nothing of the rolled-back transaction"
        );
        assert_eq!(
            db.psql(&format!(
                "select occurred_at = '2026-12-01 10:00:00.5+00' from walfold.event_log where event_id = '{}'",
                ID[3]
            )),
            "t"
        );
        assert_eq!(
            db.psql("select occurred_at = '2026-12-01 10:00:00+00' from walfold.event_log where aggregate_id = 'o-4'"),
            "t"
        );
        let letters = db.psql(
            "select string_agg(reason || ': ' || error, E'\\n' order by change_lsn) from walfold.dead_letter",
        );
        let lines: Vec<&str> = letters.lines().collect();
        assert_eq!(lines.len(), 6, "{letters}");
        for (line, want) in lines.iter().zip([
            "id_conflict",
            "malformed: message content is not JSON",
            "malformed: key `id` is missing",
            "malformed: message content must be a JSON object, not an array",
            "malformed: the message contains \\u0000",
            "malformed: emitted non-transactional",
        ]) {
            assert!(line.starts_with(want), "{line} should start with {want}");
        }
    };
    caught_up(&client, 4, 3).await;
    check(&db);
    assert_eq!(
        db.psql("select status || ' ' || version from order_state where order_id = 'o-1'"),
        "paid 2"
    );
    assert_eq!(
        db.psql(
            "select sum(duplicates) || ' ' || sum(ignored_changes) from walfold.ingest_position"
        ),
        "1 1",
        "the repeated event; the message under another prefix"
    );

    // The same WAL again from a copied slot, after a SIGKILL: nothing twice.
    d.kill();
    let mut d = Daemon::start(&config, &[("WALFOLD_SOURCE__SLOT", "replay")]);
    ingested_through(&db, "replay", &to).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    check(&db);
    db.psql("select pg_drop_replication_slot('replay')");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_message_outboxes_alone_runs_on_an_empty_publication() {
    let db = TestDb::new("messages_only");
    db.psql(walfold_tests::REVOKE_PUBLIC_EMIT);
    let config = db.config("").replace(
        "[[outbox]]\ntable = \"public.outbox\"\n",
        "[[outbox]]\nmessage_prefix = \"orders\"\n",
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    assert_eq!(
        db.psql("select count(*) from pg_publication_tables where pubname = 'walfold_outbox'"),
        "0"
    );
    db.psql(&emit(
        true,
        "orders",
        &format!(
            r#"{{"id": "{}", "aggregate_type": "order", "aggregate_id": "o-1", "event_type": "OrderPaid", "version": 1, "payload": {{"status": "paid", "amount": "3"}}}}"#,
            ID[0]
        ),
    ));
    caught_up(&client, 1, 3).await;
    assert_eq!(db.psql("select total from order_total"), "3");
    let (code, out, err) = walfold_tests::walfold(&["doctor", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("messages 'orders'"), "{out}");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let (code, out, err) = walfold_tests::walfold(
        &["backfill", "--outbox", "orders", "-c", d.config_path()],
        &[],
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("'orders' is a message outbox: its events exist only in the WAL"),
        "{err}"
    );
}
