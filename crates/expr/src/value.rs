//! Values an expression computes with: a column's text-format value read by its type.

use uuid::Uuid;
use walfold_pgoutput::oid;

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
    Text(String),
    /// json and jsonb alike, with jsonb's semantics.
    Json(serde_json::Value),
    Bytes(Vec<u8>),
    Uuid(Uuid),
    Int(i64),
    Bool(bool),
    /// Any other type, as its text form (what `::text` gives).
    Other {
        type_oid: u32,
        text: String,
    },
}

impl Value {
    /// Reads a column's text-format value by its type.
    pub fn from_input(input: Input<'_>) -> Result<Value, String> {
        let Some(bytes) = input.text else {
            return Ok(Value::Null);
        };
        let text = std::str::from_utf8(bytes).map_err(|_| "a value is not UTF-8".to_owned())?;
        Ok(match input.type_oid {
            oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME => Value::Text(text.to_owned()),
            type_oid => Value::Other {
                type_oid,
                text: text.to_owned(),
            },
        })
    }

    /// Its text form (what `::text` gives); `None` for NULL.
    pub fn to_text(&self) -> Option<String> {
        match self {
            Value::Null => None,
            Value::Text(t) | Value::Other { text: t, .. } => Some(t.clone()),
            Value::Json(j) => Some(j.to_string()),
            Value::Bytes(b) => Some(format!(
                "\\x{}",
                b.iter().map(|x| format!("{x:02x}")).collect::<String>()
            )),
            Value::Uuid(u) => Some(u.hyphenated().to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::Bool(b) => Some(if *b { "true" } else { "false" }.into()),
        }
    }
}
