//! Spring Modulith's JDBC event publication registry (schema v2): `event_publication`,
//! one row per event *and listener*, each with its own random ID, updated when the
//! listener completes (or deleted, or archived). One event is several rows: set
//! `where = "listener_id = '…'"` to one listener's publications, or it counts once per
//! listener (`walfold init` writes the `where` for a listener it finds). Spring Modulith
//! has no aggregate: the preset takes each publication as its own; point `aggregate_id`
//! at your event's field (`serialized_event::jsonb->>'orderId'`).

use super::Preset;

pub const SPRING_MODULITH: Preset = Preset {
    name: "spring_modulith",
    framework: "Spring Modulith (JDBC event publication registry, v2 schema)",
    ddl_source: "spring-projects/spring-modulith: spring-modulith-events/spring-modulith-events-jdbc/\
                 src/main/resources/org/springframework/modulith/events/jdbc/schemas/v2/\
                 schema-postgresql.sql; spring-modulith-events-core/.../DefaultEventPublicationRegistry.java",
    aggregate_stand_in: Some(
        "the publication's own `id`: each publication is an aggregate of its \
                 own (Spring Modulith events carry no aggregate)",
    ),
    table: "event_publication",
    columns: &[
        "id",
        "listener_id",
        "event_type",
        "serialized_event",
        "publication_date",
        "completion_date",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_id", "id"),
        ("event_type", "event_type"),
        ("payload", "serialized_event"),
        ("occurred_at", "publication_date"),
    ],
};
