//! Rails Event Store with its ActiveRecord repository: `event_store_events`, one row per
//! event, and `event_store_events_in_streams`, one row per event and stream it is linked
//! to (`stream`, `position`). A logical-replication row of `event_store_events` carries
//! no stream: the preset takes each event as its own aggregate (a stand-in) and has no
//! version; point `aggregate_id` at the payload's field (`data->>'order_id'`; `walfold
//! init` proposes one from the rows). `data` and `metadata` are JSON with the generator's
//! `--data-type=jsonb` (or `json`) and a JSON serializer; the default binary columns
//! hold YAML, which is no JSON (dead letters).

use super::Preset;

pub const RAILS_EVENT_STORE: Preset = Preset {
    name: "rails_event_store",
    framework: "Rails Event Store (ActiveRecord repository)",
    ddl_source: "RailsEventStore/rails_event_store: ruby_event_store-active_record/lib/\
                 ruby_event_store/active_record/generators/templates/postgres/\
                 create_event_store_events_template.erb; ruby_event_store-active_record/lib/\
                 ruby_event_store/active_record/event_repository.rb (append_to_stream)",
    aggregate_stand_in: Some(
        "the event's own `event_id`: its stream is in event_store_events_in_streams, which \
         a row of event_store_events does not carry",
    ),
    table: "event_store_events",
    columns: &[
        "id",
        "event_id",
        "event_type",
        "metadata",
        "data",
        "created_at",
        "valid_at",
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
