//! MassTransit's Entity Framework Core transactional outbox on PostgreSQL:
//! `"OutboxMessage"`, one row per sent or published message, deleted once delivered.
//! `"Body"` is text holding MassTransit's JSON envelope; the message itself is its
//! `message` member. `"MessageType"` lists the message's type URNs, `;`-separated, most
//! specific first. MassTransit has no aggregate: the preset takes `"CorrelationId"`
//! (set for correlated messages); point `aggregate_id` at your message's own field.

use super::Preset;

pub const MASSTRANSIT: Preset = Preset {
    name: "masstransit",
    framework: "MassTransit (EF Core outbox)",
    ddl_source:
        "MassTransit/MassTransit: src/Persistence/MassTransit.EntityFrameworkCoreIntegration/\
                 Configuration/EntityFrameworkOutboxConfigurationExtensions.cs \
                 (ConfigureOutboxMessageEntity) and EntityFrameworkCoreIntegration/OutboxMessage.cs",
    aggregate_stand_in: None,
    table: "OutboxMessage",
    columns: &[
        "SequenceNumber",
        "MessageId",
        "ContentType",
        "MessageType",
        "Body",
        "ConversationId",
        "CorrelationId",
        "SentTime",
        "Headers",
    ],
    id: &["MessageId"],
    fields: &[
        ("aggregate_id", "CorrelationId"),
        ("event_type", "split_part(\"MessageType\", ';', 1)"),
        ("payload", "\"Body\"::jsonb->'message'"),
        ("headers", "Headers"),
        ("occurred_at", "SentTime"),
    ],
};
