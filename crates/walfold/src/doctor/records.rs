//! Doctor's checks of what walfold recorded on the main target: slots it ingested
//! through that no source uses now, the phantoms and unfilled gaps a failover left, and
//! projections whose filters name none of what the log's latest events carry.

use tokio_postgres::Client;
use walfold_config::Config;
use walfold_store::{FailoverSummary, IngestedSlot, Schema, StoreError};

use super::finding::Finding;

/// How many of the latest events a projection's filters are compared with.
const FILTER_SAMPLE: i64 = 10_000;

/// Every check of walfold's records in the main target (`schema` there).
pub(super) async fn checks(
    config: &Config,
    schema: &Schema,
    target: &Client,
) -> Result<Vec<Finding>, StoreError> {
    let mut found = Vec::new();
    if let Ok(slots) = walfold_store::ingested_slots(target, schema).await {
        found.extend(abandoned_slots(config, &slots));
    }
    for source in config.sources() {
        if let Ok(s) = walfold_store::failover_summary(target, schema, &source.slot).await {
            found.extend(failover_leftovers(config, source, &s));
        }
    }
    if let Some(seen) = walfold_store::latest_types(target, schema, FILTER_SAMPLE).await? {
        found.extend(filters_meet_the_log(config, &seen));
    }
    Ok(found)
}

/// Slots walfold ingested through that no source of the config uses any more (a
/// source's slot renamed, a source removed): on its server such a slot keeps WAL.
fn abandoned_slots(config: &Config, slots: &[IngestedSlot]) -> Vec<Finding> {
    slots
        .iter()
        .filter(|s| !config.sources().iter().any(|c| c.slot == s.slot))
        .map(|IngestedSlot { slot, lsn }| {
            Finding::warn(
                format!("walfold ingested through slot {slot} (up to {lsn}), which no [[source]] uses now"),
                format!("if a source's slot was renamed by mistake, set it back; otherwise drop the old slot on its server (select pg_drop_replication_slot('{slot}')), which keeps WAL until it is dropped"),
            )
        })
        .collect()
}

/// Phantoms and unfilled slot gaps of a source's slot (see docs/OPERATIONS.md, After a failover).
fn failover_leftovers(
    config: &Config,
    source: &walfold_config::SourceConfig,
    s: &FailoverSummary,
) -> Vec<Finding> {
    let name = &config.target.schema;
    let mut found = Vec::new();
    if s.phantoms > 0 {
        found.push(Finding::warn(
            format!(
                "slot {}: {} phantoms from seq {} (events read from an old primary past a failover's fork that the new primary does not have; they may be in read models)",
                source.slot,
                s.phantoms,
                s.first_seq.unwrap_or(0)
            ),
            format!("`walfold phantoms list --source {}` shows them with the read models they reached: rebuild those projections (walfold rebuild, which skips them); or, for rows the application deleted, accept them: walfold phantoms accept EVENT_ID --reason …", source.name),
        ));
    }
    if s.open_gaps > 0 {
        found.push(Finding::warn(
            format!(
                "slot {}: {} slot gaps not filled (events committed in them may be missing; see {name}.slot_gap)",
                source.slot, s.open_gaps
            ),
            format!("backfill the table outboxes (walfold backfill), then mark the gaps filled: update {name}.slot_gap set filled_at = now() where slot = '{}' and filled_at is null; a message outbox's events in a gap are lost", source.slot),
        ));
    }
    found
}

/// A projection whose `event_types` or `aggregate_types` name none of what the log's
/// latest events carry (`seen`: their event types and aggregate types) applies nothing,
/// silently: `OrderPlaced` against a log of `order.placed`. Compared exactly, as the
/// projector does.
fn filters_meet_the_log(config: &Config, seen: &(Vec<String>, Vec<String>)) -> Vec<Finding> {
    let mut found = Vec::new();
    for p in &config.projection {
        for (key, wanted, seen) in [
            ("event_types", &p.event_types, &seen.0),
            ("aggregate_types", &p.aggregate_types, &seen.1),
        ] {
            let Some(wanted) = wanted.as_ref().filter(|_| !seen.is_empty()) else {
                continue;
            };
            if wanted.iter().any(|w| seen.contains(w)) {
                continue;
            }
            let shown: Vec<&str> = seen.iter().take(10).map(String::as_str).collect();
            found.push(Finding::warn(
                format!(
                    "projection {}: none of its {key} ({}) is among those of the latest {} \
                     events in the log ({}{}): it applies none of them",
                    p.name,
                    wanted.join(", "),
                    FILTER_SAMPLE,
                    crate::text::escape_controls(&shown.join(", ")),
                    if seen.len() > shown.len() {
                        ", …"
                    } else {
                        ""
                    }
                ),
                format!(
                    "{key} compare exactly, case included: name them as the log does \
                     (`walfold events` shows them)"
                ),
            ));
        }
    }
    found
}
