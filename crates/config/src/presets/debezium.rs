//! Debezium's outbox as its Quarkus extension creates it: `outboxevent` (the entity
//! `OutboxEvent`, names folded by PostgreSQL), one row per exported event, deleted in the
//! same transaction right after the insert (`remove-after-insert`, the default), which
//! walfold reads from the WAL all the same. `payload` is the event's `JsonNode` as JSON
//! text in `varchar(8000)`; `tracingspancontext` is a properties text, no JSON, and left
//! out.

use super::Preset;

pub const DEBEZIUM: Preset = Preset {
    name: "debezium",
    framework: "Debezium outbox (Quarkus extension)",
    ddl_source: "debezium/debezium: debezium-quarkus-outbox-common/deployment/src/main/java/\
                 io/debezium/outbox/quarkus/deployment/OutboxEventHbmWriter.java, \
                 DebeziumOutboxCommonConfig.java; debezium-quarkus-outbox/runtime/src/main/\
                 java/io/debezium/outbox/quarkus/internal/EventDispatcher.java",
    aggregate_stand_in: None,
    table: "outboxevent",
    columns: &[
        "id",
        "aggregatetype",
        "aggregateid",
        "type",
        "timestamp",
        "payload",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_type", "aggregatetype"),
        ("aggregate_id", "aggregateid"),
        ("event_type", "type"),
        ("payload", "payload"),
        ("occurred_at", "timestamp"),
    ],
};
