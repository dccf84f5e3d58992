//! Watermill's SQL Pub/Sub with the PostgreSQL schema adapter.
//!
//! Tables as ThreeDotsLabs/watermill-sql's `pkg/sql/schema_adapter_postgresql.go`
//! (`DefaultPostgreSQLSchema.SchemaInitializingQueries`, quoted `"watermill_<topic>"`,
//! payload `JSON` by default) and `pkg/sql/offsets_adapter_postgresql.go` create them.
//! Rows as `InsertQuery` writes them: one insert per publish with a row per message,
//! `uuid`, payload and metadata bound, `transaction_id` `pg_current_xact_id()`; the
//! metadata is the JSON of the message's string map (`pkg/sql/schema_adapter.go`,
//! `defaultInsertArgs`). The CQRS event bus's `JSONMarshaler`
//! (ThreeDotsLabs/watermill `components/cqrs/marshaler_json.go`) sets metadata `name` to
//! the Go type (`events.OrderPlaced`). The message UUID is any text of up to 36
//! characters: `watermill.NewUUID()`, or `watermill.NewULID()`; nothing makes it unique,
//! and a publish retried after a lost acknowledgement writes the same message again.
//! Consumers ack by upserting their offset; rows are never updated or deleted. The
//! statements are ours.

use super::Framework;

const DDL: &str = r#"
create table "watermill_orders" (
  "offset" bigserial,
  "uuid" varchar(36) not null,
  "created_at" timestamp not null default current_timestamp,
  "payload" json default null,
  "metadata" json default null,
  "transaction_id" xid8 not null,
  primary key ("transaction_id", "offset")
);
create table "watermill_offsets_orders" (
  consumer_group varchar(255) not null,
  offset_acked bigint,
  last_processed_transaction_id xid8 not null,
  primary key(consumer_group)
);
create table order_totals (order_id text primary key, events integer not null, total numeric not null);
"#;

/// One message: (uuid, metadata, payload).
type Message<'a> = (&'a str, String, String);

/// An event as the CQRS event bus marshals it.
fn event<'a>(uuid: &'a str, name: &str, order: &str, amount: &str) -> Message<'a> {
    (
        uuid,
        format!(r#"{{"name":"events.{name}","correlation_id":"01JEQ3D2W8K9Z5N7B4C6V1X0TQ"}}"#),
        format!(r#"{{"order_id":"{order}","amount":{amount},"currency":"EUR"}}"#),
    )
}

/// One publish: an insert of every message with the publisher's transaction ID.
fn publish(messages: &[Message]) -> String {
    let rows: Vec<String> = messages
        .iter()
        .map(|(uuid, metadata, payload)| {
            format!("('{uuid}', '{payload}', '{metadata}', pg_current_xact_id())")
        })
        .collect();
    format!(
        "insert into \"watermill_orders\" (uuid, payload, metadata, transaction_id) values {};",
        rows.join(",")
    )
}

pub fn framework() -> Framework {
    let placed_b = "01JEQ3D2W8K9Z5N7B4C6V1X0TR";
    let writes = vec![
        // The event bus's marshaler set up with `NewUUID: watermill.NewULID`: every
        // message ID a ULID, no UUID. Two events published in one call (one insert).
        publish(&[
            event("01JEQ3D2W8K9Z5N7B4C6V1X0TN", "OrderPlaced", "o-1", "30.5"),
            event("01JEQ3D2W8K9Z5N7B4C6V1X0TP", "OrderLineAdded", "o-1", "4.5"),
        ]),
        publish(&[event(placed_b, "OrderPlaced", "o-2", "12.25")]),
        // The publish of o-2's event retried after a lost acknowledgement: the same
        // message again, in a transaction of its own.
        publish(&[event(placed_b, "OrderPlaced", "o-2", "12.25")]),
        publish(&[event(
            "01JEQ3D2W8K9Z5N7B4C6V1X0TS",
            "OrderLineAdded",
            "o-2",
            "7",
        )]),
        // Published with the plain publisher, no marshaler: no name.
        publish(&[(
            "01JEQ3D2W8K9Z5N7B4C6V1X0TT",
            "{}".to_owned(),
            r#"{"order_id":"o-3","amount":1}"#.to_owned(),
        )]),
    ];
    Framework {
        preset: "watermill",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            // No rows before walfold: nothing to propose from.
            "# STAND-IN: aggregate_id is the message `uuid`",
            "aggregate_id = \"uuid\"",
        ],
        history: Vec::new(),
        writes,
        // A consumer group acks what it processed.
        text_ids: true,
        later: vec![
            "insert into \"watermill_offsets_orders\" (offset_acked, last_processed_transaction_id, consumer_group) \
             select max(\"offset\"), max(transaction_id), 'billing' from \"watermill_orders\" \
             on conflict (consumer_group) do update set offset_acked = excluded.offset_acked, \
             last_processed_transaction_id = excluded.last_processed_transaction_id;"
                .into(),
        ],
        events: 4,
        dead_letters: &["event_type"],
        read_model: "select string_agg(order_id || ' ' || events || ' ' || total, ', ' order by order_id) \
                     from order_totals",
        fold: r#"select string_agg(order_id || ' ' || events || ' ' || total, ', ' order by order_id)
                 from (select payload->>'order_id' as order_id, count(*) as events,
                         sum((payload->>'amount')::numeric) as total
                       from (select distinct on (uuid) uuid, payload from "watermill_orders"
                             where metadata->>'name' is not null order by uuid, "offset") m
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watermill_folds_a_topic_table_through_the_readme_and_init() {
    framework().run().await;
}
