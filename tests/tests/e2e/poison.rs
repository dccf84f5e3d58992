//! Hostile rows and messages never stall ingest (guarantee 7): each poison becomes an
//! event or a dead letter with the server's reason, the slot moves past it, and the
//! ordinary events behind it arrive within seconds.

use std::time::Duration;

use walfold_tests::{eventually, insert_event, Daemon, TestDb};

/// How long ordinary events written after a poison may take to reach the log.
const WITHIN: Duration = Duration::from_secs(20);

/// Ordinary events written after the poisons: they must all arrive.
fn ordinary(n: usize) -> String {
    (0..n)
        .map(|i| {
            insert_event(
                &format!("00000000-0000-4000-8000-0000000f{i:04}"),
                &format!("after-{i}"),
                "OrderStatus",
                1,
                r#"{"status": "placed", "amount": "1"}"#,
            )
        })
        .collect()
}

/// Writes `poisons` then ordinary events, and waits until the ordinary events are in
/// the log and the slot's confirmed position is past everything written.
async fn survives(db: &TestDb, poisons: &[String]) {
    survives_on(db, db, poisons).await
}

/// [`survives`] with the source and walfold's target apart.
async fn survives_on(source: &TestDb, target: &TestDb, poisons: &[String]) {
    for sql in poisons {
        source.psql(sql);
    }
    source.psql(&ordinary(3));
    let written = source.psql("select pg_current_wal_lsn()");
    eventually(WITHIN, "the events after the poisons", || async {
        target.psql("select count(*) from walfold.event_log where aggregate_id like 'after-%'")
            == "3"
    })
    .await;
    eventually(WITHIN, "the slot to pass the poisons", || async {
        source.psql(&format!(
            "select confirmed_flush_lsn >= '{written}' from pg_replication_slots \
             where slot_name = 'walfold'"
        )) == "t"
    })
    .await;
}

/// The dead letters rejected at ingest: `reason: error`, in WAL order.
fn letters(db: &TestDb) -> Vec<String> {
    db.psql(
        "select string_agg(reason || ': ' || error, E'\\n' order by change_lsn, change_index) \
         from walfold.dead_letter where subscriber_id is null",
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

fn assert_letters(db: &TestDb, want: &[&str]) {
    let got = letters(db);
    assert_eq!(got.len(), want.len(), "dead letters: {got:#?}");
    for (line, want) in got.iter().zip(want) {
        assert!(line.contains(want), "{line:?} should contain {want:?}");
    }
}

fn emit(prefix: &str, content: &str) -> String {
    walfold_tests::emit_message(true, prefix, content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_that_jsonb_cannot_store_is_a_dead_letter_and_ingest_goes_on() {
    let db = TestDb::new("poison_json");
    db.psql(
        "create table outbox_text (like outbox); \
         alter table outbox_text alter column payload type text, \
             alter column headers type text;",
    );
    let config = db.config(
        r#"
[[outbox]]
table = "public.outbox_text"
"#,
    );
    // Large transactions stream (protocol 2) and are staged before their commit.
    db.psql(&format!(
        "alter database {} set logical_decoding_work_mem = '64kB'",
        db.name
    ));
    let (mut d, _client) = Daemon::streaming(&db, &config).await;
    let row = |n: u32, payload: &str, headers: &str| {
        format!(
            "insert into outbox_text (id, aggregate_type, aggregate_id, event_type, version, payload, headers) \
             values ('00000000-0000-4000-8000-00000000a{n:03}', 'order', 'p-{n}', 'OrderStatus', 1, '{payload}', {headers});"
        )
    };
    let deep = format!("{}1{}", "[".repeat(201), "]".repeat(201));
    let too_deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    survives(
        &db,
        &[
            // Valid JSON, but past numeric's range: jsonb refuses them.
            row(1, r#"{"n": 1e1000000}"#, "null"),
            row(2, r#"{"n": 1e-1000000}"#, "null"),
            row(3, r#"{"status": "placed"}"#, r#"'{"trace": 1e999999}'"#),
            // Two in one transaction with a good one between: the good one is an event.
            format!(
                "begin; {} {} {} commit;",
                row(4, r#"{"n": -9e131072}"#, "null"),
                row(5, r#"{"status": "placed"}"#, "null"),
                row(6, r#"{"n": 0.1e-20000}"#, "null"),
            ),
            // Deep, but PostgreSQL stores it: an event.
            row(7, &deep, "null"),
            // Deeper than walfold reads: a dead letter that says so.
            row(8, &too_deep, "null"),
            // Past the range of time: no event happened then.
            "insert into outbox (id, aggregate_type, aggregate_id, event_type, version, payload, occurred_at) \
             values ('00000000-0000-4000-8000-00000000a009', 'order', 'p-9', 'OrderStatus', 1, '{}', '-infinity'), \
                    ('00000000-0000-4000-8000-00000000a010', 'order', 'p-10', 'OrderStatus', 1, '{}', 'infinity');"
                .to_owned(),
            // A poison inside a transaction large enough to stream.
            format!(
                "begin; {many} {} {many} commit;",
                row(11, r#"{"n": 1e1000000}"#, "null"),
                many = "insert into outbox_text (id, aggregate_type, aggregate_id, event_type, version, payload) \
                        select gen_random_uuid(), 'order', 's-' || g, 'OrderStatus', 1, \
                        '{\"pad\": \"' || repeat('x', 200) || '\"}' from generate_series(1, 500) g;"
            ),
        ],
    )
    .await;
    assert_eq!(
        db.psql("select count(*) from walfold.event_log where aggregate_id like 's-%'"),
        "1000",
        "every event of the streamed transaction around its poison"
    );
    assert_eq!(
        db.psql(
            "select string_agg(aggregate_id, ',' order by seq) from walfold.event_log \
             where aggregate_id like 'p-%'"
        ),
        "p-5,p-7",
        "the good row between the poisons, and the deep one"
    );
    assert_eq!(
        db.psql(&format!(
            "select payload = '{deep}'::jsonb from walfold.event_log where aggregate_id = 'p-7'"
        )),
        "t",
        "the deep payload is stored whole"
    );
    assert_letters(
        &db,
        &[
            "malformed: column `payload` holds a number jsonb cannot store",
            "malformed: column `payload` holds a number jsonb cannot store",
            "malformed: column `headers` holds a number jsonb cannot store",
            "malformed: column `payload` holds a number jsonb cannot store",
            "malformed: column `payload` holds a number jsonb cannot store",
            "malformed: column `payload` is nested 5000 levels deep; walfold reads JSON up to 512",
            "malformed: column `occurred_at` is -infinity",
            "malformed: column `occurred_at` is infinity",
            "malformed: column `payload` holds a number jsonb cannot store",
        ],
    );
    // The raw row is kept whole, as text where jsonb could not hold it.
    assert_eq!(
        db.psql(
            "select raw->>'payload' from walfold.dead_letter \
             where raw->>'aggregate_id' = 'p-1'"
        ),
        r#"{"n": 1e1000000}"#
    );
    // The projections fold what became events, the deep one included.
    eventually(WITHIN, "the projections to fold the events", || async {
        db.psql("select count(*) from ledger") == "1005"
    })
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_message_is_a_dead_letter_and_ingest_goes_on() {
    let db = TestDb::new("poison_msg");
    // Only the producer may emit (here the superuser the test writes as).
    db.psql(walfold_tests::REVOKE_PUBLIC_EMIT);
    let config = db.config(
        r#"
[[outbox]]
message_prefix = "walfold:orders"
"#,
    );
    let (mut d, _client) = Daemon::streaming(&db, &config).await;
    let event = |n: u32, payload: &str| {
        format!(
            r#"'{{"id": "00000000-0000-4000-8000-00000000b{n:03}", "aggregate_type": "order", "aggregate_id": "m-{n}", "event_type": "OrderStatus", "version": 1, "payload": {payload}}}'"#
        )
    };
    survives(
        &db,
        &[
            // One NUL byte, a NUL inside, bytes that are not UTF-8.
            emit("walfold:orders", r"'\x00'::bytea"),
            emit("walfold:orders", r#"'\x7b226964223a00'::bytea"#),
            emit("walfold:orders", r"'\xfffe7b7d'::bytea"),
            // JSON that jsonb cannot store.
            emit("walfold:orders", &event(1, r#"{"n": 1e1000000}"#)),
            // And an ordinary message still becomes an event.
            emit("walfold:orders", &event(2, r#"{"status": "placed"}"#)),
        ],
    )
    .await;
    assert_letters(
        &db,
        &[
            "malformed: message content is not JSON",
            "malformed: message content is not JSON",
            "malformed: message content is not UTF-8",
            "malformed: key `payload` holds a number jsonb cannot store",
        ],
    );
    assert_eq!(
        db.psql("select count(*) from walfold.event_log where aggregate_id = 'm-2'"),
        "1"
    );
    // The raw content is kept, escaped: the NUL byte is visible, not lost.
    assert_eq!(
        db.psql(
            "select raw->>'content' from walfold.dead_letter \
             where subscriber_id is null order by change_lsn limit 1"
        ),
        r"\u0000"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_utf8_from_a_sql_ascii_source_is_a_dead_letter() {
    let utf8 = TestDb::new("poison_ascii");
    let name = format!("{}_src", utf8.name);
    utf8.psql(&format!(
        "create database {name} encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0"
    ));
    let source = TestDb {
        cluster: utf8.cluster,
        name,
    };
    source.psql(walfold_tests::SCHEMA);
    source.psql(
        "create table outbox_text (like outbox); \
         alter table outbox_text alter column payload type text;",
    );
    // The source is SQL_ASCII; walfold's log and the read models are on the UTF-8 database.
    let config = walfold_tests::config_builder(&source.url())
        .outbox_table("public.outbox_text")
        .set("log", "level", "info")
        .set("target", "url", utf8.url())
        .text(walfold_tests::PROJECTIONS)
        .to_toml();
    let mut d = Daemon::start(&config, &[]);
    eventually(WITHIN, "the slot to be active", || async {
        source.psql(
            "select count(*) from pg_replication_slots where slot_name = 'walfold' and active",
        ) == "1"
    })
    .await;
    let bad = |n: u32, col: &str, value: &str| {
        let mut values = [
            "'order'".to_owned(),
            format!("'u-{n}'"),
            "'OrderStatus'".to_owned(),
            r#"'{"status": "placed"}'"#.to_owned(),
        ];
        let i = ["aggregate_type", "aggregate_id", "event_type", "payload"]
            .iter()
            .position(|c| *c == col)
            .unwrap();
        values[i] = value.to_owned();
        format!(
            "insert into outbox_text (id, aggregate_type, aggregate_id, event_type, version, payload) \
             values ('00000000-0000-4000-8000-00000000c{n:03}', {}, 1, {});",
            values[..3].join(", "),
            values[3]
        )
    };
    let poisons = [
        bad(1, "aggregate_id", r"E'u-\xff'"),
        bad(2, "payload", r#"E'{"status": "\xc3\x28"}'"#),
        bad(3, "event_type", r"E'Order\x80'"),
        // UTF-8, but a lone surrogate escape: JSON jsonb refuses to store.
        bad(4, "payload", r#"'{"status": "\ud800"}'"#),
    ];
    survives_on(&source, &utf8, &poisons).await;
    assert_letters(
        &utf8,
        &[
            "malformed: column `aggregate_id` is not UTF-8",
            "malformed: column `payload` is not UTF-8",
            "malformed: column `event_type` is not UTF-8",
            "malformed: column `payload` holds a lone Unicode surrogate escape",
        ],
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    source.psql("select pg_drop_replication_slot('walfold')");
}

/// A producer's newline or terminal escape inside a value neither starts a forged line
/// in the text log or in `walfold dead-letters list`, nor reaches the terminal raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producers_control_characters_forge_no_log_line() {
    let db = TestDb::new("forge");
    let text = db
        .config("")
        .replace("parallelism = 2", "parallelism = 2\nmax_attempts = 1");
    let (d, _client) = Daemon::streaming(&db, &text).await;
    db.psql(&insert_event(
        "00000000-0000-4000-8000-00000000f0e1",
        "o-forge",
        "OrderStatus",
        1,
        r#"{"status": "placed", "amount": "1\nERROR walfold forged line\u001b[2J"}"#,
    ));
    eventually(
        Duration::from_secs(60),
        "the poison's dead letters",
        || async {
            db.psql("select count(*) from walfold.dead_letter where subscriber_id is not null")
                == "3"
        },
    )
    .await;
    let (code, listed, err) =
        walfold_tests::walfold(&["dead-letters", "list", "-c", d.config_path()], &[]);
    assert_eq!(code, 0, "{err}");
    let log = d.log_text();
    for (what, out) in [("dead-letters list", &listed), ("the log", &log)] {
        assert!(out.contains("forged line"), "{what}: {out}");
        assert!(
            !out.lines().any(|l| l.starts_with("ERROR walfold forged")),
            "{what} has a forged line: {out}"
        );
        assert!(!out.contains('\u{1b}'), "{what} holds a raw escape: {out}");
    }
}
