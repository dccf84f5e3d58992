//! SQL identifiers from config: validated, then always quoted when put into SQL.

use std::fmt;

/// A plain identifier: starts with a letter or `_`, then letters, digits, `_`; at most 63 bytes.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && s.len() <= 63
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Quotes an identifier for SQL (`"a""b"`).
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `schema.name`, both validated identifiers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    pub schema: String,
    pub name: String,
}

impl QualifiedName {
    /// Parses `schema.table` or `table` (schema `public`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (schema, name) = s.split_once('.').unwrap_or(("public", s));
        if !is_identifier(schema) || !is_identifier(name) {
            return Err(format!(
                "`{s}` is not a valid table name: use schema.table with letters, digits and _"
            ));
        }
        Ok(QualifiedName {
            schema: schema.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `"schema"."name"`, safe to put into SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked_and_quoted() {
        assert!(is_identifier("order_status"));
        assert!(!is_identifier("1abc"));
        assert!(!is_identifier("a;drop"));
        assert!(!is_identifier(""));
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        let q = QualifiedName::parse("outbox").unwrap();
        assert_eq!(q.quoted(), "\"public\".\"outbox\"");
        assert!(QualifiedName::parse("a.b.c").is_err());
    }
}
