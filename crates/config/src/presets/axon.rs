//! Axon Framework's JPA event store: `domain_event_entry`, one row per domain event,
//! appended and never updated; `(aggregate_identifier, sequence_number)` is unique and
//! `event_identifier` (a UUID's text) too. `type` is the aggregate's type, `payload_type`
//! the event's class, `sequence_number` counts from 0, `time_stamp` is ISO-8601 text.
//!
//! With Hibernate's defaults on PostgreSQL, `payload` and `meta_data` (`@Lob byte[]`) are
//! large-object `oid`s: logical decoding carries only the object's number, so walfold
//! refuses such a table at start (and `walfold doctor` says so) instead of folding
//! numbers. Mapped as `bytea` (the usual fix) holding the JSON of Axon's
//! `JacksonSerializer`, it folds.

use super::Preset;

pub const AXON: Preset = Preset {
    name: "axon",
    framework: "Axon Framework (JPA event store)",
    ddl_source: "AxonFramework/AxonFramework: messaging/src/main/java/org/axonframework/\
                 eventhandling/AbstractEventEntry.java, AbstractDomainEventEntry.java, \
                 AbstractSequencedDomainEventEntry.java; eventsourcing/src/main/java/\
                 org/axonframework/eventsourcing/eventstore/jpa/DomainEventEntry.java",
    aggregate_stand_in: None,
    table: "domain_event_entry",
    columns: &[
        "global_index",
        "event_identifier",
        "aggregate_identifier",
        "sequence_number",
        "type",
        "payload_type",
        "payload",
        "meta_data",
        "time_stamp",
    ],
    id: &["event_identifier"],
    fields: &[
        ("aggregate_type", "type"),
        ("aggregate_id", "aggregate_identifier"),
        ("event_type", "payload_type"),
        ("version", "sequence_number"),
        ("payload", "payload"),
        ("headers", "meta_data"),
        ("occurred_at", "time_stamp"),
    ],
};
