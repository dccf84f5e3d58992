//! Marten's event store: `mt_events`, one row per event, appended and never updated
//! (archiving flips `is_archived`). The stream's type lives in `mt_streams`, not in the
//! event row: `aggregate_type` is left to the config (the table's name when unset).
//! `headers` exists only when `Events.MetadataConfig.HeadersEnabled` is on: left unset,
//! walfold reads it when it is there (the default name).

use super::Preset;

pub const MARTEN: Preset = Preset {
    name: "marten",
    framework: "Marten",
    ddl_source: "JasperFx/marten: src/Marten/Events/Schema/EventsTable.cs (and the column \
                 classes beside it: EventTypeColumn.cs, EventJsonDataColumn.cs, \
                 StreamIdColumn.cs; src/Marten/Storage/Metadata/HeadersColumn.cs)",
    aggregate_stand_in: None,
    table: "mt_events",
    columns: &[
        "seq_id",
        "id",
        "stream_id",
        "version",
        "data",
        "type",
        "timestamp",
        "mt_dotnet_type",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_id", "stream_id"),
        ("event_type", "type"),
        ("version", "version"),
        ("payload", "data"),
        ("occurred_at", "timestamp"),
    ],
};
