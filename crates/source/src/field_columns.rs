//! Which columns of its table each field of a table outbox reads, and which of them the
//! table has: the one rule behind the checks at start (`verdict`, from the catalog) and
//! a relation's mapping (from its Relation message). A field names a column, or is an
//! expression that reads columns; with `expand`, `element` is the array's element, no
//! column; the aggregate type left out is the table's name when no column has it.

use walfold_config::{OutboxConfig, OutboxField};

use crate::outbox::{columns_read, ELEMENT};

/// One column a field reads.
#[derive(Debug, Clone)]
pub(crate) struct FieldColumn<'a> {
    pub(crate) field: OutboxField<'a>,
    pub(crate) column: String,
    /// Its position among the table's columns; `None`: the table has no such column.
    pub(crate) at: Option<usize>,
}

impl FieldColumn<'_> {
    /// Whether the mapping cannot do without the column: a field an event needs,
    /// `where`, `expand`, or an expression (which cannot be evaluated without it); the
    /// aggregate type left out is not (it falls back to the table's name).
    pub(crate) fn required(&self) -> bool {
        if self.field.key == "aggregate_type" && !self.field.set {
            return false;
        }
        OutboxConfig::REQUIRED.contains(&self.field.key)
            || matches!(self.field.key, "where" | "expand")
            || !self.field.is_column()
    }
}

/// Every column each of `config`'s fields reads, in field order, placed among `columns`
/// (the table's, in order). A field whose expression does not parse reads none
/// (validation refuses it first).
pub(crate) fn field_columns<'a>(
    config: &'a OutboxConfig,
    columns: &[&str],
) -> Vec<FieldColumn<'a>> {
    let expanding = config.set("expand").is_some();
    let mut out = Vec::new();
    for field in config.fields() {
        let Some(read) = columns_read(field.value, field.is_column()) else {
            continue;
        };
        for column in read {
            if expanding && field.key != "expand" && column == ELEMENT {
                continue;
            }
            let at = columns.iter().position(|c| *c == column);
            out.push(FieldColumn { field, column, at });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(extra: &str) -> OutboxConfig {
        let text = format!(
            "[source]\nurl = \"postgresql://a@b/c\"\n[[outbox]]\ntable = \"public.outbox\"\n{extra}\n"
        );
        walfold_config::Config::from_toml(&text, Vec::<(String, String)>::new())
            .unwrap()
            .outbox
            .remove(0)
    }

    #[test]
    fn columns_are_placed_and_the_missing_required_ones_found() {
        let o = outbox("event_type = \"lower(kind)\"");
        let reads = field_columns(&o, &["id", "aggregate_id", "payload"]);
        let missing: Vec<(&str, &str)> = reads
            .iter()
            .filter(|r| r.at.is_none() && r.required())
            .map(|r| (r.field.key, r.column.as_str()))
            .collect();
        // The aggregate type left out falls back to the table's name; an expression's
        // column is needed whatever its key.
        assert_eq!(missing, [("event_type", "kind")]);
        assert!(reads
            .iter()
            .any(|r| r.column == "version" && r.at.is_none() && !r.required()));
    }

    #[test]
    fn an_expanded_element_is_no_column() {
        let o = outbox("expand = \"payload->'items'\"\naggregate_id = \"element->>'id'\"");
        let reads = field_columns(&o, &["id", "payload"]);
        assert!(!reads.iter().any(|r| r.column == ELEMENT));
    }
}
