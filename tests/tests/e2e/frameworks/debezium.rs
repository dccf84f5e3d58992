//! Debezium's outbox as its Quarkus extension writes it.
//!
//! Table as debezium/debezium's `debezium-quarkus-outbox-common/deployment/src/main/java/
//! io/debezium/outbox/quarkus/deployment/OutboxEventHbmWriter.java` maps it (with the
//! defaults of `DebeziumOutboxCommonConfig.java`: table `OutboxEvent`, which PostgreSQL
//! folds to `outboxevent`; columns `id` uuid, `aggregatetype`, `aggregateid`, `type`
//! not null, `timestamp` an `Instant`, `payload` a Jackson `JsonNode` as
//! `varchar(8000)` JSON text through `JsonNodeAttributeConverter`, and
//! `tracingspancontext` varchar(256) with tracing on) and Hibernate 6 creates it. Rows as
//! `debezium-quarkus-outbox/runtime/src/main/java/io/debezium/outbox/quarkus/internal/
//! EventDispatcher.java` writes them: the application's `ExportedEvent`, inserted in its
//! transaction with a `uuid2` ID and removed again right away (`remove-after-insert`, on
//! by default), so the table stays empty and only the WAL holds the event. The
//! statements are ours; a trigger copies what was written into a table of the test's
//! own, for the independent fold.

use super::Framework;

const DDL: &str = r#"
create table OutboxEvent (
  id uuid not null,
  aggregatetype varchar(255) not null,
  aggregateid varchar(255) not null,
  type varchar(255) not null,
  timestamp timestamp(6) with time zone not null,
  payload varchar(8000),
  tracingspancontext varchar(256),
  primary key (id)
);
create table orders (id bigint primary key, customer_id bigint not null, status text not null);
create table order_lines (order_id text primary key, lines integer not null, total numeric not null);
-- The test's witness of what the application wrote (the outbox itself is emptied).
create table written (w_id uuid, w_type text, w_payload text);
create function witness() returns trigger language plpgsql as
  $$ begin insert into written values (new.id, new.type, new.payload); return new; end $$;
create trigger witness after insert on OutboxEvent for each row execute function witness();
"#;

/// One exported event, written and removed as the extension does.
fn export(id: &str, order: i64, kind: &str, payload: Option<&str>) -> String {
    let payload = payload.map_or("null".to_owned(), |p| format!("'{p}'"));
    format!(
        "insert into OutboxEvent (id, aggregatetype, aggregateid, type, timestamp, payload, tracingspancontext) \
         values ('{id}', 'Order', '{order}', '{kind}', now(), {payload}, \
         '#\nuber-trace-id=5f4b3c2d1e0f4a9b\\:8c7d6e5f4a3b2c1d\\:0\\:1\n'); \
         delete from OutboxEvent where id = '{id}';"
    )
}

fn created(id: &str, order: i64, lines: &[(i64, &str, u32)]) -> String {
    let items: Vec<String> = lines
        .iter()
        .map(|(line, price, quantity)| {
            format!(r#"{{"id":{line},"item":"Debezium in Action","quantity":{quantity},"totalPrice":{price},"status":"ENTERED"}}"#)
        })
        .collect();
    format!(
        "begin; insert into orders values ({order}, 123, 'ENTERED'); {} commit;",
        export(
            id,
            order,
            "OrderCreated",
            Some(&format!(
                r#"{{"id":{order},"customerId":123,"orderDate":"2026-12-03T08:43:40.512","lineItems":[{}]}}"#,
                items.join(",")
            ))
        )
    )
}

pub fn framework() -> Framework {
    let writes = vec![
        created(
            "b1a7c0de-0000-4000-8000-000000000001",
            1,
            &[(1, "39.98", 2), (2, "19.99", 1)],
        ),
        created(
            "b1a7c0de-0000-4000-8000-000000000002",
            2,
            &[(3, "59.97", 3)],
        ),
        format!(
            "begin; update orders set status = 'CANCELLED' where id = 1; {} commit;",
            export(
                "b1a7c0de-0000-4000-8000-000000000003",
                1,
                "OrderLineUpdated",
                Some(
                    r#"{"orderId":1,"orderLineId":2,"oldStatus":"ENTERED","newStatus":"CANCELLED"}"#
                )
            )
        ),
        // An ExportedEvent whose getPayload() returned null.
        format!(
            "begin; {} commit;",
            export(
                "b1a7c0de-0000-4000-8000-000000000004",
                2,
                "OrderCreated",
                None
            )
        ),
    ];
    Framework {
        preset: "debezium",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[],
        history: Vec::new(),
        writes,
        text_ids: false,
        later: Vec::new(),
        events: 3,
        dead_letters: &["payload"],
        read_model:
            "select string_agg(order_id || ' ' || lines || ' ' || total, ', ' order by order_id) \
                     from order_lines",
        fold: r#"select string_agg(order_id || ' ' || lines || ' ' || total, ', ' order by order_id)
                 from (select p->>'id' as order_id, count(*) as lines, sum((l->>'totalPrice')::numeric) as total
                       from (select w_payload::jsonb as p from written where w_type = 'OrderCreated' and w_payload is not null) c,
                            jsonb_array_elements(p->'lineItems') l
                       group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_folds_its_quarkus_outbox_through_the_readme_and_init() {
    framework().run().await;
}
