//! NServiceBus SQL persistence outbox, PostgreSQL dialect.
//!
//! Table as Particular/NServiceBus.Persistence.Sql's `src/ScriptBuilder/Outbox/
//! Create_PostgreSql.sql` creates it for endpoint `Sales` (table prefix `Sales_`):
//! `"MessageId"` varchar(200) primary key, `"Dispatched"`, `"DispatchedAt"`,
//! `"PersistenceVersion"`, `"Operations"` jsonb, two btree indexes. Rows as
//! `src/SqlPersistence/Outbox/OptimisticConcurrencyControlStrategy.cs` (the default)
//! stores them with `SqlDialect_PostgreSql.cs`' statements: one insert per incoming
//! message handled, in the handler's transaction, `"Operations"` the JSON array of its
//! outgoing messages (`SerializableOperation.cs`: `Body` as base64, `Headers`,
//! `MessageId`, `Options`), then an update once dispatched (`"Dispatched" = true`,
//! `"Operations" = '[]'`) and a delete by the cleanup. Outgoing message IDs are GUIDs; a
//! handler that sets them deterministically (`SetMessageId`) writes the same ID in
//! another row when it handles a second message. The statements below are ours.

use super::Framework;

const DDL: &str = r#"
create table if not exists "public"."Sales_OutboxData" (
    "MessageId" character varying(200),
    "Dispatched" boolean not null default false,
    "DispatchedAt" timestamp,
    "PersistenceVersion" character varying(23),
    "Operations" jsonb not null,
    primary key ("MessageId")
);
create index if not exists "Index_DispatchedAt" on "public"."Sales_OutboxData" using btree ("DispatchedAt" asc nulls last);
create index if not exists "Index_Dispatched" on "public"."Sales_OutboxData" using btree ("Dispatched" asc nulls last);
create table order_billing (order_id text primary key, amount numeric not null);
"#;

/// One outgoing message: (message ID, type, intent, body as the serializer wrote it).
type Operation = (&'static str, &'static str, &'static str, &'static str);

/// The outbox row for handling incoming message `incoming` (of conversation
/// `conversation`), with its outgoing `operations`. The body is base64 as Json.NET
/// writes bytes (no line breaks).
fn handled(incoming: &str, conversation: &str, operations: &[Operation]) -> String {
    let ops: Vec<String> = operations
        .iter()
        .map(|(id, kind, intent, body)| {
            format!(
                "jsonb_build_object('Body', translate(encode(convert_to('{body}', 'UTF8'), 'base64'), E'\\n', ''), \
                 'Headers', jsonb_build_object('NServiceBus.MessageId', '{id}', 'NServiceBus.MessageIntent', '{intent}', \
                   'NServiceBus.ConversationId', '{conversation}', 'NServiceBus.CorrelationId', '{incoming}', \
                   'NServiceBus.RelatedTo', '{incoming}', 'NServiceBus.OriginatingEndpoint', 'Sales', \
                   'NServiceBus.ContentType', 'application/json', \
                   'NServiceBus.EnclosedMessageTypes', 'Sales.Messages.{kind}, Sales.Messages, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null', \
                   'NServiceBus.Version', '9.2.3', 'NServiceBus.TimeSent', '2026-12-03 08:43:40:123456 Z'), \
                 'MessageId', '{id}', \
                 'Options', jsonb_build_object('EventType', 'Sales.Messages.{kind}, Sales.Messages'))"
            )
        })
        .collect();
    format!(
        "insert into \"public\".\"Sales_OutboxData\" (\"MessageId\", \"Operations\", \"PersistenceVersion\") \
         values ('{incoming}', jsonb_build_array({}), '8.1.0');",
        ops.join(", ")
    )
}

const C1: &str = "4f2a0000-0000-4000-8000-0000000000c1";
const C2: &str = "4f2a0000-0000-4000-8000-0000000000c2";

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    let writes = vec![
        // PlaceOrder handled: OrderPlaced published, BillOrder sent.
        handled(
            "6a7e0000-0000-4000-8000-000000000001",
            C1,
            &[
                (
                    "7b8f0000-0000-4000-8000-000000000001",
                    "OrderPlaced",
                    "Publish",
                    r#"{"OrderId":"o-1","Amount":30.5}"#,
                ),
                (
                    "7b8f0000-0000-4000-8000-000000000002",
                    "BillOrder",
                    "Send",
                    r#"{"OrderId":"o-1"}"#,
                ),
            ],
        ),
        handled(
            "6a7e0000-0000-4000-8000-000000000002",
            C2,
            &[(
                "7b8f0000-0000-4000-8000-000000000003",
                "OrderPlaced",
                "Publish",
                r#"{"OrderId":"o-2","Amount":12.25}"#,
            )],
        ),
        // A second incoming message for o-2 whose handler publishes OrderPlaced with the
        // ID it derives from the order: the same message again, in another row.
        handled(
            "6a7e0000-0000-4000-8000-000000000003",
            C2,
            &[
                (
                    "7b8f0000-0000-4000-8000-000000000003",
                    "OrderPlaced",
                    "Publish",
                    r#"{"OrderId":"o-2","Amount":12.25}"#,
                ),
                (
                    "7b8f0000-0000-4000-8000-000000000004",
                    "OrderPlaced",
                    "Publish",
                    r#"{"OrderId":"o-3","Amount":5}"#,
                ),
                // Serialized with the XML serializer: no JSON.
                (
                    "7b8f0000-0000-4000-8000-000000000005",
                    "OrderPlaced",
                    "Publish",
                    r#"<?xml version="1.0"?><OrderPlaced xmlns="http://tempuri.net/Sales.Messages"><OrderId>o-4</OrderId><Amount>1</Amount></OrderPlaced>"#,
                ),
            ],
        ),
    ];
    Framework {
        preset: "nservicebus",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        // Dispatched, then cleaned up: an update and a delete, neither an event.
        later: vec![
            "update \"public\".\"Sales_OutboxData\" set \"Dispatched\" = true, \
             \"DispatchedAt\" = now() at time zone 'UTC', \"Operations\" = '[]';"
                .into(),
            "delete from \"public\".\"Sales_OutboxData\" where \"MessageId\" in \
             (select \"MessageId\" from \"public\".\"Sales_OutboxData\" where \"Dispatched\" = true limit 2);"
                .into(),
        ],
        text_ids: false,
        events: 4,
        dead_letters: &["json"],
        read_model: "select string_agg(order_id || ' ' || amount, ', ' order by order_id) from order_billing",
        fold: r#"select string_agg(order_id || ' ' || amount, ', ' order by order_id)
                 from (select body->>'OrderId' as order_id, sum((body->>'Amount')::numeric) as amount
                       from (select distinct on (op->>'MessageId') op->'Headers'->>'NServiceBus.EnclosedMessageTypes' as types,
                               convert_from(decode(op->>'Body', 'base64'), 'UTF8') as text
                             from "Sales_OutboxData", jsonb_array_elements("Operations") op) d,
                            lateral (select case when text like '{%' then text::jsonb end as body) b
                       where types like 'Sales.Messages.OrderPlaced,%' and body is not null
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nservicebus_folds_each_outgoing_message_of_its_outbox_through_the_readme_and_init() {
    framework().run().await;
}
