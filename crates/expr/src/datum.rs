//! A value while evaluating: its type (NULLs keep theirs, as PostgreSQL's do) and
//! its content; read from a column's text form, written out as the public [`Value`].

use std::borrow::Cow;

use serde_json::Value as J;
use uuid::Uuid;

use crate::cast;
use crate::json;
use crate::types::Ty;
use crate::value::{Input, Value};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum V {
    /// Strings, and the types kept as their text (numeric, text[], unknown, others).
    Str(String),
    Json(J),
    Bytes(Vec<u8>),
    Uuid(Uuid),
    Int(i64),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Datum {
    pub(crate) ty: Ty,
    pub(crate) v: Option<V>,
}

impl Datum {
    pub(crate) fn null(ty: Ty) -> Datum {
        Datum { ty, v: None }
    }

    pub(crate) fn new(ty: Ty, v: V) -> Datum {
        Datum { ty, v: Some(v) }
    }

    pub(crate) fn text(s: String) -> Datum {
        Datum::new(Ty::Text, V::Str(s))
    }

    pub(crate) fn is_null(&self) -> bool {
        self.v.is_none()
    }

    /// A column's value, read from its text form by its type.
    pub(crate) fn from_input(input: Input<'_>) -> Result<Datum, String> {
        let ty = Ty::from_oid(input.type_oid);
        let Some(bytes) = input.text else {
            return Ok(Datum::null(ty));
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|_| format!("a value of type {} is not valid UTF-8", ty.name()))?;
        let v = match ty {
            Ty::Other(_) => V::Str(text.to_owned()),
            ty => cast::input(ty, text)?,
        };
        Ok(Datum::new(ty, v))
    }

    /// The type's output function (`bool` is `t`/`f`, `character` keeps its padding).
    pub(crate) fn out(&self) -> Option<Cow<'_, str>> {
        Some(match self.v.as_ref()? {
            V::Str(s) => Cow::Borrowed(s.as_str()),
            V::Json(j) => Cow::Owned(json::to_text(j)),
            V::Bytes(b) => Cow::Owned(hex_out(b)),
            V::Uuid(u) => Cow::Owned(u.hyphenated().to_string()),
            V::Int(i) => Cow::Owned(i.to_string()),
            V::Bool(b) => Cow::Borrowed(if *b { "t" } else { "f" }),
        })
    }

    /// The text of a string-category (or unknown) value as `text`: `character`
    /// drops its trailing blanks, as its cast to text does.
    pub(crate) fn into_string(self) -> Option<String> {
        match self.v? {
            V::Str(s) if self.ty == Ty::Bpchar => Some(s.trim_end_matches(' ').to_owned()),
            V::Str(s) => Some(s),
            other => Datum::new(self.ty, other).out().map(Cow::into_owned),
        }
    }

    pub(crate) fn into_value(self) -> Value {
        let Some(v) = self.v else {
            return Value::Null;
        };
        match (self.ty, v) {
            (_, V::Json(j)) => Value::Json(j),
            (_, V::Bytes(b)) => Value::Bytes(b),
            (_, V::Uuid(u)) => Value::Uuid(u),
            (_, V::Int(i)) => Value::Int(i),
            (_, V::Bool(b)) => Value::Bool(b),
            (ty, V::Str(s)) if ty.is_string() || ty == Ty::Unknown => Value::Text(s),
            (ty, V::Str(s)) => Value::Other {
                type_oid: ty.oid(),
                text: s,
            },
        }
    }
}

pub(crate) fn hex_out(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for x in b {
        s.push(HEX[(x >> 4) as usize] as char);
        s.push(HEX[(x & 15) as usize] as char);
    }
    s
}
