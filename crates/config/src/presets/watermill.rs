//! Watermill's SQL Pub/Sub with its PostgreSQL schema adapter: one table per topic,
//! `"watermill_<topic>"`, one row per published message, never updated or deleted
//! (consumers keep their offsets in `watermill_offsets_<topic>`). `uuid` is the message's
//! UUID as text (any string of up to 36 characters the publisher chose; a retried
//! publish writes it again). The CQRS component's JSON marshaler puts the event's name
//! in `metadata`'s `name`; messages carry no aggregate: the preset takes each message on
//! its own (its `uuid`), point `aggregate_id` at the payload's own field.

use super::Preset;

pub const WATERMILL: Preset = Preset {
    name: "watermill",
    framework: "Watermill SQL (PostgreSQL)",
    ddl_source: "ThreeDotsLabs/watermill-sql: pkg/sql/schema_adapter_postgresql.go \
                 (DefaultPostgreSQLSchema), pkg/sql/schema_adapter.go (defaultInsertArgs); \
                 ThreeDotsLabs/watermill: components/cqrs/marshaler_json.go (metadata name)",
    aggregate_stand_in: Some(
        "the message `uuid`: each message is an aggregate of its own (Watermill \
                 messages carry no aggregate)",
    ),
    table: "watermill_<topic>",
    columns: &[
        "offset",
        "uuid",
        "created_at",
        "payload",
        "metadata",
        "transaction_id",
    ],
    id: &["uuid"],
    fields: &[
        ("aggregate_id", "uuid"),
        ("event_type", "metadata->>'name'"),
        ("payload", "payload"),
        ("headers", "metadata"),
        ("occurred_at", "created_at"),
    ],
};
