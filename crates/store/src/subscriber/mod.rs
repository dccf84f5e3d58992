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
use std::future::Future;
use std::time::SystemTime;

use uuid::Uuid;
use walfold_event::{Aggregate, DeadLetter, Event};

use crate::checkpoint::PartitionStats;
use crate::dead_letter::{Gap, RetryItem};
use crate::error::StoreError;

pub use postgres::{PgSubscriber, PgSubscriberTx, Prepared, Subscriber};

/// A projector partition's store between transactions.
pub trait SubscriberStore: Send {
    /// One transaction of the partition.
    type Tx<'a>: SubscriberTx + Send + Sync
    where
        Self: 'a;

    /// Opens a transaction.
    fn begin(&mut self) -> impl Future<Output = Result<Self::Tx<'_>, StoreError>> + Send;

    /// Where the partition resumes.
    fn position(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// The subscriber's parked aggregates, each with whether it waits for a missing
    /// version (a strict projection's gap) rather than behind a failure.
    fn parked(&self) -> impl Future<Output = Result<Vec<(Aggregate, bool)>, StoreError>> + Send;

    /// The subscriber's aggregates with a retry requested (`walfold dead-letters retry`).
    fn retry_aggregates(&self) -> impl Future<Output = Result<Vec<Aggregate>, StoreError>> + Send;

    /// The next `limit` dead letters of `aggregate` to retry after seq `after`, open or
    /// retrying, in log order.
    fn retry_page(
        &self,
        aggregate: &Aggregate,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RetryItem>, StoreError>> + Send;

    /// Aggregates parked behind a discarded dead letter with nothing else of theirs
    /// waiting: nothing would ever release them but their projector.
    fn discarded_parks(&self) -> impl Future<Output = Result<Vec<Aggregate>, StoreError>> + Send;

    /// A strict projection's gaps.
    fn gaps(&self) -> impl Future<Output = Result<Vec<Gap>, StoreError>> + Send;

    /// Events of the log by seq.
    fn read_events(
        &self,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;
}

/// One transaction of a projector partition. Dropped without [`SubscriberTx::commit`],
/// nothing of it lands.
pub trait SubscriberTx {
    /// Claims `ids` for the subscriber; returns those this transaction claimed. The rest
    /// were processed before: duplicates, to be skipped.
    fn claim(
        &mut self,
        ids: &[Uuid],
    ) -> impl Future<Output = Result<HashSet<Uuid>, StoreError>> + Send;

    /// Gives back claims made earlier in this transaction for events not applied after
    /// all (waiting for a missing version): claimed again when they apply.
    fn unclaim(&mut self, ids: &[Uuid]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The last applied version of each of `aggregates` that has one.
    fn applied_versions(
        &self,
        aggregates: &[Aggregate],
    ) -> impl Future<Output = Result<HashMap<Aggregate, i64>, StoreError>> + Send;

    /// Records the last applied version of each aggregate.
    fn record_versions(
        &mut self,
        versions: &[(Aggregate, i64)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Events of the log by seq (log rows never change: read where the log is).
    fn read_events(
        &self,
        seqs: &[i64],
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// Records a dead letter of the subscriber; returns its ID.
    fn dead_letter(
        &mut self,
        letter: &DeadLetter,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Parks `aggregate` behind dead letter `letter` (kept if already parked).
    fn park(
        &mut self,
        aggregate: &Aggregate,
        letter: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Releases a parked aggregate.
    fn unpark(
        &mut self,
        aggregate: &Aggregate,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The events of `aggregates` waiting for a missing version, in log order.
    fn waiting(
        &self,
        aggregates: &[Aggregate],
    ) -> impl Future<Output = Result<Vec<RetryItem>, StoreError>> + Send;

    /// Points a gap's park at waiting letter `letter`, unless it points at the gap's
    /// own letter (an open gap); the gap's age counts from then.
    fn repark_waiting(
        &mut self,
        aggregate: &Aggregate,
        letter: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes the letters of waiting events that went through.
    fn forget_waiting(
        &mut self,
        letters: &[i64],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Resolves the gap letter of an aggregate whose missing versions arrived (or were
    /// given up on).
    fn resolve_gap(
        &mut self,
        aggregate: &Aggregate,
        resolution: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A gap outlived its timeout: an open dead letter of its own, the park pointing at it.
    fn open_gap(
        &mut self,
        gap: &Gap,
        error: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A retried gap whose versions are still missing is open again.
    fn gap_still_open(
        &mut self,
        letter: i64,
        error: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A retried dead letter went through, with how.
    fn retried(
        &mut self,
        letter: i64,
        outcome: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A retry of `aggregate` failed again at letter `head`: the chain is open again.
    fn retry_failed(
        &mut self,
        aggregate: &Aggregate,
        head: i64,
        error: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Proves this instance still leads, saves the checkpoint (`position` 0 keeps it:
    /// positions only grow) with `stats` added, and commits. On a failed proof nothing
    /// lands.
    fn commit(
        self,
        position: i64,
        stats: PartitionStats,
        last_committed_at: Option<SystemTime>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
