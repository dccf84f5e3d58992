//! Outboxes in every ORM's and framework's convention, and a partitioned outbox through
//! its root: each reaches its read model.

use std::time::Duration;

use walfold_config::builder::ConfigBuilder;
use walfold_tests::{caught_up, eventually, slot_active, Daemon, TestDb};

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
