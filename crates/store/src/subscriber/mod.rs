//! A subscriber's store: everything one projector partition reads and writes, bound
//! once to its schema, subscriber, partition and leadership fence. [`SubscriberStore`]
//! is the partition's view between transactions (its position, parked aggregates,
//! retry requests, gaps); [`SubscriberStore::begin`] opens a [`SubscriberTx`], through
//! which every write of the partition goes: the claim (which decides what is a
//! duplicate), versions, dead letters, parks and waiting events. Its
//! [`SubscriberTx::commit`] is the one place that acknowledges a partition's progress:
//! it proves leadership and saves the checkpoint in the transaction, then commits.
//!
//! [`Subscriber`] implements it on PostgreSQL (`postgres.rs`); `memory.rs` (feature
//! `memory`) holds the same rules in memory, for unit tests of the rules above the
//! store (strict order, retries) without a database. Every error of either says for
//! which subscriber and partition ([`StoreError::Subscriber`]).

#[cfg(any(test, feature = "memory"))]
pub mod memory;
mod postgres;

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use futures::future::BoxFuture;
use uuid::Uuid;
use walfold_event::{Aggregate, DeadLetter, Event};

use crate::checkpoint::PartitionStats;
use crate::dead_letter::{Gap, RetryItem};
use crate::error::StoreError;

pub use postgres::{PgSubscriber, PgSubscriberTx, Prepared, Subscriber};

/// What a claim answers: the IDs it claimed.
pub type Claimed = Result<HashSet<Uuid>, StoreError>;

/// A projector partition's store between transactions.
pub trait SubscriberStore: Send {
    /// One transaction of the partition.
    type Tx<'a>: SubscriberTx + Send + Sync
    where
        Self: 'a;

    /// Opens a transaction.
    fn begin<'a>(&'a mut self) -> BoxFuture<'a, Result<Self::Tx<'a>, StoreError>>;

    /// Where the partition resumes.
    fn position<'a>(&'a self) -> BoxFuture<'a, Result<i64, StoreError>>;

    /// The subscriber's parked aggregates, each with whether it waits for a missing
    /// version (a strict projection's gap) rather than behind a failure.
    fn parked<'a>(&'a self) -> BoxFuture<'a, Result<Vec<(Aggregate, bool)>, StoreError>>;

    /// The subscriber's aggregates with a retry requested (`walfold dead-letters retry`).
    fn retry_aggregates<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>>;

    /// The next `limit` dead letters of `aggregate` to retry after seq `after`, open or
    /// retrying, in log order.
    fn retry_page<'a>(
        &'a self,
        aggregate: &'a Aggregate,
        after: i64,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>>;

    /// Aggregates parked behind a discarded dead letter with nothing else of theirs
    /// waiting: nothing would ever release them but their projector.
    fn discarded_parks<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>>;

    /// A strict projection's gaps.
    fn gaps<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Gap>, StoreError>>;

    /// Events of the log by seq.
    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>>;
}

/// One transaction of a projector partition. Dropped without [`SubscriberTx::commit`],
/// nothing of it lands.
pub trait SubscriberTx {
    /// Claims the events `ids` (event ID, claim seq: `Event::claim_seq`) for the
    /// subscriber; returns the IDs this transaction claimed. The rest were processed
    /// before: duplicates, to be skipped.
    fn claim<'a>(
        &'a mut self,
        ids: &'a [(Uuid, i64)],
    ) -> BoxFuture<'a, Result<HashSet<Uuid>, StoreError>>;

    /// [`SubscriberTx::claim`] with `alongside`, another statement of this transaction
    /// that does not wait for the claim's answer, sent in the same round trip (the claim
    /// first); `None` when this store cannot overlap them (nothing was run). The caller
    /// decides what `alongside` may do before it knows which events are duplicates.
    fn claim_alongside<'a, T: Send + 'a>(
        &'a self,
        ids: &'a [(Uuid, i64)],
        alongside: BoxFuture<'a, T>,
    ) -> Option<BoxFuture<'a, (Claimed, T)>> {
        let _ = (ids, alongside);
        None
    }

    /// Gives back claims (by claim seq) made earlier in this transaction for events not
    /// applied after all (waiting for a missing version): claimed again when they apply.
    fn unclaim<'a>(&'a mut self, seqs: &'a [i64]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The last applied version of each of `aggregates` that has one.
    fn applied_versions<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<HashMap<Aggregate, i64>, StoreError>>;

    /// Records the last applied version of each aggregate.
    fn record_versions<'a>(
        &'a mut self,
        versions: &'a [(Aggregate, i64)],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Events of the log by seq (log rows never change: read where the log is).
    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>>;

    /// Records a dead letter of the subscriber; returns its ID.
    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a DeadLetter,
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>>;

    /// Parks `aggregate` behind dead letter `letter` (kept if already parked).
    fn park<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Releases a parked aggregate.
    fn unpark<'a>(&'a mut self, aggregate: &'a Aggregate) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The events of `aggregates` waiting for a missing version, in log order.
    fn waiting<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>>;

    /// Points a gap's park at waiting letter `letter`, unless it points at the gap's
    /// own letter (an open gap); the gap's age counts from then.
    fn repark_waiting<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Deletes the letters of waiting events that went through.
    fn forget_waiting<'a>(
        &'a mut self,
        letters: &'a [i64],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Resolves the gap letter of an aggregate whose missing versions arrived (or were
    /// given up on).
    fn resolve_gap<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        resolution: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A gap outlived its timeout: an open dead letter of its own, the park pointing at it.
    fn open_gap<'a>(
        &'a mut self,
        gap: &'a Gap,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A retried gap whose versions are still missing is open again.
    fn gap_still_open<'a>(
        &'a mut self,
        letter: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A retried dead letter went through, with how.
    fn retried<'a>(
        &'a mut self,
        letter: i64,
        outcome: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A retry of `aggregate` failed again at letter `head`: the chain is open again.
    fn retry_failed<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        head: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Proves this instance still leads, saves the checkpoint (`position` 0 keeps it:
    /// positions only grow) with `stats` added, and commits. On a failed proof nothing
    /// lands.
    fn commit<'a>(
        self,
        position: i64,
        stats: PartitionStats,
        last_committed_at: Option<SystemTime>,
    ) -> BoxFuture<'a, Result<(), StoreError>>
    where
        Self: 'a;
}
