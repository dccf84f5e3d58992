//! Doctor's checks of the source's slot: missing after walfold ingested through it, of
//! another plugin, invalidated or about to be, not streamed, or keeping too much WAL.

use super::finding::{Finding, Level};
use super::source::Source;

pub(super) fn slot(s: &Source<'_>) -> Vec<Finding> {
    let slot = s.slot();
    let Some(existing) = &s.shape.slot else {
        return vec![match &s.ingested {
            Some(ingested) => Finding::fail(
                format!("slot {slot} is missing, but walfold had ingested through it up to {ingested}"),
                "events committed since may be lost: recreate the slot, `walfold backfill` the outbox, or set on_slot_lost = \"recreate\" to record the gap and go on",
            ),
            None => Finding::ok(format!("slot {slot} does not exist yet (created on first start)")),
        }];
    };
    let mut found = Vec::new();
    let plugin = &existing.plugin;
    if plugin.as_deref() != Some("pgoutput") {
        found.push(Finding::fail(
            format!("slot {slot} uses plugin {plugin:?}"),
            "choose another source.slot, or drop this slot",
        ));
    }
    found.push(match existing.wal_status.as_deref() {
        Some("lost") => Finding::fail(
            format!("slot {slot} is invalidated (wal_status = lost)"),
            "WAL it needed was removed: events may be missing; see docs/OPERATIONS.md: a lost slot",
        ),
        Some("unreserved") => Finding::warn(
            format!("slot {slot}: wal_status = unreserved"),
            "the slot is about to lose WAL: make sure walfold runs and keeps up",
        ),
        other => Finding::ok(format!(
            "slot {slot}: wal_status = {}",
            other.unwrap_or("-")
        )),
    });
    let active = existing.active;
    found.push(Finding::unless(
        active,
        Level::Warn,
        format!("slot {slot} active = {active}"),
        "no walfold is streaming it: start `walfold run`; an inactive slot keeps WAL",
    ));
    let mb = s.shape.retained.unwrap_or(0) / (1024 * 1024);
    let max = s.max_retained_mb;
    found.push(Finding::unless(
        mb <= max,
        Level::Warn,
        format!("slot {slot} retains {mb} MB of WAL (threshold {max} MB)"),
        "walfold is behind or stopped: check `walfold status` and the daemon's log",
    ));
    found
}
