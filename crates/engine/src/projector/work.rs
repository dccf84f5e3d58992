//! The unit of work: one projector transaction, a thin user of the subscriber's store
//! transaction ([`SubscriberTx`]). It claims (what the claim does not return is a
//! duplicate), applies through the projection, dead-letters and parks, and commits
//! (the store proves leadership and writes the checkpoint), keeping the counters and
//! signals around them.

use futures::future::BoxFuture;
use std::ops::DerefMut;
use std::time::{Instant, SystemTime};

use walfold_config::{ProjectionConfig, VersionMode};
use walfold_event::{Aggregate, DeadLetter, Event, Reason};
use walfold_store::{PartitionStats, PgSubscriber, PgSubscriberTx, SubscriberStore, SubscriberTx};
use walfold_telemetry::failpoint;
use walfold_telemetry::signal::Signal;

use super::strict::{HeldAggregates, StrictOutcome};
use crate::error::{EngineError, ProjectionError};
use crate::projection::{Applied, Projection};

/// Applies claimed events inside a transaction of store `S`: a projection on
/// PostgreSQL, a stand-in in unit tests.
pub(crate) trait Apply<S: SubscriberStore>: Sync {
    fn apply<'a, 't>(
        &'a self,
        tx: &'a S::Tx<'t>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>>
    where
        't: 'a,
        S: 't;

    /// Whether the apply may run beside the claim and be rolled back with it (see
    /// [`Projection::writes_only_through_tx`]).
    fn writes_only_through_tx(&self) -> bool {
        false
    }
}

impl<'p, C> Apply<PgSubscriber<C>> for dyn Projection + 'p
where
    C: DerefMut<Target = tokio_postgres::Client> + Send + Sync,
{
    fn apply<'a, 't>(
        &'a self,
        tx: &'a PgSubscriberTx<'t>,
        events: &'a [&'a Event],
    ) -> BoxFuture<'a, Result<Vec<Applied>, ProjectionError>>
    where
        't: 'a,
        PgSubscriber<C>: 't,
    {
        self.apply_batch(tx.transaction(), events)
    }

    fn writes_only_through_tx(&self) -> bool {
        Projection::writes_only_through_tx(self)
    }
}

/// What the rules of a partition go by, free of connections: its projection's
/// options, which partition it is, and what applies its events.
pub(crate) struct Rules<'p, A: ?Sized> {
    pub options: &'p ProjectionConfig,
    pub partition: u32,
    pub projection: &'p A,
}

impl<A: ?Sized> Rules<'_, A> {
    pub fn subscriber(&self) -> &str {
        &self.options.subscriber
    }

    /// Whether this partition owns `aggregate`.
    pub fn owns(&self, aggregate: &Aggregate) -> bool {
        aggregate.partition_hash() % self.options.parallelism as i32 == self.partition as i32
    }

    /// An event this projection can never apply as it is (retrying cannot help).
    pub fn invalid_event(&self, message: &str) -> EngineError {
        self.apply_error(ProjectionError::Invalid(message.into()))
    }

    /// The projection's apply failed.
    pub fn apply_error(&self, source: ProjectionError) -> EngineError {
        EngineError::Apply {
            projection: self.options.name.clone(),
            source,
        }
    }

    pub fn invalid(&self, message: &str) -> EngineError {
        EngineError::Projection {
            projection: self.options.name.clone(),
            message: message.into(),
        }
    }
}

/// One projector transaction. Every write of a projector goes through it, so each rule
/// lives in one place: [`SubscriberTx::commit`] proves leadership and saves the
/// checkpoint, [`SubscriberTx::claim`] decides what is a duplicate.
pub(crate) struct Work<'s, 'r, S: SubscriberStore + 's, A: ?Sized> {
    pub(super) tx: S::Tx<'s>,
    pub(super) rules: &'r Rules<'r, A>,
    pub(super) stats: PartitionStats,
    started: Instant,
    pub(super) events: usize,
    /// Retrying a dead letter: what its event does resolves that letter, never a new one.
    pub(super) retrying: bool,
}

impl<'s, 'r, S, A> Work<'s, 'r, S, A>
where
    S: SubscriberStore + 's,
    A: Apply<S> + ?Sized,
{
    pub async fn begin(
        store: &'s mut S,
        rules: &'r Rules<'r, A>,
    ) -> Result<Work<'s, 'r, S, A>, EngineError> {
        Ok(Work {
            tx: store.begin().await?,
            rules,
            stats: PartitionStats::default(),
            started: Instant::now(),
            events: 0,
            retrying: false,
        })
    }

    /// Claims `events` for the subscriber: the ones returned are new and must be
    /// applied in this transaction; the rest were processed before (duplicates).
    pub async fn claim<'e>(&mut self, events: &[&'e Event]) -> Result<Vec<&'e Event>, EngineError> {
        self.events += events.len();
        let ids: Vec<(uuid::Uuid, i64)> = events.iter().map(|e| (e.id, e.claim_seq)).collect();
        let claimed = self.tx.claim(&ids).await?;
        self.stats.duplicates += (ids.len() - claimed.len()) as i64;
        Ok(events
            .iter()
            .copied()
            .filter(|e| claimed.contains(&e.id))
            .collect())
    }

    /// Applies claimed events in order.
    pub async fn apply(&mut self, events: &[&Event]) -> Result<Vec<Applied>, EngineError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let results = self
            .rules
            .projection
            .apply(&self.tx, events)
            .await
            .map_err(|source| self.rules.apply_error(source))?;
        self.count(&results);
        Ok(results)
    }

    /// Counts the apply's outcomes.
    fn count(&mut self, results: &[Applied]) {
        for r in results {
            match r {
                Applied::Changed => self.stats.applied += 1,
                Applied::Stale => self.stats.stale += 1,
            }
        }
    }

    /// Claims and applies `events` of a projection in log order in one round trip: the
    /// claim and, sent with it, the apply of every event, on the bet that none was
    /// claimed before (a duplicate is rare: a redelivery, a re-read after a restart or a
    /// changed partition count). `Some(true)`: all were new, the apply's outcomes are
    /// theirs. `Some(false)`: some were claimed before and the apply ran on them too, so
    /// this transaction must not commit: drop it (nothing of it lands) and process the
    /// batch again with [`Work::process`]. `None`: nothing was run (a strict
    /// projection, one that may have effects outside the transaction, or a store that
    /// cannot send both at once): use [`Work::process`].
    pub async fn process_all_new(
        &mut self,
        events: &[&Event],
    ) -> Result<Option<bool>, EngineError> {
        if self.rules.options.version_mode != VersionMode::Guard
            || events.is_empty()
            || !self.rules.projection.writes_only_through_tx()
        {
            return Ok(None);
        }
        let ids: Vec<(uuid::Uuid, i64)> = events.iter().map(|e| (e.id, e.claim_seq)).collect();
        let tx = &self.tx;
        let apply = self.rules.projection.apply(tx, events);
        let Some(both) = tx.claim_alongside(&ids, apply) else {
            return Ok(None);
        };
        let (claimed, applied) = both.await;
        if claimed?.len() != ids.len() {
            // The apply's outcome (or error) is of events that may be duplicates.
            return Ok(Some(false));
        }
        let results = applied.map_err(|source| self.rules.apply_error(source))?;
        if results.len() != events.len() {
            return Err(self
                .rules
                .invalid("the projection returned outcomes for other events than it was given"));
        }
        self.events += events.len();
        self.count(&results);
        Ok(Some(true))
    }

    /// Claims and applies `events` by the projection's version mode: in log order behind
    /// the projection's own guard, or strictly in version order (see `strict.rs`).
    pub async fn process(
        &mut self,
        events: &[&Event],
        held: &HeldAggregates,
    ) -> Result<StrictOutcome, EngineError> {
        match self.rules.options.version_mode {
            VersionMode::Guard => {
                let claimed = self.claim(events).await?;
                self.apply(&claimed).await?;
                Ok(StrictOutcome::default())
            }
            VersionMode::Strict if events.iter().any(|e| e.version.is_none()) => {
                Err(self.rules.invalid_event(
                    "event has no version; a strict projection applies versions in order",
                ))
            }
            VersionMode::Strict => self.apply_strict(events, held, &[], &[]).await,
        }
    }

    /// Records a dead letter of this subscriber; parks its aggregate when `park`.
    pub async fn dead_letter(
        &mut self,
        letter: &DeadLetter,
        park: bool,
    ) -> Result<(), EngineError> {
        self.events += 1;
        let id = self.tx.dead_letter(letter).await?;
        self.stats.dead_lettered += 1;
        if park {
            let (Some(id), Some(kind), Some(aggregate)) =
                (id, &letter.aggregate_type, &letter.aggregate_id)
            else {
                return Err(self
                    .rules
                    .invalid("a subscriber's dead letter was not recorded"));
            };
            self.tx.park(&Aggregate::new(kind, aggregate), id).await?;
        }
        Ok(())
    }

    /// A retried dead letter went through (`strict`: what its strict pass did).
    pub async fn retried(
        &mut self,
        letter: i64,
        strict: &StrictOutcome,
    ) -> Result<(), EngineError> {
        let outcome = if self.stats.applied > 0 {
            "retried: applied"
        } else if strict.waiting > 0 {
            "retried: waiting for a missing version (set aside as version_gap)"
        } else if self.stats.stale > 0 {
            "retried: stale (a newer version was already applied)"
        } else {
            "retried: already applied (duplicate)"
        };
        Ok(self.tx.retried(letter, outcome).await?)
    }

    /// Releases an aggregate parked behind a failure (the last event of its retried
    /// chain; a strict pass after it may park it again behind a gap).
    pub async fn release(&mut self, aggregate: &Aggregate) -> Result<(), EngineError> {
        Ok(self.tx.unpark(aggregate).await?)
    }

    /// Commits through the store (which proves this instance still leads and saves the
    /// checkpoint, `position` 0 keeping it, with the counters), and counts what it did.
    pub async fn commit(
        self,
        position: i64,
        last_committed_at: Option<SystemTime>,
    ) -> Result<PartitionStats, EngineError> {
        // Tests: a transaction still open while another instance takes over.
        failpoint::delay("projector_commit").await;
        self.tx
            .commit(position, self.stats, last_committed_at)
            .await?;
        let s = self.stats;
        if s.applied + s.stale + s.duplicates > 0 {
            // Crash window: applied and checkpointed, not yet counted in this process.
            failpoint::hit("after_projection_commit");
        }
        walfold_telemetry::stall::moved(&walfold_telemetry::stall::Unit::Partition {
            subscriber: self.rules.subscriber().to_owned(),
            partition: self.rules.partition,
        });
        Signal::Committed {
            subscriber: self.rules.subscriber(),
            applied: s.applied as u64,
            stale: s.stale as u64,
            duplicates: s.duplicates as u64,
            dead_lettered: s.dead_lettered as u64,
            events: self.events,
            took: self.started.elapsed(),
        }
        .report();
        Ok(s)
    }
}

/// The dead letter for an event that waits behind a parked aggregate.
pub(crate) fn waiting_letter(subscriber: &str, e: &Event) -> DeadLetter {
    DeadLetter {
        subscriber_id: Some(subscriber.to_owned()),
        event_id: Some(e.id),
        seq: Some(e.seq),
        aggregate_type: Some(e.aggregate_type.clone()),
        aggregate_id: Some(e.aggregate_id.clone()),
        reason: Reason::AggregateParked,
        error: "an earlier event of this aggregate failed; waiting for it to be retried".into(),
        raw: Some(serde_json::json!({
            "seq": e.seq,
            "event_id": e.id,
            "aggregate_type": e.aggregate_type,
            "aggregate_id": e.aggregate_id,
            "event_type": e.event_type,
            "version": e.version,
            "payload": e.payload.to_value(),
            "headers": e.headers.as_ref().map(walfold_event::JsonText::to_value),
        })),
        existing: None,
        attempts: 0,
        source_lsn: Some(e.source_lsn),
        origin: None,
    }
}
