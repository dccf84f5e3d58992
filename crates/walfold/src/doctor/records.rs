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
    if let Ok(pid) = walfold_store::older_release_leader(target, schema).await {
        found.extend(older_release(pid));
    }
    if let Ok(seen) = walfold_store::instance::seen(target, schema).await {
        let lease = std::time::Duration::from_secs(config.cluster.lease_s);
        let alive: Vec<&str> = seen
            .iter()
            .filter(|i| i.alive(lease, true))
            .map(|i| i.version.as_str())
            .collect();
        found.extend(mixed_releases(&alive));
    }
    if let Some(seen) = walfold_store::latest_types(target, schema, FILTER_SAMPLE).await? {
        found.extend(filters_meet_the_log(config, &seen));
    }
    Ok(found)
}

/// An instance of a release before leases that leads a migrated schema appends but
/// applies nothing (its claims fail the new constraint), and this release's instances
/// run nothing beside it: the upgrade is half done.
fn older_release(pid: Option<i32>) -> Option<Finding> {
    let pid = pid?;
    Some(Finding::fail(
        format!("an instance of an older walfold release leads this schema (backend pid {pid} on the main target): it appends events but applies none, and the instances of this release run nothing beside it"),
        "stop that instance (or upgrade it to this release); this release's instances lead and share the work once it is gone",
    ))
}

/// Instances of different releases at once: a rolling upgrade not finished.
fn mixed_releases(versions: &[&str]) -> Option<Finding> {
    let mut releases = versions.to_vec();
    releases.sort_unstable();
    releases.dedup();
    (releases.len() > 1).then(|| {
        Finding::warn(
            format!("the running instances are of different releases ({})", releases.join(", ")),
            format!("finish the rolling upgrade: every instance of a deployment runs one release (this one is {})", env!("CARGO_PKG_VERSION")),
        )
    })
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
