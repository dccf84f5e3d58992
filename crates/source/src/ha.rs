//! The HA helpers walfold meets on a source. PostgreSQL 17's failover slots: walfold
//! creates its slot with `failover = true` where the server has them, so a standby that
//! syncs slots (`sync_replication_slots = on`) keeps a copy through a promotion. And
//! slots a failover leaves or a manager creates (Patroni's permanent slots): a slot the
//! new primary has at or before the fork streams again what the log holds (duplicates)
//! and everything after; one created there after the promotion starts past the fork and
//! never streams what the new primary committed in between, so that range is a gap.

use walfold_event::{GapReason, Lsn};
use walfold_store::EventLog;

use crate::error::SourceError;

/// PostgreSQL 17 added `failover` to slots.
const FAILOVER_SLOTS: i32 = 170_000;

/// The statement that creates the slot (`$1`), returning its start: a failover slot
/// where the server has them.
pub(crate) fn create_slot_sql(server_version_num: i32) -> &'static str {
    if server_version_num >= FAILOVER_SLOTS {
        // (slot_name, plugin, temporary, twophase, failover)
        "select lsn::text from pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "select lsn::text from pg_create_logical_replication_slot($1, 'pgoutput')"
    }
}

/// Checks the slot found after a failover (once per failover) against the ingest
/// position, which the failover moved back to the fork: a slot past it is a gap from
/// the position to the slot's start (recorded; `fill_gaps` backfills it), one at or
/// before it streams again what the log has.
pub(crate) async fn slot_after_failover(
    log: &mut EventLog,
    slot: &str,
    ingested: Lsn,
    confirmed: Option<Lsn>,
) -> Result<(), SourceError> {
    let Some(fork) = log.unchecked_failover_slot().await? else {
        return Ok(());
    };
    match confirmed {
        Some(at) if at > ingested => {
            tracing::error!(slot, fork = %fork, from = %ingested, to = %at, "the slot on the new primary starts past walfold's position at the fork (a slot created after the promotion, e.g. a Patroni permanent slot): what the new primary committed between is not in it; recorded as a slot gap and backfilled");
            log.open_gap(ingested, GapReason::Failover).await?;
            log.close_gap(at).await?;
        }
        Some(at) => {
            tracing::warn!(slot, fork = %fork, slot_position = %at, ingested = %ingested, "the slot survived the failover (a failover slot, or a Patroni permanent slot) at or before walfold's position: what it streams again is recognised as duplicates; phantoms are still checked");
        }
        None => {}
    }
    Ok(log.failover_slot_checked().await?)
}

#[cfg(test)]
mod tests {
    use super::create_slot_sql;

    #[test]
    fn a_failover_slot_from_postgresql_17_on() {
        assert!(!create_slot_sql(150_004).contains("true"));
        assert!(!create_slot_sql(169_999).contains("true"));
        assert!(create_slot_sql(170_000).ends_with("false, false, true)"));
        assert!(create_slot_sql(180_001).ends_with("false, false, true)"));
    }
}
