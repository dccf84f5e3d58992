//! Knowing the source's timeline. Each start compares the server walfold reaches
//! (`IDENTIFY_SYSTEM`) with the system identifier and timeline recorded beside the
//! slot's ingest position:
//!
//! ```text
//!  old primary  tl 1 ──●──────────●─────► (gone: what walfold read past the fork
//!                      fork       ingested    is on no surviving server)
//!  new primary  tl 2   └──────────────────► (its WAL past the fork is new)
//! ```
//!
//! Another system identifier is another database: stop with the fix. Another timeline
//! is a failover: its history (`TIMELINE_HISTORY`) gives the fork, where the timeline
//! walfold read ends on the new one. The failover is recorded and the ingest position
//! moves back to the fork, so a slot lost with the old primary opens its gap there.

use walfold_config::SourceView;
use walfold_event::Lsn;
use walfold_store::EventLog;

use crate::error::SourceError;
use crate::wire::{probe, Identity, WireConfig};

/// A failover seen at this start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failover {
    pub(crate) fork: Lsn,
    /// The ingest position before it moved back to the fork.
    pub(crate) ingested: Lsn,
}

/// Compares the source's identity with the recorded one; records a failover (and the
/// new timeline) when there was one. Returns the server's identity.
pub(crate) async fn check(
    config: &SourceView<'_>,
    cfg: &WireConfig,
    log: &EventLog,
) -> Result<(Identity, Option<Failover>), SourceError> {
    let recorded = log.source_identity().await?;
    let known = recorded.as_ref().and_then(|(_, t)| u32::try_from(*t).ok());
    let (identity, history) = probe(cfg, known).await?;
    let slot = &config.source().slot;
    let Some((system_id, timeline)) = recorded else {
        log.record_source_identity(&identity.system_id, identity.timeline.into())
            .await?;
        return Ok((identity, None));
    };
    if system_id != identity.system_id {
        return Err(SourceError::Slot {
            slot: slot.clone(),
            problem: format!(
                "was read from database system {system_id}, but source `{name}` now reaches \
                 system {now} ({host}): another database, not a failover of the one walfold \
                 read (a restore or a new cluster has another system identifier). Point \
                 source.url back at system {system_id}'s primary; to follow the new database \
                 instead, give the source a new slot name and backfill its outbox tables",
                name = config.source().name,
                now = identity.system_id,
                host = identity.host,
            ),
        });
    }
    if timeline == i64::from(identity.timeline) {
        return Ok((identity, None));
    }
    let fork = history
        .as_deref()
        .and_then(|h| fork_of(h, timeline))
        .ok_or_else(|| SourceError::Slot {
            slot: slot.clone(),
            problem: format!(
                "was read on timeline {timeline}, but {host} is on timeline {now}, whose \
                 history does not descend from it: the server walfold read and this one \
                 diverged (a standby promoted from another primary, or a restore). Point \
                 source.url at the primary that descends from timeline {timeline}; to follow \
                 this server instead, give the source a new slot name and backfill its \
                 outbox tables",
                host = identity.host,
                now = identity.timeline,
            ),
        })?;
    let ingested = log
        .record_failover(
            &identity.system_id,
            timeline,
            identity.timeline.into(),
            fork,
        )
        .await?;
    if ingested > fork {
        tracing::error!(slot = %slot, host = %identity.host, from_timeline = timeline, to_timeline = identity.timeline, fork = %fork, ingested = %ingested, "the source failed over: walfold had ingested past the fork, so events it read from the old primary after {fork} may be on no surviving server (phantoms); the ingest position moved back to the fork");
    } else {
        tracing::warn!(slot = %slot, host = %identity.host, from_timeline = timeline, to_timeline = identity.timeline, fork = %fork, ingested = %ingested, "the source failed over; walfold had ingested nothing past the fork");
    }
    Ok((identity, Some(Failover { fork, ingested })))
}

/// Where timeline `timeline` ends in a timeline history file (`tli<TAB>switchpoint<TAB>
/// reason` per ancestor): the fork of its successor.
pub(crate) fn fork_of(history: &str, timeline: i64) -> Option<Lsn> {
    history
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find_map(|l| {
            let mut fields = l.split_whitespace();
            let tli: i64 = fields.next()?.parse().ok()?;
            let lsn: Lsn = fields.next()?.parse().ok()?;
            (tli == timeline).then_some(lsn)
        })
}

#[cfg(test)]
mod tests {
    use super::fork_of;
    use walfold_event::Lsn;

    #[test]
    fn the_fork_is_where_the_read_timeline_ends() {
        let h = "1\t0/3069BE0\tno recovery target specified\n\n2\t0/4000000\tbefore 2000-01-01\n";
        assert_eq!(fork_of(h, 1), Some(Lsn(0x3069BE0)));
        assert_eq!(fork_of(h, 2), Some(Lsn(0x4000000)));
        assert_eq!(fork_of(h, 3), None);
        assert_eq!(fork_of("", 1), None);
    }
}
