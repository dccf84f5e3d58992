//! Outboxes as applications write them, end to end with the real `walfold` binary:
//! partitioned outboxes, several outboxes in one pipeline, names in every ORM's
//! convention, and what walfold refuses (with the fix) instead of dropping events.

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{caught_up, eventually, insert_event, slot_active, Daemon, TestDb};

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
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
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

/// The standard outbox, partitioned by `occurred_at` (two partitions).
const PARTITIONED: &str = "
drop table outbox;
create table outbox (
    id uuid, aggregate_type text, aggregate_id text, event_type text,
    version bigint, payload jsonb, headers jsonb, occurred_at timestamptz not null)
    partition by range (occurred_at);
create table outbox_old partition of outbox for values from (minvalue) to ('2026-01-01');
create table outbox_new partition of outbox for values from ('2026-01-01') to ('2030-01-01');
";

/// An insert into `table` of one event with `occurred_at` `at`.
fn insert_at(table: &str, id: &str, order: &str, at: &str) -> String {
    format!(
        "insert into {table} (id, aggregate_type, aggregate_id, event_type, version, payload, occurred_at) \
         values ('{id}', 'order', '{order}', 'OrderPaid', 1, '{{\"amount\": \"1\"}}', '{at}');"
    )
}

fn uuid(n: u32) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_outbox_flows_through_its_root() {
    let db = TestDb::new("partitioned");
    db.psql(PARTITIONED);
    let (mut d, client) = Daemon::streaming(&db, &db.config("")).await;
    assert_eq!(
        db.psql("select pubviaroot from pg_publication where pubname = 'walfold_outbox'"),
        "t"
    );
    // Both partitions in one transaction, a COPY, and a row written to a partition itself.
    db.psql(&format!(
        "begin; {} {} commit;",
        insert_at("outbox", &uuid(1), "o-1", "2025-06-01"),
        insert_at("outbox", &uuid(2), "o-2", "2027-06-01"),
    ));
    db.psql(&format!(
        "copy outbox (id, aggregate_type, aggregate_id, event_type, version, payload, occurred_at) from program \
         'printf \"{}\\torder\\to-3\\tOrderPaid\\t1\\t{{}}\\t2025-01-01\\n{}\\torder\\to-4\\tOrderPaid\\t1\\t{{}}\\t2028-01-01\\n\"'",
        uuid(3),
        uuid(4)
    ));
    db.psql(&insert_at("outbox_new", &uuid(5), "o-5", "2028-06-01"));
    caught_up(&client, 5, 3).await;

    // A partition attached while running flows without a restart; detaching, dropping
    // and truncating partitions are no events and stop nothing.
    db.psql(
        "create table outbox_later (like outbox including defaults); \
         alter table outbox attach partition outbox_later for values from ('2030-01-01') to (maxvalue);",
    );
    db.psql(&insert_at("outbox", &uuid(6), "o-6", "2031-01-01"));
    caught_up(&client, 6, 3).await;
    db.psql("alter table outbox detach partition outbox_old");
    db.psql(&insert_at("outbox_old", &uuid(7), "o-7", "2025-01-01"));
    db.psql("drop table outbox_old");
    db.psql("truncate outbox_later");
    db.psql("truncate outbox");
    db.psql(&insert_at("outbox", &uuid(8), "o-8", "2027-01-01"));
    caught_up(&client, 7, 3).await;
    assert!(d.exited().is_none(), "{}", d.log_text());
    assert_eq!(
        db.psql("select count(*) from walfold.event_log where event_id = '00000000-0000-4000-8000-000000000007'"),
        "0",
        "a detached partition is no outbox"
    );

    // Restarting compares membership with what was added to the publication (the root),
    // not with the partitions pg_publication_tables lists.
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    let mut d = Daemon::start(&db.config(""), &[]);
    slot_active(&client).await;
    db.psql(&insert_at("outbox", &uuid(9), "o-9", "2027-02-01"));
    caught_up(&client, 8, 3).await;
    assert_eq!(db.psql("select count(*) from ledger"), "8");

    // A publication made without publish_via_partition_root (PostgreSQL's default) is
    // refused with the fix, and doctor says so.
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    db.psql("alter publication walfold_outbox set (publish_via_partition_root = false)");
    let mut d = Daemon::start(&db.config(""), &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    let fix = "alter publication \"walfold_outbox\" set (publish_via_partition_root = true)";
    assert!(d.log_text().contains(fix), "{}", d.log_text());
    let cfg = walfold_tests::write_config(&db.config(""));
    let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  publication walfold_outbox publishes the partitioned outbox public.outbox under its partitions' names"),
        "{out}"
    );
    assert!(out.contains(fix), "{out}");
    db.psql("alter publication walfold_outbox set (publish_via_partition_root = true)");
    let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
    assert!(
        out.contains("ok    publication walfold_outbox: publish_via_partition_root = true"),
        "{out}"
    );
    assert_eq!(code, 0, "{out}");
}

/// Starts `walfold run` on `config` and expects it to refuse at start, saying `parts`.
async fn refused(config: &str, parts: &[&str]) {
    let mut d = Daemon::start(config, &[]);
    assert_eq!(d.wait_exit("the daemon to refuse").await, Some(1));
    let log = d.log_text();
    for part in parts {
        assert!(log.contains(part), "no `{part}` in:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_walfold_cannot_follow_is_refused_at_start_with_the_fix() {
    let db = TestDb::new("refused");
    let config = db.config("");
    let with = |from: &str, to: &str| {
        assert!(config.contains(from));
        config.replacen(from, to, 1)
    };
    // A name outside the rule is a config error (exit 2) naming its key.
    for (from, to, key) in [
        (
            "[[outbox]]",
            "publication = \"pub-lish\"\n\n[[outbox]]",
            "source.publication",
        ),
        (
            "table = \"public.outbox\"",
            "table = \"public.out box\"",
            "outbox[0].table",
        ),
        (
            "[pipeline]",
            "[target]\nschema = \"Wal.fold\"\n\n[pipeline]",
            "target.schema",
        ),
    ] {
        let cfg = walfold_tests::write_config(&with(from, to));
        let (code, _, err) = walfold_tests::walfold(&["run", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(key) && err.contains("1-63 ASCII letters"),
            "{err}"
        );
    }
    db.psql(
        "create table pouts (like outbox) partition by list (aggregate_type); \
         create table pouts_order partition of pouts for values in ('order');",
    );
    refused(
        &with(
            "table = \"public.outbox\"",
            "table = \"public.pouts_order\"",
        ),
        &[
            "outbox table public.pouts_order is a partition of public.pouts",
            "set outbox[0].table = \"public.pouts\"",
        ],
    )
    .await;
    refused(
        &with("table = \"public.outbox\"", "table = \"public.Outbox\""),
        &[
            "outbox table public.Outbox does not exist",
            "names are case-sensitive: set outbox[0].table = \"public.outbox\"",
        ],
    )
    .await;
    refused(
        &with(
            "table = \"public.outbox\"",
            "table = \"public.outbox\"\naggregate_id = \"Aggregate_ID\"",
        ),
        &[
            "outbox table public.outbox has no column `Aggregate_ID` (outbox[0].aggregate_id)",
            "names are case-sensitive: set outbox[0].aggregate_id = \"aggregate_id\"",
        ],
    )
    .await;
    assert_eq!(
        db.psql("select count(*) from pg_publication"),
        "0",
        "nothing was created for a refused config"
    );

    let cases: &[(&str, &[&str])] = &[
        (
            "create publication walfold_outbox for all tables",
            &["publication walfold_outbox is FOR ALL TABLES", "create publication ... for table"],
        ),
        (
            "create publication walfold_outbox for tables in schema public",
            &["publication walfold_outbox is FOR TABLES IN SCHEMA public"],
        ),
        (
            "create publication walfold_outbox for table outbox, order_state",
            &[
                "publication walfold_outbox also publishes public.order_state, which is no [[outbox]]",
                "alter publication \"walfold_outbox\" drop table \"public\".\"order_state\"",
            ],
        ),
        (
            "create publication walfold_outbox for table outbox where (aggregate_type = 'order')",
            &["publishes public.outbox with a row filter or column list"],
        ),
        (
            "create publication walfold_outbox for table outbox with (publish = 'delete')",
            &[
                "does not publish inserts",
                "alter publication \"walfold_outbox\" set (publish = 'insert, truncate')",
            ],
        ),
    ];
    let cfg = walfold_tests::write_config(&config);
    for (publication, parts) in cases {
        db.psql(&format!(
            "drop publication if exists walfold_outbox; {publication}"
        ));
        refused(&config, parts).await;
        let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("FAIL") && l.contains(parts[0])),
            "{out}"
        );
    }
    // A publication without publish_via_partition_root is fine for plain tables (it
    // is PostgreSQL's default: existing deployments have such publications).
    db.psql("drop publication walfold_outbox; create publication walfold_outbox for table outbox");
    let (d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;
    drop(d);
}

/// One convention an application's outbox may follow, end to end.
struct Shape {
    name: &'static str,
    /// The outbox (and any read model besides `read_model`).
    ddl: &'static str,
    /// `[[outbox]]` sections (and projections besides `read_model`).
    outboxes: &'static str,
    publication: &'static str,
    target_schema: &'static str,
    /// Writes the events `o-1` (amount 1) and `o-2` (amount 2).
    writes: &'static str,
    /// Besides `read_model`: a query and what it must return.
    check: Option<(&'static str, &'static str)>,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "prisma",
        ddl: r#"create table "OutboxEvent" ("id" text not null primary key, "aggregateType" text not null,
                 "aggregateId" text not null, "eventType" text not null, "payload" jsonb not null,
                 "createdAt" timestamp(3) not null default current_timestamp)"#,
        outboxes: r#"[[outbox]]
table = "OutboxEvent"
aggregate_type = "aggregateType"
aggregate_id = "aggregateId"
event_type = "eventType"
payload = "payload"
"#,
        publication: "walfold_outbox",
        target_schema: "walfold",
        writes: r#"insert into "OutboxEvent" ("id", "aggregateType", "aggregateId", "eventType", "payload") values
                 ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', '{"amount": "1"}'),
                 ('00000000-0000-4000-8000-000000000002', 'order', 'o-2', 'OrderPaid', '{"amount": "2"}')"#,
        check: None,
    },
    Shape {
        name: "typeorm",
        ddl: r#"create table outbox_event ("id" uuid primary key default gen_random_uuid(),
                 "aggregateType" varchar not null, "aggregateId" varchar not null, "eventType" varchar not null,
                 "payload" json not null, "version" integer not null, "createdAt" timestamptz not null default now());
                 create table "OrderSummary" ("orderId" text primary key, "lastVersion" bigint not null, "totalAmount" numeric)"#,
        outboxes: r#"[[outbox]]
table = "public.outbox_event"
aggregate_type = "aggregateType"
aggregate_id = "aggregateId"
event_type = "eventType"
occurred_at = "createdAt"

[[projection]]
name = "order_summary"
subscriber = "shapes.summary.v1"
table = "public.OrderSummary"
key = "orderId"
version_column = "lastVersion"
columns = { totalAmount = ":payload.amount::numeric" }
"#,
        publication: "walfold_outbox",
        target_schema: "walfold",
        writes: r#"insert into outbox_event ("aggregateType", "aggregateId", "eventType", "payload", "version") values
                 ('order', 'o-1', 'OrderPaid', '{"amount": "1"}', 1), ('order', 'o-2', 'OrderPaid', '{"amount": "2"}', 1)"#,
        check: Some((
            r#"select string_agg("orderId" || '=' || "totalAmount" || '@' || "lastVersion", ',' order by "orderId") from "OrderSummary""#,
            "o-1=1@1,o-2=2@1",
        )),
    },
    Shape {
        name: "rails_django",
        ddl: "create table app_outboxevent (id bigserial primary key, event_id uuid not null unique,
                 aggregate_type varchar(255) not null, aggregate_id varchar(255) not null,
                 event_type varchar(255) not null, payload jsonb not null, created_at timestamptz not null default now())",
        outboxes: r#"[[outbox]]
table = "app_outboxevent"
id = "event_id"
occurred_at = "created_at"
"#,
        publication: "walfold_outbox",
        target_schema: "walfold",
        writes: r#"insert into app_outboxevent (event_id, aggregate_type, aggregate_id, event_type, payload) values
                 ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', '{"amount": "1"}'),
                 ('00000000-0000-4000-8000-000000000002', 'order', 'o-2', 'OrderPaid', '{"amount": "2"}')"#,
        check: Some((
            "select string_agg(event_id::text, ',' order by seq) from walfold.event_log",
            "00000000-0000-4000-8000-000000000001,00000000-0000-4000-8000-000000000002",
        )),
    },
    Shape {
        name: "debezium",
        ddl: "create table outboxevent (id uuid not null primary key, aggregatetype varchar(255) not null,
                 aggregateid varchar(255) not null, type varchar(255) not null, payload jsonb)",
        outboxes: r#"[[outbox]]
table = "public.outboxevent"
aggregate_type = "aggregatetype"
aggregate_id = "aggregateid"
event_type = "type"
"#,
        publication: "walfold_outbox",
        target_schema: "walfold",
        writes: r#"insert into outboxevent values
                 ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', '{"amount": "1"}'),
                 ('00000000-0000-4000-8000-000000000002', 'order', 'o-2', 'OrderPaid', '{"amount": "2"}')"#,
        check: Some((
            "select count(*) filter (where version is null) from walfold.event_log",
            "2",
        )),
    },
    Shape {
        name: "mixed_case",
        ddl: r#"create schema "Sales"; create table "Sales"."Outbox" (id uuid, aggregate_type text,
                 aggregate_id text, event_type text, version bigint, payload jsonb)"#,
        outboxes: r#"[[outbox]]
table = "Sales.Outbox"
"#,
        publication: "PubQuoted",
        target_schema: "Walfold",
        writes: r#"insert into "Sales"."Outbox" values
                 ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', 1, '{"amount": "1"}'),
                 ('00000000-0000-4000-8000-000000000002', 'order', 'o-2', 'OrderPaid', 1, '{"amount": "2"}')"#,
        check: Some((
            r#"select (select count(*) from "Walfold".event_log) || ' ' ||
                      (select string_agg(pubname, ',') from pg_publication) || ' ' ||
                      (select count(*) from pg_namespace where nspname = 'walfold')"#,
            "2 PubQuoted 0",
        )),
    },
    Shape {
        name: "several",
        ddl: "create table orders_outbox (id uuid, aggregate_type text, aggregate_id text, event_type text,
                 version bigint, payload jsonb, occurred_at timestamptz not null) partition by range (occurred_at);
               create table orders_outbox_2025 partition of orders_outbox for values from (minvalue) to ('2026-01-01');
               create table orders_outbox_later partition of orders_outbox for values from ('2026-01-01') to (maxvalue);
               create table payments_outbox (id uuid, aggregate_type text, aggregate_id text, event_type text,
                 version bigint, payload jsonb)",
        outboxes: r#"[[outbox]]
table = "orders_outbox"

[[outbox]]
table = "payments_outbox"
"#,
        publication: "walfold_outbox",
        target_schema: "walfold",
        writes: r#"begin;
               insert into orders_outbox values ('00000000-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderPaid', 1, '{"amount": "1"}', '2025-05-01');
               insert into payments_outbox values ('00000000-0000-4000-8000-000000000002', 'order', 'o-2', 'PaymentCaptured', 1, '{"amount": "2"}');
               commit"#,
        check: Some((
            "select string_agg(event_type, ',' order by seq) from walfold.event_log",
            "OrderPaid,PaymentCaptured",
        )),
    },
];

/// The projection every shape feeds.
const READ_MODEL: &str = r#"
[[projection]]
name = "read_model"
subscriber = "shapes.read_model.v1"
sql = """
insert into read_model (aggregate_id, event_type, amount) values (:aggregate_id, :event_type, :payload.amount)
on conflict (aggregate_id) do update set event_type = excluded.event_type, amount = excluded.amount
"""
"#;

fn shape_config(url: &str, slot: &str, shape: &Shape) -> String {
    ConfigBuilder::new(url)
        .source("slot", slot)
        .source("publication", shape.publication)
        .set("target", "schema", shape.target_schema)
        .set("pipeline", "max_backoff_ms", 1000)
        .text(shape.outboxes)
        .text(READ_MODEL)
        .to_toml()
}

/// Every convention in [`SHAPES`], each in a fresh database of one cluster, all at once:
/// the real daemon streams each outbox's rows into a read model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboxes_in_every_convention_reach_their_read_models() {
    let cluster = walfold_tempdb::Cluster::shared();
    let runs = SHAPES.iter().map(|shape| async move {
        let name = cluster.create_database(shape.name).expect("create database");
        let db = TestDb { cluster, name };
        db.psql(shape.ddl);
        db.psql("create table read_model (aggregate_id text primary key, event_type text not null, amount text)");
        // Slot names are per cluster.
        let slot = format!("shape_{}", shape.name);
        let config = shape_config(&db.url(), &slot, shape);
        let mut d = Daemon::start(&config, &[]);
        let client = db.client().await;
        let active = format!(
            "select count(*) from pg_replication_slots where slot_name = '{slot}' and active"
        );
        eventually(Duration::from_secs(60), &format!("{}: streaming", shape.name), || async {
            db.psql(&active) == "1"
        })
        .await;
        db.psql(shape.writes);
        let read = "select string_agg(aggregate_id || ':' || amount, ',' order by aggregate_id) from read_model";
        eventually(Duration::from_secs(60), &format!("{}: the read model", shape.name), || async {
            client
                .query_one(read, &[])
                .await
                .ok()
                .and_then(|r| r.get::<_, Option<String>>(0))
                .as_deref()
                == Some("o-1:1,o-2:2")
        })
        .await;
        if let Some((query, expected)) = shape.check {
            assert_eq!(db.psql(query), expected, "{}", shape.name);
        }
        let cfg = walfold_tests::write_config(&config);
        let (code, out, _) = walfold_tests::walfold(&["doctor", "-c", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{}: doctor\n{out}", shape.name);
        assert_eq!(d.terminate(Duration::from_secs(30)), Some(0), "{}\n{}", shape.name, d.log_text());
    });
    futures::future::join_all(runs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_before_the_first_event_is_detected_like_any_lost_slot() {
    // Created by a backfill: its start is the ingest position.
    let db = TestDb::new("early_loss");
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    let config = db.config("");
    let cfg = walfold_tests::write_config(&config);
    let (code, out, err) = walfold_tests::walfold(
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
    assert_eq!(
        db.psql(
            "select i.lsn = s.confirmed_flush_lsn and i.lsn > '0/0' from walfold.ingest_position i \
             join pg_replication_slots s on s.slot_name = i.slot"
        ),
        "t"
    );
    let start = db.psql("select lsn from walfold.ingest_position");
    db.psql("select pg_drop_replication_slot('walfold')");
    db.psql(&insert_event(
        ID[1],
        "o-2",
        "OrderPaid",
        1,
        r#"{"amount": "2"}"#,
    ));
    refused(
        &config,
        &["is missing, but walfold had ingested through it up to"],
    )
    .await;
    assert_eq!(
        db.psql("select count(*) from pg_replication_slots where slot_name = 'walfold'"),
        "0"
    );
    // Opted in: recreated, with the skipped range on record from the recorded start.
    let mut d = Daemon::start(&config, &[("WALFOLD_SOURCE__ON_SLOT_LOST", "recreate")]);
    let client = db.client().await;
    slot_active(&client).await;
    // A slot is active already while pg_create_logical_replication_slot builds it, before
    // walfold closes the gap with its start.
    let gap = format!(
        "select reason || ' ' || (from_lsn = '{start}') || ' ' || (to_lsn > from_lsn) from walfold.slot_gap"
    );
    eventually(Duration::from_secs(30), "the gap closed", || async {
        db.psql(&gap) == "missing true true"
    })
    .await;
    db.psql(&insert_event(
        ID[2],
        "o-3",
        "OrderPaid",
        1,
        r#"{"amount": "3"}"#,
    ));
    caught_up(&client, 2, 3).await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // Created by the daemon, stopped before any event: the same.
    let db = TestDb::new("early_loss_run");
    let config = db
        .config("")
        .replace("[source]", "[source]\nslot = \"early_run\"");
    let mut d = Daemon::start(&config, &[]);
    let active =
        "select count(*) from pg_replication_slots where slot_name = 'early_run' and active";
    eventually(Duration::from_secs(30), "the slot to be active", || async {
        db.psql(active) == "1"
    })
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
    assert_eq!(
        db.psql("select lsn > '0/0' from walfold.ingest_position where slot = 'early_run'"),
        "t"
    );
    db.psql("select pg_drop_replication_slot('early_run')");
    refused(
        &config,
        &["replication slot early_run is missing, but walfold had ingested"],
    )
    .await;
}

/// Waits until `slot`'s ingest position reaches `lsn`.
async fn ingested_through(db: &TestDb, slot: &str, lsn: &str) {
    let sql = format!(
        "select coalesce((select lsn >= '{lsn}' from walfold.ingest_position where slot = '{slot}'), false)"
    );
    eventually(
        Duration::from_secs(60),
        &format!("{slot} to ingest through {lsn}"),
        || async { db.psql(&sql) == "t" },
    )
    .await;
}

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
async fn an_outbox_column_renamed_while_running_stops_ingest_instead_of_dead_lettering() {
    let db = TestDb::new("renamed");
    let config = db.config("");
    let (mut d, client) = Daemon::streaming(&db, &config).await;
    db.psql(&insert_event(
        ID[0],
        "o-1",
        "OrderPaid",
        1,
        r#"{"amount": "1"}"#,
    ));
    caught_up(&client, 1, 3).await;
    db.psql("alter table outbox rename column event_type to kind");
    db.psql(
        &insert_event(ID[1], "o-2", "OrderPaid", 1, r#"{"amount": "2"}"#)
            .replace("event_type", "kind"),
    );
    let after = db.psql("select pg_current_wal_lsn()");
    eventually(
        Duration::from_secs(30),
        "ingest stops naming the column",
        || {
            let log = d.log_text();
            async move { log.contains("wrote rows without column `event_type` (outbox.event_type); its rows have the columns (id, aggregate_type, aggregate_id, kind,") }
        },
    )
    .await;
    assert!(
        d.exited().is_none(),
        "an environment error: the daemon stays and retries"
    );
    assert!(
        !d.log_text().contains('\u{1b}'),
        "a log file gets no terminal colours"
    );
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert!(
        slot_before(&db, &after),
        "its transaction is not acknowledged"
    );
    assert_eq!(db.psql("select count(*) from walfold.event_log"), "1");

    // The fix the message names: map the new column name and restart.
    d.kill();
    let fixed = config.replace(
        "table = \"public.outbox\"\n",
        "table = \"public.outbox\"\nevent_type = \"kind\"\n",
    );
    let mut d = Daemon::start(&fixed, &[]);
    caught_up(&client, 2, 3).await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));

    // Renamed while walfold is stopped, with rows of both shapes in the slot: the old
    // name until ingest passes the old rows, then the new one.
    db.psql(
        &insert_event(ID[2], "o-3", "OrderPaid", 1, r#"{"amount": "3"}"#)
            .replace("event_type", "kind"),
    );
    db.psql("alter table outbox rename column kind to type");
    db.psql(
        &insert_event(ID[3], "o-4", "OrderPaid", 1, r#"{"amount": "4"}"#)
            .replace("event_type", "type"),
    );
    let new_name = config.replace(
        "table = \"public.outbox\"\n",
        "table = \"public.outbox\"\nevent_type = \"type\"\n",
    );
    let mut d = Daemon::start(&new_name, &[]);
    eventually(Duration::from_secs(30), "the old rows to stop it", || {
        let log = d.log_text();
        async move { log.contains("wrote rows without column `type`") }
    })
    .await;
    d.kill();
    let mut d = Daemon::start(&fixed, &[]);
    caught_up(&client, 3, 3).await;
    eventually(Duration::from_secs(30), "the new rows to stop it", || {
        let log = d.log_text();
        async move { log.contains("wrote rows without column `kind`") }
    })
    .await;
    d.kill();
    let mut d = Daemon::start(&new_name, &[]);
    caught_up(&client, 4, 3).await;
    assert_eq!(db.psql("select count(*) from walfold.dead_letter"), "0");
    assert_eq!(d.terminate(Duration::from_secs(30)), Some(0));
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
