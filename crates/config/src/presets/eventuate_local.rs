//! Eventuate Local's event store: `eventuate.events`, one row per event, IDs Int128
//! strings; `event_data` and `metadata` are text holding JSON.

use super::Preset;

pub const EVENTUATE_LOCAL: Preset = Preset {
    name: "eventuate_local",
    framework: "Eventuate Local",
    ddl_source: "eventuate-foundation/eventuate-common: postgres/1.initialize-database.sql, \
                 eventuate-common-jdbc/src/main/java/io/eventuate/common/jdbc/\
                 EventuateCommonJdbcOperations.java (insertIntoEventsTable)",
    aggregate_stand_in: None,
    table: "eventuate.events",
    columns: &[
        "event_id",
        "event_type",
        "event_data",
        "entity_type",
        "entity_id",
        "triggering_event",
        "metadata",
        "published",
    ],
    id: &["event_id"],
    fields: &[
        ("aggregate_type", "entity_type"),
        ("aggregate_id", "entity_id"),
        ("event_type", "event_type"),
        ("payload", "event_data"),
        ("headers", "metadata"),
    ],
};
