//! Rails Event Store with the ActiveRecord repository, generated with
//! `--data-type=jsonb` and a JSON serializer.
//!
//! Tables as RailsEventStore/rails_event_store's `ruby_event_store-active_record/lib/
//! ruby_event_store/active_record/generators/templates/postgres/
//! create_event_store_events_template.erb` creates them, in the SQL ActiveRecord makes
//! of it (`event_store_events`: bigserial `id`, `event_id` uuid unique, `event_type`,
//! `metadata` and `data` jsonb, `created_at` and `valid_at` timestamp(6), their indexes
//! and the `COALESCE(valid_at, created_at)` one; `event_store_events_in_streams`:
//! `stream`, `position`, `event_id` referencing the event, unique `(stream, position)`
//! and `(stream, event_id)`). Rows as `event_repository.rb`'s `append_to_stream` writes
//! them: in one transaction, one multi-row insert of the events (`insert_all!`), then
//! one of their links to the stream (`Ordering::Order$<id>`, positions from 0). The
//! event row carries no stream: the documented block reads the order from the payload,
//! and `walfold init` proposes the same from the row the table held before. An event ID
//! is unique: no row repeats. The statements are ours.

use super::Framework;

const DDL: &str = r#"
create table event_store_events (id bigserial primary key, event_id uuid not null,
  event_type character varying not null, metadata jsonb, data jsonb not null,
  created_at timestamp(6) without time zone not null, valid_at timestamp(6) without time zone);
create unique index index_event_store_events_on_event_id on event_store_events (event_id);
create index index_event_store_events_on_event_type on event_store_events (event_type);
create index index_event_store_events_on_created_at on event_store_events (created_at);
create index index_event_store_events_on_valid_at on event_store_events (valid_at);
create index index_event_store_events_on_as_of on event_store_events (coalesce(valid_at, created_at));
create table event_store_events_in_streams (id bigserial primary key, stream character varying not null,
  position integer, event_id uuid not null references event_store_events (event_id),
  created_at timestamp(6) without time zone not null);
create unique index index_event_store_events_in_streams_on_stream_and_position on event_store_events_in_streams (stream, position);
create unique index index_event_store_events_in_streams_on_stream_and_event_id on event_store_events_in_streams (stream, event_id);
create index index_event_store_events_in_streams_on_event_id on event_store_events_in_streams (event_id);
create index index_event_store_events_in_streams_on_created_at on event_store_events_in_streams (created_at);
create table order_totals (order_id text primary key, events integer not null, total numeric not null);
"#;

/// One `publish` of `events` (type, data) to order `order`'s stream, whose last
/// position was `last` (-1: none yet).
fn publish(order: &str, last: i32, events: &[(&str, String)]) -> String {
    let meta = r#"{"correlation_id":"8b1e6c3a-2f4d-4a5b-9c6d-7e8f9a0b1c2d","request_id":"r-1"}"#;
    let rows: Vec<String> = events
        .iter()
        .enumerate()
        .map(|(n, (kind, data))| {
            format!(
                "(md5('{order}{n}{last}')::uuid, '{data}', '{meta}', 'Ordering::{kind}', \
                 clock_timestamp() at time zone 'utc', null)"
            )
        })
        .collect();
    let links: Vec<String> = (0..events.len())
        .map(|n| {
            format!(
                "('Ordering::Order${order}', {}, md5('{order}{n}{last}')::uuid, clock_timestamp() at time zone 'utc')",
                last + 1 + n as i32
            )
        })
        .collect();
    format!(
        "begin; insert into event_store_events (event_id, data, metadata, event_type, created_at, valid_at) \
         values {}; insert into event_store_events_in_streams (stream, position, event_id, created_at) values {}; commit;",
        rows.join(", "),
        links.join(", ")
    )
}

fn placed(order: &str, customer: &str, amount: &str) -> (&'static str, String) {
    (
        "OrderPlaced",
        format!(r#"{{"order_id":"{order}","customer_id":"{customer}","amount":{amount}}}"#),
    )
}

fn amended(order: &str, amount: &str) -> (&'static str, String) {
    (
        "OrderAmended",
        format!(r#"{{"order_id":"{order}","amount":{amount}}}"#),
    )
}

pub fn framework() -> Framework {
    let writes = vec![
        publish("o-1", -1, &[placed("o-1", "c-1", "30")]),
        publish(
            "o-2",
            -1,
            &[placed("o-2", "c-2", "12.5"), amended("o-2", "2.5")],
        ),
        publish("o-1", 0, &[amended("o-1", "-5")]),
    ];
    Framework {
        preset: "rails_event_store",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &["PROPOSED", "aggregate_id = \"data->>'order_id'\""],
        // Last week's order: what `walfold init` samples (not streamed, not folded).
        history: vec![publish("o-0", -1, &[placed("o-0", "c-1", "1")])],
        writes,
        later: Vec::new(),
        text_ids: false,
        events: 4,
        dead_letters: &[],
        read_model:
            "select string_agg(order_id || ' ' || events || ' ' || total, ', ' order by order_id) \
                     from order_totals",
        fold: r#"select string_agg(order_id || ' ' || events || ' ' || total, ', ' order by order_id)
                 from (select data->>'order_id' as order_id, count(*) as events, sum((data->>'amount')::numeric) as total
                       from event_store_events where data->>'order_id' <> 'o-0' group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rails_event_store_folds_its_events_by_the_payloads_order_through_the_readme_and_init() {
    framework().run().await;
}
