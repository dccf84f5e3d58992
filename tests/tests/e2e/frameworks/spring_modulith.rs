//! Spring Modulith's JDBC event publication registry, schema v2.
//!
//! Table as spring-projects/spring-modulith's `spring-modulith-events/
//! spring-modulith-events-jdbc/src/main/resources/org/springframework/modulith/events/
//! jdbc/schemas/v2/schema-postgresql.sql` creates it (`event_publication`, `id` uuid
//! primary key, `listener_id`, `event_type`, `serialized_event` text,
//! `publication_date`, `completion_date`, `status`, `completion_attempts`,
//! `last_resubmission_date`, a hash index on `serialized_event`, an index on
//! `completion_date`). Rows as `DefaultEventPublicationRegistry.store` and the JDBC
//! repository write them: for each event, one row per transactional listener of its type,
//! each with its own random ID and its own `clock.instant()`, the event serialized by
//! Jackson, `listener_id` the listener method's identifier; completed later by an update
//! (`completion_date`, `status = 'COMPLETED'`). One event is as many rows as listeners,
//! so only one listener's rows are its events. IDs are random: no duplicate. The
//! statements below are ours.

use super::Framework;

pub(super) const DDL: &str = r#"
create table if not exists event_publication (
  id                     uuid not null,
  listener_id            text not null,
  event_type             text not null,
  serialized_event       text not null,
  publication_date       timestamp with time zone not null,
  completion_date        timestamp with time zone,
  status                 text,
  completion_attempts    int,
  last_resubmission_date timestamp with time zone,
  primary key (id)
);
create index if not exists event_publication_serialized_event_hash_idx on event_publication using hash(serialized_event);
create index if not exists event_publication_by_completion_date_idx on event_publication (completion_date);
create table customer_revenue (customer_id text primary key, orders integer not null, total numeric not null);
"#;

const INVENTORY: &str =
    "com.example.inventory.InventoryManagement.on(com.example.order.OrderCompleted)";
const NOTIFY_COMPLETED: &str =
    "com.example.notification.NotificationService.on(com.example.order.OrderCompleted)";
const NOTIFY_SHIPPED: &str =
    "com.example.notification.NotificationService.on(com.example.order.OrderShipped)";

/// `ApplicationEventPublisher.publishEvent(event)` in a transaction: one row per
/// listener.
fn publish(event_type: &str, json: &str, listeners: &[&str]) -> String {
    let mut tx = String::from("begin;");
    for l in listeners {
        tx.push_str(&format!(
            "insert into event_publication (id, listener_id, event_type, serialized_event, publication_date, status, completion_attempts) \
             values (gen_random_uuid(), '{l}', 'com.example.order.{event_type}', '{json}', clock_timestamp(), 'PUBLISHED', 0);"
        ));
    }
    tx.push_str("commit;");
    tx
}

fn completed(order: &str, customer: &str, total: &str) -> String {
    publish(
        "OrderCompleted",
        &format!(r#"{{"orderId":"{order}","customerId":"{customer}","total":{total}}}"#),
        &[INVENTORY, NOTIFY_COMPLETED],
    )
}

/// The table, its rows and the fold.
pub fn framework() -> Framework {
    // Publications of last year, long completed: what `walfold init` sees of the
    // listeners (walfold never streams them).
    let history = vec![format!(
        "{} update event_publication set completion_date = publication_date, status = 'COMPLETED';",
        completed("o-0", "c-1", "1")
    )];
    let writes = vec![
        completed("o-1", "c-1", "30.5"),
        completed("o-2", "c-2", "12.25"),
        publish("OrderShipped", r#"{"orderId":"o-1"}"#, &[NOTIFY_SHIPPED]),
        completed("o-3", "c-1", "4"),
        // An event serialized by a custom EventSerializer that writes no JSON.
        publish(
            "OrderCompleted",
            "com.example.order.OrderCompleted@5e9f23b4",
            &[INVENTORY, NOTIFY_COMPLETED],
        ),
    ];
    Framework {
        preset: "spring_modulith",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &[
            "# aggregate_id: the framework's rows carry no aggregate. PROPOSED",
            "aggregate_id = \"serialized_event::jsonb->>'orderId'\"",
            "where = \"listener_id = 'com.example.inventory.InventoryManagement.on(com.example.order.OrderCompleted)'\"",
        ],
        history,
        writes,
        // The listeners complete.
        later: vec![
            "update event_publication set completion_date = now(), status = 'COMPLETED' \
             where completion_date is null;"
                .into(),
        ],
        text_ids: false,
        events: 3,
        dead_letters: &["json"],
        read_model: "select string_agg(customer_id || ' ' || orders || ' ' || total, ', ' order by customer_id) \
                     from customer_revenue",
        fold: FOLD,
    }
}

/// Per customer, the completed orders and their total: each event once (its
/// inventory listener's row), over what is not yet completed (the history is).
const FOLD: &str = r#"select string_agg(customer_id || ' ' || orders || ' ' || total, ', ' order by customer_id)
       from (select serialized_event::jsonb->>'customerId' as customer_id, count(*) as orders,
               sum((serialized_event::jsonb->>'total')::numeric) as total
             from event_publication
             where completion_date is null and event_type = 'com.example.order.OrderCompleted'
               and listener_id like 'com.example.inventory.%' and serialized_event like '{%'
             group by 1) f"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_modulith_folds_one_listeners_publications_through_the_readme_and_init() {
    framework().run().await;
}
