//! A message outbox's logical decoding messages as events: each a JSON object whose keys
//! are the configured field names ([`MessageMapping`]).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use walfold_config::OutboxConfig;
use walfold_event::{DeadLetter, JsonText, NewEvent, Reason, RowOrigin};

use super::limits::{refuse_nul, too_large};
use super::{build, kind, names, rejected, Fields, Names, TxContext};

/// A message outbox: transactional `pg_logical_emit_message` calls under one prefix,
/// each a JSON object whose keys are the configured field names.
#[derive(Debug, Clone)]
pub struct MessageMapping {
    pub prefix: String,
    /// `message_prefix:<prefix>`: what derived event IDs are scoped to.
    scope: String,
    names: Names,
    /// `pipeline.max_event_bytes`.
    max_bytes: usize,
}

impl MessageMapping {
    /// `None` for a table outbox.
    pub fn new(config: &OutboxConfig) -> Option<MessageMapping> {
        let prefix = config.message_prefix.clone()?;
        Some(MessageMapping {
            scope: config.id_scope(),
            prefix,
            names: names(config),
            max_bytes: usize::MAX,
        })
    }

    /// A message larger than `max_bytes` becomes a `too_large` dead letter.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> MessageMapping {
        self.max_bytes = max_bytes;
        self
    }

    /// Maps a message's content read at `origin`. Content that cannot be an event comes
    /// back as a dead letter.
    pub fn map(
        &self,
        content: &[u8],
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Result<NewEvent, Box<DeadLetter>> {
        let raw = |content: Value| self.raw(content);
        if content.len() > self.max_bytes {
            return Err(self.too_large(content.len(), tx, origin));
        }
        let object = match parse_message(content) {
            Ok(object) => object,
            Err(error) => {
                let text = Value::String(String::from_utf8_lossy(content).into_owned());
                let fields = JsonFields {
                    object: &Object::new(),
                    names: &self.names,
                    scope: &self.scope,
                };
                return Err(rejected(&fields, error, raw(text), tx, origin));
            }
        };
        let fields = JsonFields {
            object: &object,
            names: &self.names,
            scope: &self.scope,
        };
        build(&fields, tx, origin).map_err(|error| {
            // The content as a tree, for the dead letter only.
            let text = String::from_utf8_lossy(content);
            let content = walfold_event::json::parse(&text)
                .unwrap_or_else(|_| Value::String(text.into_owned()));
            rejected(&fields, error, raw(content), tx, origin)
        })
    }
}

impl MessageMapping {
    /// A non-transactional message under an outbox's prefix is sent even when its
    /// transaction rolls back, so it is never an event: a dead letter that says so.
    /// A message whose `len` bytes of content were not read (over `max_bytes`, or left in
    /// the stream): a `too_large` dead letter keeping its size.
    pub fn too_large(
        &self,
        len: usize,
        tx: TxContext,
        origin: Option<RowOrigin>,
    ) -> Box<DeadLetter> {
        let fields = JsonFields {
            object: &Object::new(),
            names: &self.names,
            scope: &self.scope,
        };
        let error = too_large("message", len, self.max_bytes);
        let left_out = Value::String(format!("<{len} bytes, left out>"));
        let mut dead = rejected(&fields, error, self.raw(left_out), tx, origin);
        dead.reason = Reason::TooLarge;
        dead
    }

    /// [`MessageMapping::reject_nontransactional`] of a message whose `len` bytes of
    /// content were left in the stream.
    pub fn reject_nontransactional_left_out(&self, len: usize, tx: TxContext) -> Box<DeadLetter> {
        let mut dead = self.too_large(len, tx, Some(wal_origin(tx)));
        dead.error = format!("{NONTRANSACTIONAL}; also: {}", dead.error);
        dead
    }

    pub fn reject_nontransactional(&self, content: &[u8], tx: TxContext) -> Box<DeadLetter> {
        let origin = Some(wal_origin(tx));
        let problem = NONTRANSACTIONAL;
        match self.map(content, tx, origin) {
            Err(mut dead) => {
                dead.error = format!("{problem}; also: {}", dead.error);
                dead
            }
            Ok(event) => {
                let fields = JsonFields {
                    object: &Object::new(),
                    names: &self.names,
                    scope: &self.scope,
                };
                let mut dead = rejected(
                    &fields,
                    problem.into(),
                    self.raw(Value::String(String::from_utf8_lossy(content).into_owned())),
                    tx,
                    origin,
                );
                dead.event_id = Some(event.id);
                dead.aggregate_type = Some(event.aggregate_type);
                dead.aggregate_id = Some(event.aggregate_id);
                dead
            }
        }
    }

    fn raw(&self, content: Value) -> Value {
        let mut map = Map::new();
        map.insert("message_prefix".into(), Value::String(self.prefix.clone()));
        map.insert("content".into(), content);
        Value::Object(map)
    }
}

/// Why a non-transactional message under an outbox's prefix is not an event.
const NONTRANSACTIONAL: &str = "emitted non-transactional (pg_logical_emit_message(false, …)): \
                                such a message is sent even when its transaction rolls back, so \
                                it cannot be an event; emit it with true";

/// Where a non-transactional message was read: its own LSN.
fn wal_origin(tx: TxContext) -> RowOrigin {
    RowOrigin::Wal {
        lsn: tx.commit_lsn,
        index: 0,
        element: 0,
    }
}

/// A message's keys, each value as its text: a payload is not made a tree.
type Object<'a> = HashMap<String, &'a RawValue>;

fn parse_message(content: &[u8]) -> Result<Object<'_>, String> {
    let text = std::str::from_utf8(content).map_err(|_| "message content is not UTF-8")?;
    refuse_nul(text, || "the message".into())?;
    walfold_event::json::validate(content).map_err(|e| format!("message content {e}"))?;
    let kind = match text.trim_start().as_bytes().first() {
        Some(b'{') => None,
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        _ => Some("a number"),
    };
    if let Some(kind) = kind {
        return Err(format!("message content must be a JSON object, not {kind}"));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    Object::deserialize(&mut de).map_err(|e| format!("message content is not JSON: {e}"))
}

struct JsonFields<'a> {
    object: &'a Object<'a>,
    names: &'a Names,
    scope: &'a str,
}

impl JsonFields<'_> {
    /// A field's value as text, `None` when absent or null.
    fn raw(&self, field: usize, required: bool) -> Result<Option<&str>, String> {
        let name = &self.names[field];
        match self.object.get(name) {
            None if required => Err(format!("key `{name}` is missing")),
            None => Ok(None),
            Some(raw) if raw.get() == "null" => Ok(None),
            Some(raw) => Ok(Some(raw.get())),
        }
    }

    fn value(&self, field: usize, required: bool) -> Result<Option<Value>, String> {
        self.raw(field, required)?
            .map(|raw| {
                walfold_event::json::parse(raw)
                    .map_err(|e| format!("key `{}` {e}", self.names[field]))
            })
            .transpose()
    }
}

impl Fields for JsonFields<'_> {
    fn scope(&self) -> &str {
        self.scope
    }

    fn describe(&self, field: usize) -> String {
        format!("key `{}`", self.names[field])
    }

    fn text(&self, field: usize, required: bool) -> Result<Option<String>, String> {
        match self.value(field, required)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
            Some(other) => Err(format!(
                "key `{}` must be a string or a number, not {}",
                self.names[field],
                kind(&other)
            )),
        }
    }

    fn json(&self, field: usize, required: bool) -> Result<Option<(JsonText, bool)>, String> {
        self.raw(field, required)?
            .map(|raw| {
                JsonText::parse(raw)
                    .map(|j| (j, false))
                    .map_err(|e| format!("key `{}` {e}", self.names[field]))
            })
            .transpose()
    }

    /// As for a `timestamp` column: a time without an offset is UTC.
    fn naive_time_is_utc(&self) -> bool {
        true
    }
}
