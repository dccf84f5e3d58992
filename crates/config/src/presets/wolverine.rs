//! Wolverine's durable outbox on PostgreSQL: `wolverine.wolverine_outgoing_envelopes`, one
//! row per message waiting for its external transport, deleted once sent (an update of
//! `owner_id` when a node lets it go is no new message).
//!
//! `body` is not the message: it is Wolverine's binary envelope (`EnvelopeSerializer`:
//! the sent time, a count of headers, each header as a length-prefixed string, the length
//! of the data, then the data), and the data is the message as System.Text.Json wrote
//! it. The JSON is the envelope's tail, from its first `{"` on: headers are type names,
//! URIs, GUIDs and times, which hold no `{"`. A body whose headers do hold one, or whose
//! message another serializer wrote, is no JSON from there and becomes a dead letter
//! saying so; it can never fold as a wrong value.
//!
//! Wolverine messages have no aggregate: the preset takes the destination (messages to
//! one endpoint applied in the order they were stored); point `aggregate_id` at the
//! message's own field where projections need one aggregate's events in order.

use super::Preset;

pub const WOLVERINE: Preset = Preset {
    name: "wolverine",
    framework: "Wolverine",
    ddl_source: "JasperFx/wolverine: src/Persistence/Wolverine.Postgresql/Schema/\
                 OutgoingEnvelopeTable.cs, src/Persistence/Wolverine.RDBMS/DatabasePersistence.cs \
                 (insert), src/Wolverine/Runtime/Serialization/EnvelopeSerializer.cs (body)",
    aggregate_stand_in: Some(
        "the envelope's `destination`: every message to one endpoint is one \
                 aggregate (Wolverine messages carry no aggregate)",
    ),
    table: "wolverine.wolverine_outgoing_envelopes",
    columns: &[
        "id",
        "owner_id",
        "destination",
        "deliver_by",
        "body",
        "attempts",
        "message_type",
    ],
    id: &["id"],
    fields: &[
        ("aggregate_id", "destination"),
        ("event_type", "message_type"),
        (
            "payload",
            "substring(body from position(decode('7b22', 'hex') in body))",
        ),
    ],
};
