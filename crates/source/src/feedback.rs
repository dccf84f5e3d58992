//! The one place that acknowledges LSNs.
//!
//! ```text
//!  reader ──items──► appender ──commit──► event_log (target DB)
//!    ▲                   │
//!    └──── durable LSN ◄─┘  (published only after the append transaction commits)
//!    │
//!    └──► standby status update (flush = durable LSN) ──► slot confirmed_flush_lsn
//! ```
//!
//! Why the acknowledged position can never pass what is durable: the appender publishes
//! an LSN only after the transaction that wrote every event of the source transactions
//! ending at or before it has committed, and the reader reports nothing else. The
//! position is monotonic. A crash anywhere replays from the slot's confirmed position at
//! worst, and the event log's ID check turns the replay into counted duplicates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use walfold_event::Lsn;

use crate::wire::ReplicationClient;

/// The appender's side: publishes positions whose events are durably in the event log.
#[derive(Debug)]
pub struct Durable(watch::Sender<Lsn>);

/// The reader's side: forwards durable positions to the server.
#[derive(Debug)]
pub struct Acknowledger {
    durable: watch::Receiver<Lsn>,
    sent: Arc<AtomicU64>,
    last_passed: Lsn,
    /// The feedback count when `last_passed` was raised, until a status update follows.
    unsent_since: Option<u64>,
}

/// A connected pair for one streaming attempt.
pub fn channel() -> (Durable, Acknowledger) {
    let (tx, rx) = watch::channel(Lsn::ZERO);
    (
        Durable(tx),
        Acknowledger {
            durable: rx,
            sent: Arc::new(AtomicU64::new(0)),
            last_passed: Lsn::ZERO,
            unsent_since: None,
        },
    )
}

impl Durable {
    /// Call only after the transaction holding every event up to `lsn` has committed.
    pub fn committed_through(&self, lsn: Lsn) {
        self.0.send_if_modified(|current| {
            let before = *current;
            current.advance(lsn);
            *current != before
        });
    }
}

impl Acknowledger {
    /// Counts standby status updates that advanced the reported position.
    pub fn observer(&self, source: &str) -> Arc<dyn Fn() + Send + Sync> {
        let sent = self.sent.clone();
        let source = source.to_owned();
        Arc::new(move || {
            sent.fetch_add(1, Ordering::Relaxed);
            walfold_telemetry::signal::Signal::FeedbackSent { source: &source }.report();
        })
    }

    /// Waits for the appender to publish a new durable position; `None` once the
    /// appender has finished (its side was dropped).
    pub async fn next(&mut self) -> Option<Lsn> {
        self.durable.changed().await.ok()?;
        Some(*self.durable.borrow_and_update())
    }

    /// Hands `lsn` to the replication client, which reports it as flushed.
    pub fn acknowledge(&mut self, client: &ReplicationClient, lsn: Lsn) {
        if lsn > self.last_passed {
            self.last_passed = lsn;
            self.unsent_since = Some(self.sent.load(Ordering::Relaxed));
            client.update_applied_lsn(lsn);
            tracing::trace!(lsn = %lsn, "acknowledged");
        }
    }

    /// On a clean stop: takes the appender's final position and waits (bounded) until
    /// the client has reported it to the server.
    pub async fn finish(&mut self, client: &ReplicationClient) {
        while let Some(lsn) = self.next().await {
            self.acknowledge(client, lsn);
        }
        let final_lsn = *self.durable.borrow();
        self.acknowledge(client, final_lsn);
        let Some(count) = self.unsent_since else {
            return;
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while self.sent.load(Ordering::Relaxed) == count && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::info!(lsn = %self.last_passed, "sent final feedback");
    }
}
