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
    /// `where`, `expand`, an expression (which cannot be evaluated without it), or a
    /// column the config (or its preset) names for an optional field (a misspelt
    /// `version = "stream_pos"` would otherwise read null on every row). An optional
    /// field left at its default name is not, nor the aggregate type left out (it falls
    /// back to the table's name).
    pub(crate) fn required(&self) -> bool {
        if self.field.key == "aggregate_type" && !self.field.set {
            return false;
        }
        OutboxConfig::REQUIRED.contains(&self.field.key)
            || matches!(self.field.key, "where" | "expand")
            || !self.field.is_column()
            || self.field.set
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

/// `names` (a table's columns) ordered by how close each is to `wanted`, closest first:
/// one that contains the other (`stream_pos`, `stream_position`) before the rest, then
/// by edit distance, compared without case; ties keep the table's order.
pub(crate) fn closest_first<'n>(wanted: &str, names: &[&'n str]) -> Vec<&'n str> {
    let wanted = wanted.to_lowercase();
    let mut ranked: Vec<(bool, usize, usize, &str)> = names
        .iter()
        .enumerate()
        .map(|(at, n)| {
            let lower = n.to_lowercase();
            let within = lower.contains(&wanted) || wanted.contains(&lower);
            (!within, edit_distance(&wanted, &lower), at, *n)
        })
        .collect();
    ranked.sort_unstable();
    ranked.into_iter().map(|(_, _, _, n)| n).collect()
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
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
        // An optional field set to a column the table lacks is no longer optional.
        let o = outbox("version = \"stream_pos\"");
        let reads = field_columns(&o, &["id", "aggregate_id", "event_type", "payload"]);
        assert!(reads
            .iter()
            .any(|r| r.column == "stream_pos" && r.at.is_none() && r.required()));
    }

    #[test]
    fn the_closest_column_comes_first() {
        let names = [
            "global_position",
            "stream_id",
            "stream_position",
            "message_kind",
        ];
        assert_eq!(
            closest_first("stream_pos", &names),
            [
                "stream_position",
                "stream_id",
                "global_position",
                "message_kind"
            ]
        );
        assert_eq!(
            closest_first("Versoin", &["payload", "version"])[0],
            "version"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn an_expanded_element_is_no_column() {
        let o = outbox("expand = \"payload->'items'\"\naggregate_id = \"element->>'id'\"");
        let reads = field_columns(&o, &["id", "payload"]);
        assert!(!reads.iter().any(|r| r.column == ELEMENT));
    }
}
