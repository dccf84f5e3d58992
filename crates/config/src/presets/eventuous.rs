//! Eventuous' PostgreSQL event store: `eventuous.messages`, one row per event, appended
//! by its `append_events` function. The stream's name (`Booking-123`) is in
//! `eventuous.streams`, not in the row; the row's `stream_id` is that stream's number,
//! which identifies the aggregate as well: the aggregate ID. The version is
//! `stream_position`, from 0 (a strict projection sets `first_version = 0`). The
//! aggregate type is the table's name unless the config sets a constant.

use super::Preset;

pub const EVENTUOUS: Preset = Preset {
    name: "eventuous",
    framework: "Eventuous (PostgreSQL event store)",
    ddl_source: "Eventuous/eventuous: src/Postgres/src/Eventuous.Postgresql/Scripts/\
                 1_Schema.sql, 2_AppendEvents.sql, 3_CheckStream.sql",
    aggregate_stand_in: None,
    table: "eventuous.messages",
    columns: &[
        "message_id",
        "message_type",
        "stream_id",
        "stream_position",
        "global_position",
        "json_data",
        "json_metadata",
        "created",
    ],
    id: &["message_id"],
    fields: &[
        ("aggregate_id", "stream_id"),
        ("event_type", "message_type"),
        ("version", "stream_position"),
        ("payload", "json_data"),
        ("headers", "json_metadata"),
        ("occurred_at", "created"),
    ],
};
