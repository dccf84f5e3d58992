//! Eventuate Tram.
//!
//! Table as eventuate-foundation/eventuate-common's `postgres/1.initialize-database.sql`
//! (schema `eventuate`) and `postgres/2.initialize-database.sql` create it:
//! `eventuate.message(id varchar(1000) primary key, destination text, headers text,
//! payload text, published smallint default 0, creation_time bigint)`. Rows as
//! `eventuate-common-jdbc/.../EventuateCommonJdbcOperations.java`
//! (`insertIntoMessageTable`, default IDs) writes them: one insert per message, the ID an
//! Int128 string (`%016x-%016x`), `headers` the JSON of a string map, `creation_time`
//! epoch milliseconds; the CDC service later sets `published = 1`. Domain events carry
//! `event-aggregate-type`, `event-aggregate-id` and `event-type` headers (Tram's
//! `EventMessageHeaders`); saga commands in the same table carry `command_type` instead.
//! The ID is the primary key: no duplicate. The statements below are ours.

use super::Framework;

const DDL: &str = r#"
create schema eventuate;
create table eventuate.message (
  id varchar(1000) primary key,
  destination text not null,
  headers text not null,
  payload text not null,
  published smallint default 0,
  creation_time bigint
);
create table eventuate.received_messages (
  consumer_id varchar(1000),
  message_id varchar(1000),
  creation_time bigint,
  primary key (consumer_id, message_id)
);
create table eventuate.offset_store (
  client_name varchar(255) not null primary key,
  serialized_offset varchar(255)
);
create table order_state (order_id text primary key, state text, events integer not null);
"#;

const ORDER: &str = "io.eventuate.examples.tram.ordersandcustomers.orders.domain.Order";

/// A domain event of `Order` `order`, as `DomainEventPublisher.publish` writes it.
fn event(id: &str, order: &str, kind: &str, payload: &str) -> String {
    let headers = format!(
        r#"{{"PARTITION_ID":"{order}","event-aggregate-type":"{ORDER}","DATE":"Thu, 3 Dec 2026 08:43:40 GMT","event-aggregate-id":"{order}","event-type":"io.eventuate.examples.tram.ordersandcustomers.orders.domain.events.{kind}","DESTINATION":"{ORDER}","ID":"{id}"}}"#
    );
    insert(id, ORDER, &headers, payload)
}

/// A saga command to the customer service (no `event-type`: not an event).
fn command(id: &str, order: &str) -> String {
    let headers = format!(
        r#"{{"command_saga_type":"io.eventuate.examples.tram.ordersandcustomers.orders.sagas.createorder.CreateOrderSaga","command_saga_id":"{order}","command_type":"io.eventuate.examples.tram.ordersandcustomers.customers.commands.ReserveCreditCommand","command_reply_to":"io.eventuate.examples.tram.ordersandcustomers.orders.sagas.createorder.CreateOrderSaga-reply","command__destination":"customerService","DESTINATION":"customerService","ID":"{id}"}}"#
    );
    insert(
        id,
        "customerService",
        &headers,
        r#"{"orderId":1,"orderTotal":{"amount":30.5},"customerId":7}"#,
    )
}

fn insert(id: &str, destination: &str, headers: &str, payload: &str) -> String {
    format!(
        "insert into eventuate.message (id, destination, headers, payload, creation_time) \
         values ('{id}', '{destination}', '{headers}', '{payload}', round(extract(epoch from current_timestamp) * 1000));"
    )
}

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    let id = |n: u32| format!("0000018c2f4e6a{n:02x}-0242ac1200050000");
    let writes = vec![
        format!(
            "begin; {} {} commit;",
            event(
                &id(1),
                "1001",
                "OrderCreatedEvent",
                r#"{"orderDetails":{"customerId":7,"orderTotal":{"amount":30.5}},"state":"PENDING"}"#
            ),
            command(&id(2), "1001"),
        ),
        event(
            &id(3),
            "1002",
            "OrderCreatedEvent",
            r#"{"orderDetails":{"customerId":8,"orderTotal":{"amount":12.25}},"state":"PENDING"}"#,
        ),
        event(
            &id(4),
            "1001",
            "OrderApprovedEvent",
            r#"{"orderDetails":{"customerId":7,"orderTotal":{"amount":30.5}},"state":"APPROVED"}"#,
        ),
        event(
            &id(5),
            "1002",
            "OrderRejectedEvent",
            r#"{"orderDetails":{"customerId":8,"orderTotal":{"amount":12.25}},"state":"REJECTED"}"#,
        ),
        // A message published with a plain string payload: no JSON.
        event(&id(6), "1003", "OrderCreatedEvent", "order 1003 created"),
        command(&id(7), "1002"),
    ];
    Framework {
        preset: "eventuate_tram",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        // The CDC service marks what it relayed.
        later: vec!["update eventuate.message set published = 1;".into()],
        text_ids: true,
        events: 4,
        dead_letters: &["json"],
        read_model:
            "select string_agg(order_id || ' ' || state || ' ' || events, ', ' order by order_id) \
                     from order_state",
        fold: r#"select string_agg(order_id || ' ' || state || ' ' || events, ', ' order by order_id)
                 from (select headers::jsonb->>'event-aggregate-id' as order_id,
                         (array_agg(payload::jsonb->>'state' order by id desc))[1] as state, count(*) as events
                       from eventuate.message
                       where headers::jsonb->>'event-type' is not null and payload like '{%'
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventuate_tram_folds_its_domain_events_through_the_readme_and_init() {
    framework().run().await;
}
