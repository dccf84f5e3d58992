//! Eventide Message DB: `message_store.messages`, one row per message, written by
//! `write_message` and never updated. The stream name carries the aggregate:
//! `account-123` is category `account`, ID `123` (Message DB's own `category` and `id`
//! functions, which walfold evaluates itself).

use super::Preset;

pub const MESSAGE_DB: Preset = Preset {
    name: "message_db",
    framework: "Eventide Message DB",
    ddl_source: "message-db/message-db: database/tables/messages.sql, \
                 database/functions/write-message.sql, database/functions/id.sql",
    aggregate_stand_in: None,
    table: "message_store.messages",
    columns: &[
        "global_position",
        "position",
        "time",
        "stream_name",
        "type",
        "data",
        "metadata",
        "id",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_type", "message_store.category(stream_name)"),
        ("aggregate_id", "message_store.id(stream_name)"),
        ("event_type", "type"),
        ("version", "position"),
        ("payload", "data"),
        ("headers", "metadata"),
        ("occurred_at", "time"),
    ],
};
