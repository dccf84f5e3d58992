//! The outbox mapping language end to end, with the real `walfold` binary, on a schema
//! of our own (no framework's): fields as columns or expressions, identities that are no
//! UUIDs, payloads as bytes, row filters, one row as several events, and what walfold
//! refuses (a large object's `oid`) instead of folding it wrong.

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{caught_up, Daemon, TestDb};

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
