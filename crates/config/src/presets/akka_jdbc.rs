//! Akka / Pekko Persistence JDBC (the default, non-legacy journal): `event_journal`, one
//! row per event, inserted (with its tags in `event_tag`) in the transaction of one
//! atomic write. The identity is `(persistence_id, sequence_number)`, the version the
//! sequence number (1, 2, … per entity). A persistence ID of Cluster Sharding is
//! `<EntityType>|<entityId>`: the aggregate type is its part before `|`, the aggregate ID
//! the whole ID. `event_payload` is what the event's serializer wrote: JSON bytes from
//! Jackson's `jackson-json` (serializer 33) fold; CBOR, protobuf or a payload compressed
//! above `compress-larger-than` are no JSON (dead letters). The manifest is the event
//! type.

use super::Preset;

pub const AKKA_JDBC: Preset = Preset {
    name: "akka_jdbc",
    framework: "Akka / Pekko Persistence JDBC",
    ddl_source: "apache/pekko-persistence-jdbc (and akka/akka-persistence-jdbc): \
                 core/src/main/resources/schema/postgres/postgres-create-schema.sql, \
                 core/src/main/scala/org/apache/pekko/persistence/jdbc/journal/dao/\
                 JournalQueries.scala (writeJournalRows)",
    aggregate_stand_in: None,
    table: "event_journal",
    columns: &[
        "ordering",
        "persistence_id",
        "sequence_number",
        "deleted",
        "writer",
        "write_timestamp",
        "adapter_manifest",
        "event_ser_id",
        "event_ser_manifest",
        "event_payload",
    ],
    id: &["persistence_id", "sequence_number"],
    fields: &[
        ("aggregate_type", "split_part(persistence_id, '|', 1)"),
        ("aggregate_id", "persistence_id"),
        ("event_type", "event_ser_manifest"),
        ("version", "sequence_number"),
        ("payload", "event_payload"),
    ],
};
