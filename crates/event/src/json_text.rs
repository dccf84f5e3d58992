//! A JSON document kept as its text. A payload travels from the slot to the event log
//! and from the log to a projection as text: parsed into a tree it took ~70 bytes per
//! number (a 12 MB array of 4M numbers held ~300 MB), and every copy, bind and compare
//! doubled that. What reads a part of it ([`JsonText::pointer`]) parses only that part.

use std::fmt;

use postgres_types::{accepts, to_sql_checked, FromSql, IsNull, ToSql, Type};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::json::{self, JsonError};

/// JSON text: valid, nested at most [`json::MAX_DEPTH`] levels deep, as written.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonText(Box<str>);

impl JsonText {
    /// Validates `text` without building its tree.
    pub fn parse(text: impl Into<String>) -> Result<JsonText, JsonError> {
        let text = match JsonText::storable(text.into()) {
            Ok(json) => return Ok(json),
            Err(text) => text,
        };
        json::validate(text.as_bytes())?;
        Ok(JsonText(text.into_boxed_str()))
    }

    /// `text`, when one pass ([`json::is_storable`]) shows that it is JSON `jsonb` stores
    /// as written: what [`JsonText::parse`] accepts and [`JsonText::check_jsonb`] finds
    /// nothing in. `Err` gives the text back, for those two to tell why (or to accept it:
    /// the one pass leaves deep nesting to them).
    pub fn storable(text: String) -> Result<JsonText, String> {
        if json::is_storable(&text) {
            Ok(JsonText(text.into_boxed_str()))
        } else {
            Err(text)
        }
    }

    /// The text of a value.
    pub fn from_value(value: &Value) -> JsonText {
        JsonText(value.to_string().into_boxed_str())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Bytes of text.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The whole document as a tree: for small documents (and tests); a large one is
    /// many times its text's size as a tree.
    pub fn to_value(&self) -> Value {
        json::parse(&self.0).unwrap_or_else(|_| Value::String(self.0.to_string()))
    }

    /// The value of a top-level key, parsing only it.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.pointer(&[key])
    }

    /// The value at a path of keys (a numeric segment indexes an array), parsing only
    /// it; `None` when absent.
    pub fn pointer<S: AsRef<str>>(&self, path: &[S]) -> Option<Value> {
        let mut de = serde_json::Deserializer::from_str(&self.0);
        de.disable_recursion_limit();
        At(path).deserialize(&mut de).ok().flatten()
    }

    /// Why `jsonb` would refuse this document (a number outside `numeric`'s range, a
    /// `\u0000`); `Ok` when it stores it.
    pub fn check_jsonb(&self) -> Result<(), String> {
        json::check_jsonb_text(&self.0)
    }
}

impl From<&Value> for JsonText {
    fn from(value: &Value) -> JsonText {
        JsonText::from_value(value)
    }
}

impl From<Value> for JsonText {
    fn from(value: Value) -> JsonText {
        JsonText::from_value(&value)
    }
}

impl PartialEq<Value> for JsonText {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl fmt::Debug for JsonText {
    /// At most 200 characters: a payload may be megabytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(200) {
            None => write!(f, "{}", self.0),
            Some((i, _)) => write!(f, "{}… ({} bytes)", &self.0[..i], self.0.len()),
        }
    }
}

impl fmt::Display for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for JsonText {
    /// As its tree: for dead letters and reports, never the hot path.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

impl ToSql for JsonText {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.reserve(self.0.len() + 1);
        if *ty == Type::JSONB {
            // jsonb's binary format: a version byte, then the text.
            out.extend_from_slice(&[1]);
        }
        out.extend_from_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    accepts!(JSON, JSONB);
    to_sql_checked!();
}

impl<'a> FromSql<'a> for JsonText {
    /// PostgreSQL's own output: valid JSON, taken as it is.
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<JsonText, Box<dyn std::error::Error + Sync + Send>> {
        let text = match (ty, raw) {
            (&Type::JSONB, [1, rest @ ..]) => rest,
            (&Type::JSONB, _) => return Err("unsupported jsonb version".into()),
            _ => raw,
        };
        Ok(JsonText(std::str::from_utf8(text)?.into()))
    }

    accepts!(JSON, JSONB);
}

/// Finds the value at a path while reading, skipping everything else.
struct At<'p, S>(&'p [S]);

impl<'de, S: AsRef<str>> DeserializeSeed<'de> for At<'_, S> {
    type Value = Option<Value>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        if self.0.is_empty() {
            return Value::deserialize(d).map(Some);
        }
        d.deserialize_any(self)
    }
}

impl<'de, S: AsRef<str>> Visitor<'de> for At<'_, S> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
        let (key, rest) = (self.0[0].as_ref(), &self.0[1..]);
        let mut found = None;
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if k == key {
                // The last of repeated keys, as jsonb and serde_json keep it.
                found = map.next_value_seed(At(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
        let index = self.0[0].as_ref().parse::<usize>().ok();
        let mut found = None;
        let mut i = 0;
        loop {
            if Some(i) == index {
                match seq.next_element_seed(At(&self.0[1..]))? {
                    Some(v) => found = v,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<Value>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parts_are_read_without_the_rest() {
        let t = JsonText::parse(r#"{"a": {"b": [1, {"c": "x"}]}, "n": 1.50, "a2": null}"#).unwrap();
        assert_eq!(t.pointer(&["a", "b", "1", "c"]), Some(json!("x")));
        assert_eq!(t.get("n").unwrap().to_string(), "1.50");
        assert_eq!(t.get("a2"), Some(Value::Null));
        assert_eq!(t.get("missing"), None);
        assert_eq!(t.pointer(&["n", "x"]), None);
        assert_eq!(t.pointer(&["a", "b", "7"]), None);
        assert_eq!(t.pointer::<&str>(&[]), Some(t.to_value()));
        // Repeated keys: the last, as jsonb keeps it.
        let t = JsonText::parse(r#"{"k": 1, "k": 2}"#).unwrap();
        assert_eq!(t.get("k"), Some(json!(2)));
        // A key written with escapes.
        let t = JsonText::parse(r#"{"\u0061": 3}"#).unwrap();
        assert_eq!(t.get("a"), Some(json!(3)));
    }

    #[test]
    fn text_is_validated_and_kept_as_written() {
        assert!(JsonText::parse("{\"a\": 1} x").is_err());
        assert!(JsonText::parse("[1,").is_err());
        let deep = format!("{}1{}", "[".repeat(600), "]".repeat(600));
        assert!(matches!(
            JsonText::parse(deep),
            Err(JsonError::TooDeep { depth: 600 })
        ));
        let t = JsonText::parse("{ \"a\" :1.0 }").unwrap();
        assert_eq!(t.as_str(), "{ \"a\" :1.0 }");
        assert_eq!(t, json!({"a": 1.0}));
    }
}
