//! Commanded's EventStore for Elixir (`commanded/eventstore`): `events`, one row per
//! event, and `stream_events`, which links each to its stream (`stream_id`, a number
//! naming a row of `streams`) and version. A logical-replication row of `events`
//! carries neither the stream nor the version: the preset takes each event as its own
//! aggregate (a stand-in) and has no version; point `aggregate_id` at the payload's
//! field (`walfold init` proposes one from the rows). `data` and `metadata` are `bytea`
//! holding the JSON serializer's JSON (the default); a `jsonb` column type reads as is.

use super::Preset;

pub const COMMANDED: Preset = Preset {
    name: "commanded",
    framework: "Commanded EventStore (Elixir)",
    ddl_source: "commanded/eventstore: lib/event_store/sql/init.ex (create_events_table, \
                 create_stream_events_table), lib/event_store/sql/statements/\
                 insert_events.sql.eex",
    aggregate_stand_in: Some(
        "the event's own `event_id`: its stream is in stream_events, which a row of \
         events does not carry",
    ),
    table: "events",
    columns: &[
        "event_id",
        "event_type",
        "causation_id",
        "correlation_id",
        "data",
        "metadata",
        "created_at",
    ],
    id: &["event_id"],
    fields: &[
        ("aggregate_id", "event_id"),
        ("event_type", "event_type"),
        ("payload", "data"),
        ("headers", "metadata"),
        ("occurred_at", "created_at"),
    ],
};
