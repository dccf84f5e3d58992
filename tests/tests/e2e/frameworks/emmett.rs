//! Emmett (event-driven-io/emmett) with its PostgreSQL event store, written through
//! Emmett's own client: `tests/emmett/write.mjs` runs npm
//! `@event-driven-io/emmett-postgresql` 0.42.0, whose `getPostgreSQLEventStore` creates
//! the schema on first use (`src/packages/emmett-postgresql/src/eventStore/schema/
//! tables.ts`: `emt_messages` partitioned by `partition`, each partition again by
//! `is_archived`, through `emt_add_table_partition`; `emt_streams`, `emt_processors`,
//! `emt_projections`) and whose `appendToStream` calls `emt_append_to_stream`
//! (`appendToStream.ts`) in one transaction per append: message IDs random UUIDs as
//! text, `stream_position` 1, 2, … per stream, commands stored beside events as
//! `message_kind = 'C'`. The shopping carts' events are deltas: the documented block
//! folds them strictly, in version order. Nothing here writes Emmett's rows by hand.

use super::Framework;

const DDL: &str = "create table cart_totals (cart_id uuid primary key, items integer not null, \
                   total numeric not null, confirmed boolean not null, events integer not null);";

pub fn framework() -> Framework {
    Framework {
        preset: "emmett",
        ddl: DDL,
        init_read_model: None,
        node_writer: true,
        init_writes: &[
            "where = \"message_kind = 'E'\"",
            "aggregate_id = \"stream_id\"",
            "version = \"stream_position\"",
        ],
        history: Vec::new(),
        writes: Vec::new(),
        later: Vec::new(),
        text_ids: false,
        // Seven events; the command is no event.
        events: 7,
        dead_letters: &[],
        read_model: "select string_agg(cart_id || ' ' || items || ' ' || total || ' ' || confirmed || ' ' || events, \
                     ', ' order by cart_id) from cart_totals",
        fold: FOLD,
    }
}

/// Per cart (the stream name's UUID): items added less removed, their value, whether it
/// was confirmed, its events; over the events alone.
const FOLD: &str = r#"select string_agg(cart_id || ' ' || items || ' ' || total || ' ' || confirmed || ' ' || events,
                            ', ' order by cart_id)
  from (select substring(stream_id from strpos(stream_id, '-') + 1)::uuid as cart_id,
          coalesce(sum(sign * (message_data->'productItem'->>'quantity')::int), 0) as items,
          coalesce(sum(sign * (message_data->'productItem'->>'quantity')::numeric
                             * (message_data->'productItem'->>'unitPrice')::numeric), 0) as total,
          bool_or(message_type = 'ShoppingCartConfirmed') as confirmed,
          count(*) as events
        from (select *, case message_type when 'ProductItemAddedToShoppingCart' then 1
                                          when 'ProductItemRemovedFromShoppingCart' then -1 else 0 end as sign
              from emt_messages where message_kind = 'E') m
        group by 1) f"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emmett_folds_its_shopping_carts_written_by_its_own_client_through_the_readme_and_init() {
    if !super::node_available("emmett") {
        return;
    }
    framework().run().await;
}
