//! NServiceBus SQL persistence outbox, PostgreSQL dialect: `"<Endpoint>_OutboxData"`,
//! one row per incoming message processed, holding every outgoing message of its
//! handler in `"Operations"` (a JSON array: `MessageId`, `Headers`, a base64 `Body`,
//! `Options`). The row is inserted with the business data (optimistic concurrency,
//! the default), then updated (`Dispatched`, `Operations = '[]'`) and deleted by the
//! cleanup: only the insert is read. Each operation is one event.

use super::Preset;

pub const NSERVICEBUS: Preset = Preset {
    name: "nservicebus",
    framework: "NServiceBus (SQL persistence outbox)",
    ddl_source:
        "Particular/NServiceBus.Persistence.Sql: src/ScriptBuilder/Outbox/Create_PostgreSql.sql, \
                 src/SqlPersistence/Outbox/SqlDialect_PostgreSql.cs, SerializableOperation.cs, \
                 OptimisticConcurrencyControlStrategy.cs",
    aggregate_stand_in: None,
    table: "OutboxData",
    columns: &[
        "MessageId",
        "Dispatched",
        "DispatchedAt",
        "PersistenceVersion",
        "Operations",
    ],
    id: &["element->>'MessageId'"],
    fields: &[
        ("expand", "\"Operations\""),
        (
            "aggregate_id",
            "element->'Headers'->>'NServiceBus.ConversationId'",
        ),
        (
            "event_type",
            "split_part(element->'Headers'->>'NServiceBus.EnclosedMessageTypes', ',', 1)",
        ),
        ("payload", "decode(element->>'Body', 'base64')"),
        ("headers", "element->'Headers'"),
    ],
};
