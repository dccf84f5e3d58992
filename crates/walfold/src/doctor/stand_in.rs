//! Doctor's check of projections keyed on a stand-in aggregate ID: where a framework's
//! rows carry no aggregate (Spring Modulith, Wolverine, Watermill), its preset's
//! `aggregate_id` is each message's own (its ID, its endpoint), and a read model keyed on
//! it gets a row per message, not per aggregate, with no dead letter to show for it.

use walfold_config::ProjectionKind;

use super::finding::Finding;
use super::source::Source;

/// A `table` projection (keyed on the aggregate ID) or a `sql` one reading
/// `:aggregate_id` over an outbox whose `aggregate_id` is its preset's stand-in.
pub(super) fn keyed_on_a_stand_in(s: &Source<'_>) -> Vec<Finding> {
    let name = &s.view.source().name;
    let stand_ins: Vec<(String, &str, &str)> = s
        .view
        .table_outboxes()
        .filter_map(|(o, t)| {
            let (value, why) = o.preset()?.stand_in()?;
            (o.set("aggregate_id") == Some(value)).then(|| (t.to_string(), value, why))
        })
        .collect();
    if stand_ins.is_empty() {
        return Vec::new();
    }
    let keyed: Vec<&str> = s
        .view
        .config
        .projection
        .iter()
        .filter(|p| p.sources.as_ref().is_none_or(|s| s.contains(name)))
        .filter(|p| match &p.kind {
            ProjectionKind::Table { .. } => true,
            ProjectionKind::Sql { statement, .. } => statement.contains(":aggregate_id"),
            ProjectionKind::Code { .. } => false,
        })
        .map(|p| p.name.as_str())
        .collect();
    if keyed.is_empty() {
        return Vec::new();
    }
    stand_ins
        .into_iter()
        .map(|(table, value, why)| {
            Finding::warn(
                format!(
                    "{} keyed on the aggregate ID, and {table}'s aggregate_id is a stand-in, \
                     `{value}` ({why}): one read-model row per message, not per aggregate",
                    match keyed.as_slice() {
                        [one] => format!("projection {one} is"),
                        several => format!("projections {} are", several.join(", ")),
                    }
                ),
                format!(
                    "set aggregate_id of [[outbox]] {table} to your events' own field (an \
                     expression over the payload, e.g. `payload->>'orderId'`)"
                ),
            )
        })
        .collect()
}
