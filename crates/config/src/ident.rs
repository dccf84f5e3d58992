//! SQL identifiers from config: validated, then always quoted when put into SQL, so each
//! is used exactly as written (case-sensitive: `OutboxEvent` is not `outboxevent`).

use std::fmt;

/// The rule for schema, table, column and publication names, as config errors state it.
/// PostgreSQL truncates names over 63 bytes without an error, so a longer one would name
/// another object; everything else outside the rule is refused to keep names printable
/// and unambiguous in `schema.table` and in the replication protocol's name list.
pub(crate) const IDENTIFIER_RULE: &str =
    "1-63 ASCII letters, digits and _, not starting with a digit; used exactly as written (case-sensitive)";

/// A name within [`IDENTIFIER_RULE`].
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
                "`{s}` is not a valid table name: schema.table (or table, in public), each part {IDENTIFIER_RULE}"
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
        for good in ["OutboxEvent", "aggregateId", "_x", "Sales", &"a".repeat(63)] {
            assert!(is_identifier(good), "{good}");
        }
        for bad in ["a-b", "a b", "ümlaut", "a\"b", "a.b", "$x", &"a".repeat(64)] {
            assert!(!is_identifier(bad), "{bad}");
        }
        let q = QualifiedName::parse("Sales.Outbox").unwrap();
        assert_eq!(q.quoted(), "\"Sales\".\"Outbox\"");
    }
}
