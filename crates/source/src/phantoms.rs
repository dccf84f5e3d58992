//! Phantoms: events walfold read from the old primary past a failover's fork that the
//! new primary does not have. They were committed and acknowledged to their producer,
//! then lost with the old primary, but walfold folded them already.
//!
//! After a failover (and once any gap is backfilled) each event appended from the old
//! timeline past the fork is looked up by its ID in the new primary's outbox tables;
//! those found nowhere are recorded in `phantom_event` and loudly reported. Reads of the
//! event log skip open phantoms, so `walfold rebuild` of the projections they reached
//! repairs them. A row the application deleted (an insert-then-delete outbox) and an
//! event of a message outbox cannot be confirmed: they are recorded too, and the
//! operator who knows better accepts them.

use std::collections::HashMap;

use walfold_config::SourceView;
use walfold_store::EventLog;

use crate::backfill::{confirm, source_session};
use crate::error::SourceError;

/// Checks the events past the last failover's fork, once per failover.
pub(crate) async fn check(config: &SourceView<'_>, log: &EventLog) -> Result<(), SourceError> {
    let Some((failover, events)) = log.phantom_candidates().await? else {
        return Ok(());
    };
    let read = events.len();
    let mut candidates: HashMap<_, _> = events.into_iter().collect();
    if !candidates.is_empty() {
        let source = source_session(config).await?;
        for (outbox, _) in config.table_outboxes() {
            confirm(&source, outbox, &mut candidates).await?;
        }
    }
    let mut phantoms: Vec<_> = candidates.into_iter().collect();
    phantoms.sort_by_key(|(_, seq)| *seq);
    log.record_phantoms(failover, &phantoms).await?;
    let slot = &config.source().slot;
    if phantoms.is_empty() {
        tracing::warn!(slot = %slot, read, "every event read past the failover's fork is on the new primary");
    } else {
        let messages = config.outboxes().any(|o| o.message_prefix.is_some());
        tracing::error!(slot = %slot, read, phantoms = phantoms.len(), first_seq = phantoms[0].1, "phantoms: events read from the old primary past the failover's fork that no outbox table of the new primary holds; they may be in read models already. Rebuild the projections they reached (`walfold rebuild`, which skips them), or accept those that are right (`walfold phantoms accept EVENT_ID --reason …`) if the application deleted their rows{}", if messages { "; events of message outboxes cannot be confirmed and are counted among them" } else { "" });
    }
    Ok(())
}
