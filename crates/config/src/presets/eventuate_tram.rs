//! Eventuate Tram's transactional messaging: `eventuate.message`, one row per message
//! (domain events, commands and replies alike), IDs Int128 strings
//! (`0000018b2c4e6a1f-e6a1f0000000000a`). Domain events carry their aggregate and type in
//! `headers` (text holding a JSON object of strings); the `where` keeps them and leaves
//! commands and replies out.

use super::Preset;

pub const EVENTUATE_TRAM: Preset = Preset {
    name: "eventuate_tram",
    framework: "Eventuate Tram",
    ddl_source: "eventuate-foundation/eventuate-common: postgres/2.initialize-database.sql, \
                 eventuate-common-jdbc/src/main/java/io/eventuate/common/jdbc/\
                 EventuateCommonJdbcOperations.java (insertIntoMessageTable)",
    aggregate_stand_in: None,
    table: "eventuate.message",
    columns: &[
        "id",
        "destination",
        "headers",
        "payload",
        "published",
        "creation_time",
    ],
    id: &["id"],
    fields: &[
        ("where", "headers::jsonb->>'event-type' is not null"),
        ("aggregate_type", "headers::jsonb->>'event-aggregate-type'"),
        ("aggregate_id", "headers::jsonb->>'event-aggregate-id'"),
        ("event_type", "headers::jsonb->>'event-type'"),
        ("payload", "payload"),
        ("headers", "headers"),
    ],
};
