//! The outbox mapping language end to end, with the real `walfold` binary, on a schema
//! of our own (no framework's): fields as columns or expressions, identities that are no
//! UUIDs, payloads as bytes, row filters, one row as several events, and what walfold
//! refuses (a large object's `oid`) instead of folding it wrong.

use std::time::Duration;
use walfold_config::builder::ConfigBuilder;

use walfold_tests::{caught_up, eventually, walfold, write_config, Daemon, TestDb};

/// A table whose payload is a large object (`lo_import`, JPA's `@Lob` on PostgreSQL).
const DOCUMENTS: &str = "create table documents (id uuid, aggregate_type text, \
     aggregate_id text, event_type text, version bigint, payload oid)";

fn config_on(db: &TestDb, table: &str, fields: &str) -> String {
    ConfigBuilder::new(&db.url())
        .set("pipeline", "max_backoff_ms", 1000)
        .set("pipeline", "shutdown_timeout_s", 20)
        .set("log", "level", "info")
        .text(&format!("[[outbox]]\ntable = \"{table}\"\n{fields}\n"))
        .text(
            r#"
[[projection]]
name = "seen"
subscriber = "seen.v1"
sql = "insert into seen (event_id, aggregate_type, aggregate_id, event_type, payload) values (:event_id, :aggregate_type, :aggregate_id, :event_type, :payload) on conflict do nothing"
"#,
        )
        .to_toml()
}

/// The read model every test here folds into: one row per event.
const SEEN: &str = "create table seen (event_id uuid primary key, aggregate_type text, \
     aggregate_id text, event_type text, payload jsonb)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_object_payload_is_refused_at_start_and_when_a_column_becomes_one() {
    let db = TestDb::new("map_oid");
    db.psql(DOCUMENTS);
    db.psql(SEEN);
    let config = config_on(&db, "public.documents", "");
    let mut d = Daemon::start(&config, &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    let log = d.log_text();
    for part in [
        "outbox table public.documents column `payload` (outbox[0].payload) is of type oid",
        "logical decoding cannot read large objects",
        "alter the column to jsonb, json, text or bytea",
    ] {
        assert!(log.contains(part), "no `{part}` in:\n{log}");
    }
    assert_eq!(db.psql("select count(*) from pg_replication_slots"), "0");
    // doctor says the same.
    let cfg = walfold_tests::write_config(&config);
    let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  outbox table public.documents column `payload` (outbox[0].payload) is of type oid"),
        "{out}"
    );

    // A column that becomes an oid under a running walfold stops ingest before the
    // acknowledgement: the object's number is never folded.
    db.psql(
        "alter table documents drop column payload; alter table documents add column payload jsonb",
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(
        "insert into documents values ('00000000-0000-4000-8000-000000000001', 'doc', 'd-1', \
         'Written', 1, '{\"n\": 1}')",
    );
    caught_up(&client, 1, 1).await;
    db.psql(
        "alter table documents drop column payload; alter table documents add column payload oid",
    );
    let after = db.psql(
        "insert into documents values ('00000000-0000-4000-8000-000000000002', 'doc', 'd-2', \
         'Written', 2, 16400); select pg_current_wal_lsn()",
    );
    assert_eq!(d.wait_exit("the daemon to stop").await, Some(1));
    let log = d.log_text();
    assert!(
        log.contains("column `payload` (outbox.payload) is of type oid"),
        "{log}"
    );
    assert_eq!(db.psql("select count(*) from walfold.event_log"), "1");
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(
        db.psql(&format!(
            "select confirmed_flush_lsn < '{after}' from pg_replication_slots"
        )),
        "t",
        "the slot was acknowledged past the row"
    );
}

/// A shipping service's log (our own schema, no framework's): text references as
/// event IDs, the stream's type and ID in one column, bytes holding JSON, a flag for the
/// rows that are events.
const SHIPMENTS: &str = "create table shipment_log (ref text, stream text, seq bigint, \
     kind text, body bytea, filed boolean not null default true)";

/// One row per batch of parcel scans: each element of `items` is an event, identified
/// by the batch and the element's `n` together.
const PARCELS: &str = "create table parcel_batch (batch_id bigint, items jsonb)";

const SHIPMENT_FIELDS: &str = r#"id = "ref"
aggregate_type = "split_part(stream, '-', 1)"
aggregate_id = "split_part(stream, '-', 2)::bigint::text"
event_type = "kind"
version = "seq"
payload = "body"
where = "filed""#;

fn shipments_config(db: &TestDb) -> String {
    config_on(db, "public.shipment_log", SHIPMENT_FIELDS)
}

/// A shipment row; `body` is JSON text, stored as its UTF-8 bytes.
fn shipment(reference: &str, stream: &str, seq: i64, body: &str) -> String {
    format!(
        "insert into shipment_log (ref, stream, seq, kind, body) values \
         ('{reference}', '{stream}', {seq}, 'Moved', convert_to('{body}', 'UTF8'));"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_ids_bytes_and_expressions_fold_once_and_a_failing_row_dead_letters_alone() {
    let db = TestDb::new("map_text");
    db.psql(SHIPMENTS);
    db.psql(PARCELS);
    db.psql(SEEN);
    let config = shipments_config(&db).replace(
        "[[projection]]",
        r#"[[outbox]]
table = "public.parcel_batch"
expand = "items"
id = ["batch_id", "element->>'n'"]
aggregate_type = "'parcel'"
aggregate_id = "element->>'parcel'"
event_type = "'Scanned'"
payload = "element"

[[projection]]"#,
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&format!(
        "begin; {} {} {} commit;",
        shipment("SHP-0001", "shipment-1", 1, r#"{"at": "dock"}"#),
        // The same reference written twice (a producer's retry): one event.
        shipment("SHP-0001", "shipment-1", 1, r#"{"at": "dock"}"#),
        shipment("SHP-0002", "shipment-1", 2, r#"{"at": "truck"}"#),
    ));
    // Not filed: no event, no dead letter.
    db.psql(
        "insert into shipment_log values ('SHP-0003', 'shipment-1', 3, 'Moved', \
         convert_to('{}', 'UTF8'), false)",
    );
    // Its aggregate ID does not cast to bigint: dead-lettered; the next row folds.
    db.psql(&shipment("SHP-0004", "shipment-x", 1, "{}"));
    db.psql(&shipment("SHP-0005", "shipment-2", 1, r#"{"at": "hub"}"#));
    // A batch of three scans, the second without its parcel: two events, one dead letter.
    db.psql(
        r#"insert into parcel_batch values (7, '[{"n": 1, "parcel": "p-1"}, {"n": 2}, {"n": 3, "parcel": "p-2"}]')"#,
    );
    caught_up(&client, 5, 1).await;
    assert_eq!(
        db.psql(
            "select string_agg(producer_id || '=' || aggregate_type || '/' || aggregate_id \
             || '/' || coalesce(version::text, '-'), ' ' order by seq) from walfold.event_log"
        ),
        r#"SHP-0001=shipment/1/1 SHP-0002=shipment/1/2 SHP-0005=shipment/2/1 ["7","1"]=parcel/p-1/- ["7","3"]=parcel/p-2/-"#
    );
    assert_eq!(
        db.psql("select string_agg(payload::text, ' ' order by aggregate_id, event_id) from seen where aggregate_type = 'shipment'"),
        r#"{"at": "dock"} {"at": "truck"} {"at": "hub"}"#,
        "bytes read as JSON"
    );
    // The event IDs are UUIDv5 of the outbox and the producer's values (as uuid-ossp's
    // uuid_generate_v5 under walfold's namespace computes them), the same on every read.
    assert_eq!(
        db.psql("select event_id from walfold.event_log where producer_id = 'SHP-0001'"),
        walfold_event::producer_event_id("public.shipment_log", &["SHP-0001"]).to_string()
    );
    let dead = db.psql(
        "select string_agg(error, E'\\n' order by id) from walfold.dead_letter where reason = 'malformed'",
    );
    assert!(
        dead.contains(
            "aggregate_id (`split_part(stream, '-', 2)::bigint::text`): invalid input syntax for type bigint"
        ),
        "{dead}"
    );
    assert!(
        dead.contains("element 1: aggregate_id (`element->>'parcel'`) is null"),
        "{dead}"
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "2");
    assert_eq!(
        db.psql(
            "select raw->'element'->>'index' from walfold.dead_letter where error like 'element%'"
        ),
        "1"
    );
    assert_eq!(
        db.psql("select duplicates || '/' || ignored_changes from walfold.ingest_position"),
        "1/1",
        "the retried reference is a duplicate; the unfiled row is counted as ignored"
    );
    // walfold events shows the producer's ID.
    let cfg = write_config(&config);
    let (code, out, err) = walfold(&["events", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(r#""producer_id":"SHP-0002""#) || out.contains(r#""producer_id": "SHP-0002""#),
        "{out}"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_ids_survive_kill_9_mid_stream_without_doubles() {
    let db = TestDb::new("map_kill");
    db.psql(SHIPMENTS);
    db.psql(SEEN);
    let config = shipments_config(&db);
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    let write = |from: usize, to: usize| {
        let rows: String = (from..to)
            .map(|i| {
                shipment(
                    &format!("SHP-{i:05}"),
                    &format!("shipment-{}", i % 17),
                    i as i64,
                    "{}",
                )
            })
            .collect();
        db.psql(&format!("begin; {rows} commit;"));
    };
    for chunk in 0..10 {
        write(chunk * 50, chunk * 50 + 50);
        if chunk == 4 {
            d.kill_and_restart(None);
        }
    }
    // Every reference again, as a producer that retried everything would.
    write(0, 500);
    d.kill_and_restart(None);
    write(500, 600);
    caught_up(&client, 600, 1).await;
    assert_eq!(
        db.psql("select count(*) || '/' || count(distinct producer_id) from walfold.event_log"),
        "600/600"
    );
    assert_eq!(db.psql("select count(*) from seen"), "600");
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_finds_text_id_rows_the_slot_missed_and_doubles_none() {
    let db = TestDb::new("map_backfill");
    db.psql(SHIPMENTS);
    db.psql(SEEN);
    let config = shipments_config(&db);
    // Written before walfold's slot existed: the stream never sees them.
    let before: String = (0..30)
        .map(|i| shipment(&format!("OLD-{i}"), "shipment-1", i, "{}"))
        .collect();
    db.psql(&before);
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    let after: String = (0..20)
        .map(|i| shipment(&format!("NEW-{i}"), "shipment-2", i, "{}"))
        .collect();
    db.psql(&after);
    caught_up(&client, 20, 1).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let cfg = write_config(&config);
    let backfill = || {
        walfold(
            &[
                "backfill",
                "--outbox",
                "public.shipment_log",
                "--batch",
                "7",
                "-c",
                cfg.to_str().unwrap(),
            ],
            &[],
        )
    };
    let (code, out, err) = backfill();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        db.psql("select count(*) || '/' || count(distinct producer_id) from walfold.event_log"),
        "50/50",
        "{out}{err}"
    );
    // Again: everything is a duplicate.
    let (code, out, err) = backfill();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(db.psql("select count(*) from walfold.event_log"), "50");
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&shipment("NEW-20", "shipment-2", 20, "{}"));
    caught_up(&client, 51, 1).await;
    eventually(
        Duration::from_secs(30),
        "the read model to hold every event",
        || async { db.psql("select count(*) from seen") == "51" },
    )
    .await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_pages_integer_id_parts_and_row_places_in_their_own_order() {
    // Pages are cut by the key's own order, not its text's: `'10' < '9'` and
    // `'(0,10)' < '(0,9)'` ended a page past rows the next page then skipped.
    let db = TestDb::new("map_backfill_order");
    db.psql("create table readings (sensor text, n int, kind text, data jsonb)");
    db.psql(PARCELS);
    db.psql(SEEN);
    let config = config_on(
        &db,
        "public.readings",
        r#"id = ["sensor", "n"]
aggregate_type = "'reading'"
aggregate_id = "sensor"
event_type = "kind"
payload = "data""#,
    )
    .replace(
        "[[projection]]",
        r#"[[outbox]]
table = "public.parcel_batch"
expand = "items"
id = ["batch_id", "element->>'n'"]
aggregate_type = "'parcel'"
aggregate_id = "element->>'parcel'"
event_type = "'Scanned'"
payload = "element"

[[projection]]"#,
    );
    // Written before walfold's slot existed: only a backfill finds them.
    db.psql(
        "insert into readings select 's-1', g, 'Read', '{}' from generate_series(1, 30) g; \
         insert into parcel_batch select g, jsonb_build_array(jsonb_build_object('n', 1, \
         'parcel', 'p-' || g), jsonb_build_object('n', 2, 'parcel', 'p-' || g)) \
         from generate_series(1, 30) g",
    );
    let (mut d, _client) = Daemon::streaming(&db, &config).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let cfg = write_config(&config);
    for table in ["public.readings", "public.parcel_batch"] {
        let (code, out, err) = walfold(
            &[
                "backfill",
                "--outbox",
                table,
                "--batch",
                "7",
                "-c",
                cfg.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{out}{err}");
    }
    assert_eq!(
        db.psql(
            "select string_agg(aggregate_type || '=' || n, ' ' order by aggregate_type) from \
             (select aggregate_type, count(*) n from walfold.event_log group by 1) c"
        ),
        "parcel=60 reading=30"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boolean_read_by_the_mapping_gives_backfill_the_streamed_event_ids() {
    // The stream sends a boolean as `t`; `::text` says `true`: an ID with a boolean
    // part was another event when backfilled, and a rejected row another dead letter.
    let db = TestDb::new("map_backfill_bool");
    db.psql("create table flags (ref text, urgent boolean, kind text, data jsonb)");
    db.psql(SEEN);
    let config = config_on(
        &db,
        "public.flags",
        r#"id = ["ref", "urgent"]
aggregate_type = "'flag'"
aggregate_id = "ref"
event_type = "kind"
payload = "data""#,
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(
        "insert into flags values ('f-1', true, 'Set', '{}'), ('f-1', false, 'Set', '{}'), \
         ('f-2', true, 'Set', 'null')",
    );
    caught_up(&client, 2, 1).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let cfg = write_config(&config);
    let (code, out, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.flags",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        db.psql("select string_agg(producer_id, ' ' order by producer_id) from walfold.event_log"),
        r#"["f-1","f"] ["f-1","t"]"#,
        "{out}{err}"
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_filter_naming_a_column_that_is_no_boolean_is_refused_at_start() {
    // Accepted, it dead-lettered every row ("not a boolean"); PostgreSQL refuses
    // `where <text column>` before running it, and so does walfold now.
    let db = TestDb::new("map_where_text");
    db.psql(SHIPMENTS);
    db.psql(SEEN);
    let config = config_on(
        &db,
        "public.shipment_log",
        &SHIPMENT_FIELDS.replace(r#"where = "filed""#, r#"where = "kind""#),
    );
    let cfg = write_config(&config);
    let (code, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "FAIL  outbox table public.shipment_log column `kind` (outbox[0].where) is not boolean"
        ),
        "{out}"
    );
    let mut d = Daemon::start(&config, &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    assert!(
        d.log_text().contains("where = \"kind = '…'\""),
        "{}",
        d.log_text()
    );
    // The boolean column is taken.
    let config = config_on(&db, "public.shipment_log", SHIPMENT_FIELDS);
    let cfg = write_config(&config);
    let (_, out, _) = walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert!(!out.contains("(outbox[0].where)"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_outboxes_numbering_rows_from_one_give_two_events_per_number() {
    // The most common non-UUID ID there is: a bigserial. Two tables both start at 1;
    // a derived ID scoped to its outbox keeps them apart (unscoped, the second table's
    // events were quarantined as id_conflict or, with equal content, dropped).
    let db = TestDb::new("map_scope");
    db.psql(SEEN);
    for t in ["tickets", "parcels"] {
        db.psql(&format!(
            "create table {t} (id bigserial primary key, aggregate_type text not null default '{t}', \
             aggregate_id text not null default 'a-1', event_type text not null default 'Opened', \
             payload jsonb not null default '{{}}')"
        ));
    }
    let config = config_on(&db, "public.tickets", "").replace(
        "[[projection]]",
        "[[outbox]]\ntable = \"public.parcels\"\n\n[[projection]]",
    );
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    for _ in 0..3 {
        db.psql("insert into tickets default values; insert into parcels default values");
    }
    caught_up(&client, 6, 1).await;
    assert_eq!(
        db.psql(
            "select string_agg(aggregate_type || ':' || producer_id, ' ' order by aggregate_type, producer_id) \
             from walfold.event_log"
        ),
        "parcels:1 parcels:2 parcels:3 tickets:1 tickets:2 tickets:3"
    );
    assert_eq!(db.psql("select count(*) from seen"), "6");
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(
        db.psql("select event_id from walfold.event_log where aggregate_type = 'tickets' and producer_id = '2'"),
        walfold_event::producer_event_id("public.tickets", &["2"]).to_string()
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// Issue 44 (7): an outbox renamed (on the server and in the config) keeps its derived
/// event IDs with `id_scope` = its old name: a backfill of the renamed table finds every
/// row already in the log, and a producer's retry of an old ID after the rename is a
/// duplicate, so a counting projection applies each event once. Without the key, each
/// row's ID changes with the name and all of them would apply again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_renamed_with_its_old_id_scope_keeps_its_event_ids() {
    let db = TestDb::new("map_rename");
    db.psql(
        "create table tickets (id bigserial, aggregate_type text not null default 'ticket', \
         aggregate_id text not null default 'a-1', event_type text not null default 'Opened', \
         payload jsonb not null default '{}'); \
         create table tally (aggregate_id text primary key, n int not null)",
    );
    let config = |table: &str, fields: &str| {
        ConfigBuilder::new(&db.url())
            .set("pipeline", "max_backoff_ms", 1000)
            .set("pipeline", "shutdown_timeout_s", 20)
            .set("log", "level", "info")
            .text(&format!("[[outbox]]\ntable = \"{table}\"\n{fields}\n"))
            .text(
                r#"
[[projection]]
name = "tally"
subscriber = "tally.v1"
sql = "insert into tally as t (aggregate_id, n) values (:aggregate_id, 1) on conflict (aggregate_id) do update set n = t.n + 1"
"#,
            )
            .to_toml()
    };
    let before = config("public.tickets", "");
    let (mut d, client) = Daemon::streaming(&db, &before).await;
    db.psql("insert into tickets default values; insert into tickets default values; insert into tickets default values");
    caught_up(&client, 3, 1).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let old_id = db.psql("select event_id from walfold.event_log where producer_id = '2'");
    assert_eq!(
        old_id,
        walfold_event::producer_event_id("public.tickets", &["2"]).to_string()
    );

    db.psql("alter table tickets rename to tickets_v2");
    let after = config("public.tickets_v2", "id_scope = \"tickets\"");
    let cfg = write_config(&after);
    let (code, out, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.tickets_v2",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        db.psql("select count(*) from walfold.event_log"),
        "3",
        "the backfill found every row in the log: {out}{err}"
    );

    let (mut d, client) = Daemon::streaming(&db, &after).await;
    // A producer's retry of event 2 after the rename, and one new event.
    db.psql("insert into tickets_v2 (id) values (2); insert into tickets_v2 default values");
    caught_up(&client, 4, 1).await;
    eventually(
        Duration::from_secs(30),
        "the new event to apply",
        || async { db.psql("select n from tally") == "4" },
    )
    .await;
    assert_eq!(
        db.psql("select string_agg(producer_id, ' ' order by producer_id) from walfold.event_log"),
        "1 2 3 4"
    );
    assert_eq!(
        db.psql("select event_id from walfold.event_log where producer_id = '2'"),
        old_id
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        db.psql("select n from tally"),
        "4",
        "no event applied twice"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
}

/// Issue 44 (6): an outbox whose ID is an expression has no key to page by: each of its
/// partitions is read in ranges of blocks. Every row is in the log exactly once, across
/// three partitions, a stretch of empty blocks (6,000 rows deleted, not vacuumed) and a
/// `--batch` smaller than a block range, while the application inserts rows and updates
/// a column no field reads (a row's new version may be read again: a duplicate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_reads_each_partition_of_an_expression_id_outbox_in_block_ranges_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let db = TestDb::new("map_blocks");
    db.psql(SEEN);
    db.psql(
        "create table parts (n bigint not null, at date not null, stream text not null, \
           payload jsonb not null default '{}', sent boolean not null default false) \
           partition by range (at); \
         create table parts_a partition of parts for values from (minvalue) to ('2026-01-01') \
           with (autovacuum_enabled = false); \
         create table parts_b partition of parts for values from ('2026-01-01') to ('2027-01-01') \
           with (autovacuum_enabled = false); \
         create table parts_c partition of parts default with (autovacuum_enabled = false); \
         insert into parts (n, at, stream) select i, date '2025-06-01' + (i / 45), 's-' || (i % 40) \
           from generate_series(1, 30000) i; \
         delete from parts where n between 3001 and 9000",
    );
    assert_eq!(
        db.psql("select count(distinct tableoid) from parts"),
        "3",
        "rows in every partition"
    );
    let config = config_on(
        &db,
        "public.parts",
        "id = \"'P-' || n\"\naggregate_type = \"'part'\"\naggregate_id = \"stream\"\nevent_type = \"'Made'\"",
    );
    let cfg = write_config(&config);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, url) = (stop.clone(), db.url());
        tokio::spawn(async move {
            let c = walfold_pg::connect(&url).await.unwrap();
            let mut n = 100_000;
            while !stop.load(Ordering::Relaxed) {
                c.batch_execute(&format!(
                    "insert into parts (n, at, stream) select {n} + i, date '2026-03-01' + i * 200, 'w' \
                       from generate_series(0, 2) i; \
                     update parts set sent = true where n % 97 = {} and not sent",
                    n % 97
                ))
                .await
                .unwrap();
                n += 3;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            n - 100_000
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        walfold(
            &[
                "backfill",
                "--outbox",
                "public.parts",
                "--batch",
                "300",
                "-c",
                cfg.to_str().unwrap(),
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(written > 0);
    let during = db.psql("select count(*) from walfold.event_log");
    assert!(
        during.parse::<i64>().unwrap() >= 24_000,
        "the backfill read the rows there before it ({during}): {out}{err}"
    );
    let total = 24_000 + written;
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    caught_up(&client, total, 1).await;
    assert_eq!(
        db.psql("select count(*) from parts")
            .parse::<i64>()
            .unwrap(),
        total
    );
    assert_eq!(
        db.psql("select count(*) || '/' || count(distinct producer_id) from walfold.event_log"),
        format!("{total}/{total}"),
        "every row once"
    );
    assert_eq!(
        db.psql(
            "select count(*) from parts p where not exists \
             (select 1 from walfold.event_log e where e.producer_id = 'P-' || p.n)"
        ),
        "0"
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // What a page costs, counted by the server rather than timed: the tuples the
    // backfill's scans read, over every partition. Paged by `(tableoid, ctid) > (…)`,
    // each of its 80-odd pages read the whole outbox again (about 2M tuples here).
    let read = || {
        db.psql(
            "select coalesce(sum(seq_tup_read), 0) from pg_stat_user_tables \
             where relname in ('parts_a', 'parts_b', 'parts_c')",
        )
        .parse::<i64>()
        .unwrap()
    };
    let before = read();
    let cfg = write_config(&config);
    let (code, out, err) = walfold(
        &[
            "backfill",
            "--outbox",
            "public.parts",
            "--batch",
            "300",
            "-c",
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(" 0 appended"), "{out}{err}");
    let mut scanned = 0;
    for _ in 0..50 {
        scanned = read() - before;
        if scanned >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "backfill of {total} rows in 3 partitions, --batch 300: the server read {scanned} tuples"
    );
    assert!(
        (total..=2 * total).contains(&scanned),
        "the backfill's pages read {scanned} tuples for {total} rows"
    );
}
