//! An `[[outbox]]`'s fields resolved: set in the config, else by its preset, else the
//! default column (or JSON key) name.

use crate::defaults;
use crate::ident::{is_identifier, QualifiedName};
use crate::model::{IdField, OutboxConfig, OutboxField};
impl OutboxField<'_> {
    /// `id`, `id[1]` or `payload`: where it sits in `[[outbox]]`.
    pub fn name(&self) -> String {
        match self.part {
            Some(i) => format!("{}[{i}]", self.key),
            None => self.key.to_owned(),
        }
    }

    /// A bare column name (used exactly as written), not an expression.
    pub fn is_column(&self) -> bool {
        is_identifier(self.value)
    }
}

/// How a message outbox's scope of derived event IDs begins.
const MESSAGE_SCOPE: &str = "message_prefix:";

impl OutboxConfig {
    /// The fields an event cannot do without, as config keys.
    pub const REQUIRED: [&'static str; 5] = [
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
    ];

    /// The event's fields, in order, as config keys.
    pub const KEYS: [&'static str; 8] = [
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "version",
        "payload",
        "headers",
        "occurred_at",
    ];

    /// Its preset, when it names one that exists.
    pub fn preset(&self) -> Option<&'static crate::presets::Preset> {
        self.preset.as_deref().and_then(crate::presets::preset)
    }

    /// What the config sets for `key` (one of [`Self::KEYS`] but `id`, or `where`,
    /// `expand`), else its preset; `None`: neither. A `where` set beside a preset's is
    /// the config's here; [`Self::fields`] has both.
    pub fn set(&self, key: &str) -> Option<&str> {
        let explicit = match key {
            "aggregate_type" => &self.aggregate_type,
            "aggregate_id" => &self.aggregate_id,
            "event_type" => &self.event_type,
            "version" => &self.version,
            "payload" => &self.payload,
            "headers" => &self.headers,
            "occurred_at" => &self.occurred_at,
            "where" => &self.r#where,
            "expand" => &self.expand,
            _ => &None,
        };
        explicit.as_deref().or_else(|| self.preset_field(key))
    }

    /// The parts of the producer's ID: set, else the preset's, else `id`.
    pub fn id_parts(&self) -> (Vec<&str>, bool) {
        match &self.id {
            Some(IdField::One(one)) => (vec![one.as_str()], true),
            Some(IdField::Composite(parts)) => (parts.iter().map(String::as_str).collect(), true),
            None => match self.preset() {
                Some(p) if !p.id.is_empty() => (p.id.to_vec(), true),
                _ => (vec![defaults::DEFAULT_ID], false),
            },
        }
    }

    /// Every field, resolved (set, else its preset's, else the default name), in
    /// [`Self::KEYS`] order, each part of a composite `id` apart, then `where` and
    /// `expand` when set (a `where` set beside a preset's that has one: both, the
    /// preset's first; a row is an event only where both are true).
    pub fn fields(&self) -> Vec<OutboxField<'_>> {
        let (parts, set) = self.id_parts();
        let composite = parts.len() > 1 || matches!(self.id, Some(IdField::Composite(_)));
        let mut fields: Vec<OutboxField<'_>> = parts
            .into_iter()
            .enumerate()
            .map(|(i, value)| OutboxField {
                key: "id",
                part: composite.then_some(i),
                value,
                set,
            })
            .collect();
        for key in &Self::KEYS[1..] {
            let (value, set) = match self.set(key) {
                Some(v) => (v, true),
                None => (Self::default_name(key), false),
            };
            fields.push(OutboxField {
                key,
                part: None,
                value,
                set,
            });
        }
        // A preset's `where` (Eventuate Tram's: domain events only) stays when the config
        // narrows the rows further: both apply.
        if let (Some(_), Some(preset)) = (&self.r#where, self.preset_field("where")) {
            fields.push(OutboxField {
                key: "where",
                part: None,
                value: preset,
                set: true,
            });
        }
        for key in ["where", "expand"] {
            if let Some(value) = self.set(key) {
                fields.push(OutboxField {
                    key,
                    part: None,
                    value,
                    set: true,
                });
            }
        }
        fields
    }

    /// What its preset sets for `key`.
    fn preset_field(&self, key: &str) -> Option<&'static str> {
        self.preset()?
            .fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The column (or JSON key) a field not set reads.
    pub fn default_name(key: &str) -> &'static str {
        match key {
            "id" => defaults::DEFAULT_ID,
            "aggregate_type" => defaults::DEFAULT_AGGREGATE_TYPE,
            "aggregate_id" => defaults::DEFAULT_AGGREGATE_ID,
            "event_type" => defaults::DEFAULT_EVENT_TYPE,
            "version" => defaults::DEFAULT_VERSION,
            "payload" => defaults::DEFAULT_PAYLOAD,
            "headers" => defaults::DEFAULT_HEADERS,
            "occurred_at" => defaults::DEFAULT_OCCURRED_AT,
            _ => "",
        }
    }

    /// A table outbox's table as a parsed name (valid after [`Config::validate`]); `None`
    /// for a message outbox.
    pub fn table_name(&self) -> Option<QualifiedName> {
        let table = self.table.as_ref()?;
        Some(
            QualifiedName::parse(table).unwrap_or_else(|_| QualifiedName {
                schema: "public".into(),
                name: table.clone(),
            }),
        )
    }

    /// What its derived event IDs are scoped to: `id_scope` when set (a table's name
    /// as `table` reads it, or `message_prefix:<prefix>` verbatim), else this outbox:
    /// its table (`schema.table`) or `message_prefix:<prefix>`.
    pub fn id_scope(&self) -> String {
        match (&self.id_scope, self.table_name(), &self.message_prefix) {
            (Some(scope), ..) if scope.starts_with(MESSAGE_SCOPE) => scope.clone(),
            (Some(scope), ..) => QualifiedName::parse(scope)
                .unwrap_or_else(|_| QualifiedName {
                    schema: "public".into(),
                    name: scope.clone(),
                })
                .to_string(),
            (None, Some(table), _) => table.to_string(),
            (None, None, prefix) => {
                format!("{MESSAGE_SCOPE}{}", prefix.as_deref().unwrap_or_default())
            }
        }
    }

    /// What this outbox follows, for messages: `public.outbox` or `messages 'orders'`.
    pub fn describe(&self) -> String {
        match (self.table_name(), &self.message_prefix) {
            (Some(t), _) => t.to_string(),
            (None, Some(p)) => format!("messages '{p}'"),
            (None, None) => "an outbox without table or message_prefix".into(),
        }
    }
}
