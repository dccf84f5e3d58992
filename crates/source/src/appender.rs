//! The appender: batches what the reader sends into event-log transactions and, only
//! after each commit, publishes the batch's position as durable.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use walfold_store::{failpoint, EventLog, IngestCounts, Lsn};

use crate::error::SourceError;
use crate::feedback::Durable;
use crate::reader::Item;

/// Counters of one run, for logs and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendTotals {
    pub appended: u64,
    pub duplicates: u64,
    pub id_conflicts: u64,
    pub malformed: u64,
    pub ignored: u64,
}

pub(crate) struct Appender {
    pub log: EventLog,
    pub durable: Durable,
    pub head: watch::Sender<i64>,
    pub batch_size: usize,
    pub linger: Duration,
}

impl Appender {
    /// Runs until the reader closes the channel, then returns after the last commit.
    pub(crate) async fn run(mut self, mut items: mpsc::Receiver<Item>) -> Result<(), SourceError> {
        let mut batch = Vec::with_capacity(self.batch_size);
        let mut totals = AppendTotals::default();
        loop {
            batch.clear();
            let Some(first) = items.recv().await else {
                break;
            };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.linger;
            while batch.len() < self.batch_size {
                match items.try_recv() {
                    Ok(item) => batch.push(item),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, items.recv()).await {
                            Ok(Some(item)) => batch.push(item),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
            self.flush(&mut batch, &mut totals).await?;
        }
        tracing::info!(
            appended = totals.appended,
            duplicates = totals.duplicates,
            id_conflicts = totals.id_conflicts,
            malformed = totals.malformed,
            "appender stopped"
        );
        Ok(())
    }

    async fn flush(
        &mut self,
        batch: &mut Vec<Item>,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        let mut events = Vec::new();
        let mut dead = Vec::new();
        let mut counts = IngestCounts::default();
        let mut through: Option<Lsn> = None;
        for item in batch.drain(..) {
            match item {
                Item::Event(e) => events.push(e),
                Item::Rejected(d) => {
                    counts.malformed += 1;
                    dead.push(*d);
                }
                Item::Ignored => counts.ignored_changes += 1,
                Item::Through(lsn) => through = Some(through.map_or(lsn, |t| t.max(lsn))),
            }
        }
        let outcome = self
            .log
            .append(&events, &dead, through, counts)
            .await
            .map_err(SourceError::store("appending to the event log"))?;
        if outcome.appended > 0 {
            // Crash window: events durable in the log, slot not yet acknowledged.
            failpoint::hit("after_append_commit");
        }
        if outcome.duplicates > 0 || outcome.id_conflicts > 0 {
            tracing::info!(
                duplicates = outcome.duplicates,
                id_conflicts = outcome.id_conflicts,
                "repeated event IDs at the event log"
            );
        }
        totals.appended += outcome.appended;
        totals.duplicates += outcome.duplicates;
        totals.id_conflicts += outcome.id_conflicts;
        totals.malformed += counts.malformed;
        totals.ignored += counts.ignored_changes;
        if outcome.appended > 0 {
            self.head.send_replace(self.log.head());
        }
        if let Some(lsn) = through {
            self.durable.committed_through(lsn);
        }
        Ok(())
    }
}
