//! Reading `json`/`jsonb` columns as deep as walfold writes them. tokio-postgres' own
//! `serde_json::Value` conversion stops at serde_json's 128 levels, so an event whose
//! payload PostgreSQL stored (and walfold appended) could not be read back: the
//! projector would fail on it for ever. [`Jsonb`] reads through `walfold_event::json`.

use serde_json::Value;
use tokio_postgres::types::{FromSql, Type};

/// A `json` or `jsonb` value read through [`walfold_event::json::parse_slice`].
pub(crate) struct Jsonb(pub(crate) Value);

impl<'a> FromSql<'a> for Jsonb {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = if *ty == Type::JSONB {
            match raw.split_first() {
                Some((1, text)) => text,
                _ => return Err("unsupported jsonb encoding version".into()),
            }
        } else {
            raw
        };
        Ok(Jsonb(walfold_event::json::parse_slice(text)?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON || *ty == Type::JSONB
    }
}

/// `Option<Jsonb>` → `Option<Value>`.
pub(crate) fn value(j: Option<Jsonb>) -> Option<Value> {
    j.map(|j| j.0)
}
