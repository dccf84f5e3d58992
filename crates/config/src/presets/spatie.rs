//! Spatie's laravel-event-sourcing: `stored_events`, one row per event, inserted by
//! Eloquent (then updated once to add `stored-event-id` to `meta_data`, which walfold
//! does not read as an event). IDs are the table's bigserial `id` (derived into event
//! IDs, kept as `producer_id`). An aggregate root's events carry its UUID and a version
//! from 1; an event stored without one has neither: it is its own aggregate (its `id`)
//! and has no version. The aggregate root's class is stored nowhere: the aggregate type
//! is the table's name unless the config sets a constant.

use super::Preset;

pub const SPATIE: Preset = Preset {
    name: "spatie",
    framework: "Spatie laravel-event-sourcing",
    ddl_source: "spatie/laravel-event-sourcing: database/migrations/\
                 create_stored_events_table.php.stub, src/StoredEvents/Repositories/\
                 EloquentStoredEventRepository.php (persist)",
    aggregate_stand_in: None,
    table: "stored_events",
    columns: &[
        "id",
        "aggregate_uuid",
        "aggregate_version",
        "event_version",
        "event_class",
        "event_properties",
        "meta_data",
        "created_at",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_id", "coalesce(aggregate_uuid::text, id::text)"),
        ("event_type", "event_class"),
        ("version", "aggregate_version"),
        ("payload", "event_properties"),
        ("headers", "meta_data"),
        ("occurred_at", "created_at"),
    ],
};
