//! The store's handle on walfold's schema in a target: the name, quoted once, and the one
//! function that renders a table module's statement constants for it.
//!
//! It owns no connection: nearly every statement runs inside a transaction the caller
//! opened (a claim commits with the projection change it guards), on whichever client
//! the caller holds (`&Transaction`, `&impl GenericClient`, a `&mut Client` that opens
//! its own), so the handle travels beside the client instead of wrapping it.

use walfold_config::quote_ident;

/// walfold's schema in one target, created once per target and passed to every store
/// function that names a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    name: String,
    quoted: String,
}

/// What a statement constant writes where the schema goes.
const PLACEHOLDER: &str = "{schema}";

impl Schema {
    /// The handle for schema `name` (a validated identifier from the config).
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        let quoted = quote_ident(&name);
        Schema { name, quoted }
    }

    /// The schema's name as configured, for binding as a value (`$1`), never for splicing.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema quoted for use in statement text.
    pub fn quoted(&self) -> &str {
        &self.quoted
    }

    /// `statement` with every `{schema}` replaced by the quoted schema.
    pub fn sql(&self, statement: &str) -> String {
        statement.replace(PLACEHOLDER, &self.quoted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_placeholder_with_the_quoted_schema() {
        let s = Schema::new("wal\"fold");
        assert_eq!(s.quoted(), "\"wal\"\"fold\"");
        assert_eq!(
            s.sql("select 1 from {schema}.a join {schema}.b using (id)"),
            "select 1 from \"wal\"\"fold\".a join \"wal\"\"fold\".b using (id)"
        );
        assert_eq!(s.name(), "wal\"fold");
    }
}
