//! A row that is no event is one dead letter: identified by its WAL record (or its
//! digest in a backfill) and recorded once across replays and backfills.

use std::time::Duration;

use walfold_tests::{caught_up, eventually, insert_event, Daemon, TestDb};

use super::{ingested_through, ID};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_row_is_identified_by_its_wal_record_and_recorded_once_across_replays() {
    let db = TestDb::new("dl_change");
    db.psql(
        "create table outbox2 (like outbox including defaults); create extension pg_walinspect;",
    );
    let outbox_only = db.config("");
    let both = db.config("[[outbox]]\ntable = \"public.outbox2\"\n");
    let (mut d, _client) = Daemon::streaming(&db, &outbox_only).await;
    // A second slot at the same position, to replay the same WAL later.
    db.psql("select pg_copy_logical_replication_slot('walfold', 'replay')");
    // outbox2 is published before the config maps it (so this run cannot map it).
    db.psql("alter publication walfold_outbox add table outbox2");
    let from = db.psql("select pg_current_wal_lsn()");
    let malformed =
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
                     values (null, 'order', 'o-9', 'OrderPaid', 1, '{}');";
    db.psql(&format!(
        "begin; {} {malformed} {} commit;",
        insert_event(ID[0], "o-1", "OrderPaid", 1, r#"{"amount": "1"}"#)
            .replace("into outbox ", "into outbox2 "),
        insert_event(ID[1], "o-2", "OrderPaid", 1, r#"{"amount": "2"}"#),
    ));
    // A COPY writes both rows in one WAL record.
    db.psql(
        "copy outbox (id, aggregate_type, aggregate_id, event_type, version, payload) from stdin;\n\
         \\N\torder\to-8\tOrderPaid\t1\t{}\n\\N\torder\to-8\tOrderPaid\t2\t{}\n\\.\n",
    );
    let to = db.psql("select pg_current_wal_lsn()");
    // Unmapped, so this run stops before acknowledging (an older walfold skipped the
    // outbox2 row and recorded the rejected rows here).
    let start = std::time::Instant::now();
    while d.exited().is_none() && db.psql("select count(*) from walfold.dead_letter") == "0" {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the first run neither stopped nor recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Replayed with outbox2 mapped, from the copied slot, then from the original one.
    for slot in ["replay", "walfold"] {
        d.kill();
        d = Daemon::start(&both, &[("WALFOLD_SOURCE__SLOT", slot)]);
        ingested_through(&db, slot, &to).await;
    }
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(
        db.psql("select count(*) from walfold.event_log"),
        "2",
        "{}",
        d.log_text()
    );
    assert!(
        db.psql("select sum(malformed) from walfold.ingest_position")
            .parse::<i64>()
            .unwrap()
            >= 6,
        "both replays saw the rejected rows"
    );
    assert_eq!(
        db.psql("select count(*) from walfold.dead_letter"),
        "3",
        "each rejected row once"
    );
    let letters = db.psql(
        "select string_agg(change_lsn || '#' || change_index, ',' order by change_lsn, change_index) \
         from walfold.dead_letter where subscriber_id is null",
    );
    // The change's position is its WAL record's: the first outbox insert of the
    // transaction and both rows of the COPY's multi-insert record.
    let records = db.psql(&format!(
        "select string_agg(start_lsn || ' ' || record_type, ',' order by start_lsn) \
         from pg_get_wal_records_info('{from}', '{to}') \
         where resource_manager in ('Heap', 'Heap2') and record_type ~ 'INSERT' \
         and block_ref like '%/' || pg_relation_filenode('outbox') || ' fork%'"
    ));
    let records: Vec<(&str, &str)> = records
        .split(',')
        .map(|r| r.split_once(' ').unwrap())
        .collect();
    assert_eq!(records.len(), 3, "{records:?}");
    assert!(records[2].1.contains("MULTI_INSERT"), "{records:?}");
    assert_eq!(
        letters,
        format!("{}#0,{}#0,{}#1", records[0].0, records[2].0, records[2].0),
        "{records:?}"
    );
    db.psql("select pg_drop_replication_slot('replay')");
}

/// `walfold backfill` of the standard outbox in pages of `batch`: its summary line.
fn backfill(db: &TestDb, batch: &str) -> String {
    let cfg = walfold_tests::write_config(&db.config(""));
    let (code, out, err) = walfold_tests::walfold(
        &[
            "backfill",
            "--outbox",
            "public.outbox",
            "--batch",
            batch,
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backfilled_id_conflict_is_recorded_once() {
    let db = TestDb::new("bf_conflicts");
    for (i, id) in ID.iter().enumerate() {
        db.psql(&insert_event(
            id,
            &format!("o-{i}"),
            "OrderPaid",
            1,
            r#"{"amount": "1"}"#,
        ));
    }
    assert!(backfill(&db, "2").contains("4 appended"));
    // Same IDs, other content: at index 0 of page 1 and of page 2. Plus a second row
    // with the last page's ID, which pages must not skip at the boundary, and a
    // malformed row.
    db.psql(&format!(
        "update outbox set payload = '{{\"amount\": \"9\"}}' where id in ('{}', '{}'); {} \
         insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values ('00000000-0000-4000-8000-000000000009', 'order', null, 'OrderPaid', 1, '{{}}');",
        ID[0],
        ID[2],
        insert_event(ID[1], "o-1", "OrderPaid", 1, r#"{"amount": "7"}"#),
    ));
    for run in 0..2 {
        let out = backfill(&db, "2");
        assert!(
            out.contains("3 ID conflicts, 1 malformed"),
            "run {run}: {out}"
        );
        assert_eq!(
            db.psql(
                "select string_agg(reason || ' ' || coalesce(raw->'payload'->>'amount', '-'), ',' \
                 order by reason, event_id, raw->'payload'->>'amount') from walfold.dead_letter"
            ),
            "id_conflict 9,id_conflict 7,id_conflict 9,malformed -",
            "run {run}: every conflict once, none twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_rejected_by_the_stream_and_by_backfill_is_one_dead_letter() {
    let db = TestDb::new("bf_after_stream");
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    db.psql(&format!(
        "{} insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values ('00000000-0000-4000-8000-000000000009', 'order', null, 'OrderPaid', 1, '{{}}');",
        insert_event(ID[0], "o-1", "OrderPaid", 1, r#"{"amount": "1"}"#)
    ));
    caught_up(&client, 1, 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "1");
    // Backfill reads the same rows; then the stream replays them from a copied slot.
    assert!(backfill(&db, "10").contains("1 malformed"));
    assert_eq!(
        db.psql("select count(*) from walfold.dead_letter"),
        "1",
        "the streamed rejection is the backfilled one"
    );
    // A second, identical malformed row is another row: recorded.
    db.psql(
        "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload) \
         values ('00000000-0000-4000-8000-000000000009', 'order', null, 'OrderPaid', 1, '{}');",
    );
    let mut d = Daemon::start(&db.config(""), &[]);
    eventually(Duration::from_secs(30), "the second row", || async {
        db.psql("select count(*) from walfold.dead_letter") != "1"
    })
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "2");
}
