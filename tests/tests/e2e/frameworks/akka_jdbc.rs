//! Akka / Pekko Persistence JDBC, the default journal, with Jackson's JSON serializer.
//!
//! Tables as apache/pekko-persistence-jdbc's (and akka/akka-persistence-jdbc's)
//! `core/src/main/resources/schema/postgres/postgres-create-schema.sql` creates them
//! (`event_journal` with `ordering` bigserial, the primary key `(persistence_id,
//! sequence_number)`, the payload `bytea`; `event_tag` referencing it; `snapshot`;
//! `durable_state`). Rows as `JournalQueries.writeJournalRows` writes them through
//! `DefaultJournalDao`: one transaction per atomic write, its events sorted by sequence
//! number, each `insert … returning ordering`, then its tags; `deleted` false, `writer`
//! the journal's UUID, `write_timestamp` epoch milliseconds, `event_ser_id` 33 and
//! `event_ser_manifest` the event's class for `jackson-json` (its payload the event's
//! JSON bytes), 32 for `jackson-cbor` (CBOR bytes). Persistence IDs as Cluster Sharding
//! makes them, `ShoppingCart|cart-1`. A sequence number is written once (the primary
//! key). The statements are ours.

use super::Framework;

const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS public.event_journal(
  ordering BIGSERIAL,
  persistence_id VARCHAR(255) NOT NULL,
  sequence_number BIGINT NOT NULL,
  deleted BOOLEAN DEFAULT FALSE NOT NULL,
  writer VARCHAR(255) NOT NULL,
  write_timestamp BIGINT,
  adapter_manifest VARCHAR(255),
  event_ser_id INTEGER NOT NULL,
  event_ser_manifest VARCHAR(255) NOT NULL,
  event_payload BYTEA NOT NULL,
  meta_ser_id INTEGER,
  meta_ser_manifest VARCHAR(255),
  meta_payload BYTEA,
  PRIMARY KEY(persistence_id, sequence_number)
);
CREATE UNIQUE INDEX event_journal_ordering_idx ON public.event_journal(ordering);
CREATE TABLE IF NOT EXISTS public.event_tag(
    event_id BIGINT,
    persistence_id VARCHAR(255),
    sequence_number BIGINT,
    tag VARCHAR(256),
    PRIMARY KEY(persistence_id, sequence_number, tag),
    CONSTRAINT fk_event_journal
      FOREIGN KEY(persistence_id, sequence_number)
      REFERENCES event_journal(persistence_id, sequence_number)
      ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS public.snapshot (
  persistence_id VARCHAR(255) NOT NULL,
  sequence_number BIGINT NOT NULL,
  created BIGINT NOT NULL,
  snapshot_ser_id INTEGER NOT NULL,
  snapshot_ser_manifest VARCHAR(255) NOT NULL,
  snapshot_payload BYTEA NOT NULL,
  meta_ser_id INTEGER,
  meta_ser_manifest VARCHAR(255),
  meta_payload BYTEA,
  PRIMARY KEY(persistence_id, sequence_number)
);
create table cart_items (cart_id text primary key, items integer not null, checked_out boolean not null, events integer not null);
"#;

const EVENT: &str = "sample.cqrs.ShoppingCart$";
const WRITER: &str = "3f1b5c2e-8d4a-4e6f-9b0c-1a2b3c4d5e6f";

/// One atomic write of `cart`'s events: (sequence number, event, JSON), each tagged.
fn write(cart: &str, events: &[(i64, &str, &str)], serializer: i32) -> String {
    let mut tx = String::from("begin;");
    for (seq, kind, json) in events {
        tx.push_str(&format!(
            "insert into event_journal (deleted, persistence_id, sequence_number, writer, write_timestamp, \
             adapter_manifest, event_payload, event_ser_id, event_ser_manifest, meta_payload, meta_ser_id, meta_ser_manifest) \
             values (false, 'ShoppingCart|{cart}', {seq}, '{WRITER}', (extract(epoch from now()) * 1000)::bigint, '', \
             {payload}, {serializer}, '{EVENT}{kind}', null, null, null) returning ordering; \
             insert into event_tag (event_id, persistence_id, sequence_number, tag) \
             values (currval('event_journal_ordering_seq'), 'ShoppingCart|{cart}', {seq}, 'carts-{slice}');",
            payload = if serializer == 33 {
                format!("convert_to('{json}', 'UTF8')")
            } else {
                json.to_string()
            },
            slice = seq % 2,
        ));
    }
    tx.push_str("commit;");
    tx
}

fn added(cart: &str, item: &str, quantity: i32) -> String {
    format!(r#"{{"cartId":"{cart}","itemId":"{item}","quantity":{quantity}}}"#)
}

pub fn framework() -> Framework {
    let writes = vec![
        write(
            "cart-1",
            &[(1, "ItemAdded", &added("cart-1", "socks", 3))],
            33,
        ),
        write(
            "cart-2",
            &[(1, "ItemAdded", &added("cart-2", "hat", 1))],
            33,
        ),
        // One command persisting two events: one transaction.
        write(
            "cart-1",
            &[
                (
                    2,
                    "ItemRemoved",
                    r#"{"cartId":"cart-1","itemId":"socks","oldQuantity":3}"#,
                ),
                (3, "ItemAdded", &added("cart-1", "shoes", 2)),
            ],
            33,
        ),
        write(
            "cart-1",
            &[(
                4,
                "CheckedOut",
                r#"{"cartId":"cart-1","eventTime":"2026-12-07T23:59:00Z"}"#,
            )],
            33,
        ),
        // An entity whose events jackson-cbor serialized: bytes that are no JSON.
        write(
            "cart-3",
            &[(1, "ItemAdded", r"'\xa366636172744964666361727433'::bytea")],
            32,
        ),
    ];
    Framework {
        preset: "akka_jdbc",
        ddl: DDL,
        init_read_model: None,
        node_writer: false,
        init_writes: &["id = [\"persistence_id\", \"sequence_number\"]"],
        history: Vec::new(),
        writes,
        later: Vec::new(),
        text_ids: true,
        events: 5,
        dead_letters: &["not utf-8"],
        read_model: "select string_agg(cart_id || ' ' || items || ' ' || checked_out || ' ' || events, ', ' \
                     order by cart_id) from cart_items",
        fold: r#"select string_agg(cart_id || ' ' || items || ' ' || checked_out || ' ' || events, ', '
                   order by cart_id)
                 from (select convert_from(event_payload, 'UTF8')::jsonb->>'cartId' as cart_id,
                         sum(case event_ser_manifest when 'sample.cqrs.ShoppingCart$ItemAdded'
                               then (convert_from(event_payload, 'UTF8')::jsonb->>'quantity')::int
                             when 'sample.cqrs.ShoppingCart$ItemRemoved'
                               then -(convert_from(event_payload, 'UTF8')::jsonb->>'oldQuantity')::int
                             else 0 end) as items,
                         bool_or(event_ser_manifest like '%$CheckedOut') as checked_out,
                         count(*) as events
                       from event_journal where event_ser_id = 33 group by 1) f"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn akka_jdbc_folds_its_event_journal_strictly_through_the_readme_and_init() {
    framework().run().await;
}
