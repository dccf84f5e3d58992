//! Emmett's PostgreSQL event store (npm `@event-driven-io/emmett-postgresql`):
//! `emt_messages`, partitioned by `partition` and again by `is_archived` (walfold follows
//! it through its root), one row per message, appended by `emt_append_to_stream`.
//! Events are `message_kind = 'E'` (commands `'C'` share the table); the ID is the
//! message's UUID as text, the version its `stream_position` (1, 2, … per stream). The
//! stream's type is in `emt_streams`, not in the row: the aggregate type is the stream
//! name's part before its first `-` (`shopping_cart-<uuid>`: `shopping_cart`), the
//! aggregate ID the whole stream name (a UUID has dashes of its own).

use super::Preset;

pub const EMMETT: Preset = Preset {
    name: "emmett",
    framework: "Emmett (PostgreSQL event store)",
    ddl_source: "event-driven-io/emmett: src/packages/emmett-postgresql/src/eventStore/schema/\
                 tables.ts (messagesTableSQL, emt_add_table_partition), appendToStream.ts \
                 (emt_append_to_stream, appendEventsRaw)",
    aggregate_stand_in: None,
    table: "emt_messages",
    columns: &[
        "stream_id",
        "stream_position",
        "created",
        "global_position",
        "transaction_id",
        "message_kind",
        "message_id",
        "message_type",
        "message_data",
        "message_metadata",
        "message_schema_version",
    ],
    id: &["message_id"],
    fields: &[
        ("where", "message_kind = 'E'"),
        ("aggregate_type", "split_part(stream_id, '-', 1)"),
        ("aggregate_id", "stream_id"),
        ("event_type", "message_type"),
        ("version", "stream_position"),
        ("payload", "message_data"),
        ("headers", "message_metadata"),
        ("occurred_at", "created"),
    ],
};
