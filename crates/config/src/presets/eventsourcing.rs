//! Python `eventsourcing`'s PostgreSQL application recorder: `<app>_events` (the
//! application's name in lower case), one row per domain event, appended and never
//! updated. No event-ID column: the identity is `(originator_id, originator_version)`,
//! the table's primary key. `topic` is the event class's `module:Qualified.Name`
//! (`bank.domain:Account.Opened`: events are nested in their aggregate's class, so the
//! aggregate type is the name's first part). `state` is the event's attributes as the
//! default `JSONTranscoder` writes them, UTF-8 JSON bytes (a UUID, `Decimal` or
//! `datetime` as `{"_type_": …, "_data_": …}`); an application with a compressor or a
//! cipher writes bytes that are no JSON, which become dead letters saying so. The
//! `<app>_snapshots` table has no `notification_id`, and is not recognised.

use super::Preset;

pub const EVENTSOURCING: Preset = Preset {
    name: "eventsourcing",
    framework: "Python eventsourcing",
    ddl_source: "pyeventsourcing/eventsourcing: eventsourcing/postgres.py \
                 (PostgresApplicationRecorder.construct_create_table_statements, Factory), \
                 eventsourcing/persistence.py (Mapper.to_stored_event, JSONTranscoder)",
    aggregate_stand_in: None,
    table: "<app>_events",
    columns: &[
        "originator_id",
        "originator_version",
        "topic",
        "state",
        "notification_id",
    ],
    id: &["originator_id", "originator_version"],
    fields: &[
        (
            "aggregate_type",
            "split_part(split_part(topic, ':', 2), '.', 1)",
        ),
        ("aggregate_id", "originator_id"),
        ("event_type", "topic"),
        ("version", "originator_version"),
        ("payload", "state"),
        (
            "occurred_at",
            "convert_from(state, 'UTF8')::jsonb->'timestamp'->>'_data_'",
        ),
    ],
};
