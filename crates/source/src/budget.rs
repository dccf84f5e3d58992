//! The bytes a source has in flight between its replication stream and the event log
//! (`pipeline.ingest_bytes`). The replication worker takes a message's size before it
//! hands the message on; the reader passes what was taken with the items it makes of
//! it, and the appender gives it back once their batch is committed. So the channels
//! and the append batch together never hold more than the budget, beside their bounds
//! in rows; a message larger than the whole budget takes all of it and flows alone.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One source's budget of bytes in flight.
#[derive(Debug, Clone)]
pub struct Budget {
    permits: Arc<Semaphore>,
    bytes: u32,
}

/// Bytes taken from a [`Budget`], given back when dropped.
#[derive(Debug, Default)]
pub struct InFlightBytes(Option<OwnedSemaphorePermit>);

impl Budget {
    pub fn new(bytes: usize) -> Budget {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
        Budget {
            permits: Arc::new(Semaphore::new(bytes as usize)),
            bytes,
        }
    }

    /// What `bytes` takes: at most the whole budget.
    fn share(&self, bytes: usize) -> u32 {
        u32::try_from(bytes).unwrap_or(u32::MAX).min(self.bytes)
    }

    /// Takes `bytes` (at most the whole budget) if they are free now.
    pub fn try_take(&self, bytes: usize) -> Option<InFlightBytes> {
        match self.share(bytes) {
            0 => Some(InFlightBytes(None)),
            n => self
                .permits
                .clone()
                .try_acquire_many_owned(n)
                .ok()
                .map(|p| InFlightBytes(Some(p))),
        }
    }

    /// Takes `bytes` (at most the whole budget), waiting until they are given back.
    pub async fn take(self, bytes: usize) -> InFlightBytes {
        match self.share(bytes) {
            0 => InFlightBytes(None),
            n => InFlightBytes(
                // Never closed: the semaphore lives as long as this budget.
                self.permits.acquire_many_owned(n).await.ok(),
            ),
        }
    }

    /// The whole budget.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }

    /// Nothing is left: whoever holds the bytes should give them back before taking more.
    pub fn spent(&self) -> bool {
        self.permits.available_permits() == 0
    }
}

impl InFlightBytes {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |p| p.num_permits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_larger_than_the_budget_flows_alone() {
        let budget = Budget::new(100);
        let small = budget.try_take(30).unwrap();
        assert_eq!(small.bytes(), 30);
        // The whole budget, once what is in flight is given back.
        assert!(budget.try_take(1000).is_none());
        drop(small);
        let large = budget.try_take(1000).unwrap();
        assert_eq!(large.bytes(), 100);
        assert!(budget.spent());
        assert!(budget.try_take(1).is_none());
        assert_eq!(budget.try_take(0).unwrap().bytes(), 0);
        let waiting = tokio::spawn(budget.clone().take(10));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(large);
        assert_eq!(waiting.await.unwrap().bytes(), 10);
    }
}
