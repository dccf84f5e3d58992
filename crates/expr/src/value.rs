//! Values an expression computes with: a column's text-format value read by its type.

use uuid::Uuid;

use crate::datum::{hex_out, Datum};

/// A column as logical decoding (or a `::text` select) sends it: its type and its
/// text-format value, `None` for NULL.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub type_oid: u32,
    pub text: Option<&'a [u8]>,
}

/// A value of the types the accepted subset computes with.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    /// text, varchar, char(n) (padded, as stored), name.
    Text(String),
    /// json and jsonb alike, with jsonb's semantics.
    Json(serde_json::Value),
    Bytes(Vec<u8>),
    Uuid(Uuid),
    /// smallint, integer, bigint.
    Int(i64),
    Bool(bool),
    /// Any other type, as its text form (what `::text` gives); numeric in its
    /// canonical form.
    Other {
        type_oid: u32,
        text: String,
    },
}

impl Value {
    /// Reads a column's text-format value by its type (an error when the text is
    /// not a value of that type, e.g. a json column holding invalid JSON).
    pub fn from_input(input: Input<'_>) -> Result<Value, String> {
        Datum::from_input(input).map(Datum::into_value)
    }

    /// Its text form (what `::text` gives: jsonb's form for JSON, `\x…` for bytes,
    /// `true`/`false`); `None` for NULL.
    pub fn to_text(&self) -> Option<String> {
        match self {
            Value::Null => None,
            Value::Text(t) | Value::Other { text: t, .. } => Some(t.clone()),
            Value::Json(j) => Some(crate::json::to_text(j)),
            Value::Bytes(b) => Some(hex_out(b)),
            Value::Uuid(u) => Some(u.hyphenated().to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::Bool(b) => Some(if *b { "true" } else { "false" }.into()),
        }
    }

    /// `Some(b)` for a boolean, `None` for NULL or any other type (a row filter
    /// keeps a row only for `Some(true)`).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The JSON document it holds, as compact JSON text: a JSON value itself; text
    /// or bytes (UTF-8) that parse as JSON, as they are; an integer or a boolean as
    /// its JSON literal. `None` for NULL; an error saying why for anything else.
    pub fn to_json_text(&self) -> Result<Option<String>, String> {
        let checked = |s: &str| -> Result<(), String> {
            walfold_event::json::validate(s.as_bytes()).map_err(|e| match e {
                walfold_event::json::JsonError::Invalid(e) => format!("not JSON: {e}"),
                deep => format!("JSON that {deep}"),
            })
        };
        Ok(Some(match self {
            Value::Null => return Ok(None),
            Value::Json(j) => j.to_string(),
            Value::Text(t) => {
                checked(t)?;
                t.clone()
            }
            Value::Bytes(b) => {
                let t = std::str::from_utf8(b)
                    .map_err(|e| format!("not JSON: the bytes are not UTF-8 ({e})"))?;
                checked(t)?;
                t.to_owned()
            }
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Uuid(_) => return Err("not JSON: a uuid".into()),
            Value::Other { type_oid, .. } => {
                return Err(format!("not JSON: a value of type OID {type_oid}"))
            }
        }))
    }
}
