//! The subscriber's store on PostgreSQL: [`Subscriber`] is bound once per partition,
//! [`Prepared`] are its statements on one connection, [`PgSubscriber`] the two
//! together for one turn of the partition.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use tokio_postgres::{Client, Statement, Transaction};
use uuid::Uuid;
use walfold_event::{Aggregate, DeadLetter, Event};

use super::{SubscriberStore, SubscriberTx};
use crate::checkpoint::{Checkpoints, PartitionStats};
use crate::dead_letter::{DeadLetters, Gap, RetryItem};
use crate::error::StoreError;
use crate::event_log::read_events;
use crate::leader::{Fence, PreparedFence};
use crate::schema::Schema;
use crate::{aggregate_version, claim};

/// One partition of one subscriber, bound once: where its state is, who it is, and the
/// fence every one of its transactions proves.
#[derive(Debug, Clone)]
pub struct Subscriber {
    schema: Schema,
    /// The schema of the event log, when it is another target's (the main one).
    log_schema: Option<Schema>,
    subscriber: Arc<str>,
    partition: u32,
    partitions: u32,
    fence: Fence,
}

/// A subscriber partition's statements, prepared on one connection.
pub struct Prepared {
    fence: PreparedFence,
    claim: Statement,
    checkpoints: Checkpoints,
    dead_letters: DeadLetters,
}

impl Prepared {
    /// Whether these statements prove `fence` (a new leader's epoch needs new ones).
    pub fn is_for(&self, fence: &Fence) -> bool {
        self.fence.is_for(fence)
    }
}

impl Subscriber {
    /// Partition `partition` of `partitions` of `subscriber`, its state in `schema`, its
    /// event log in `log_schema` when that is another target's.
    pub fn new(
        schema: Schema,
        log_schema: Option<Schema>,
        subscriber: &str,
        partition: u32,
        partitions: u32,
        fence: Fence,
    ) -> Subscriber {
        Subscriber {
            schema,
            log_schema,
            subscriber: subscriber.into(),
            partition,
            partitions,
            fence,
        }
    }

    pub fn name(&self) -> &str {
        &self.subscriber
    }

    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The error `e` of one of this partition's statements, saying whose.
    fn wrap(&self, e: StoreError) -> StoreError {
        StoreError::Subscriber {
            subscriber: self.subscriber.clone(),
            partition: self.partition,
            source: Box::new(e),
        }
    }

    fn db(&self, context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError + '_ {
        move |e| {
            self.wrap(StoreError::Db {
                context: context.into(),
                source: e,
            })
        }
    }

    /// Prepares the partition's statements on `client`.
    pub async fn prepare(&self, client: &Client) -> Result<Prepared, StoreError> {
        let fence = self.fence.prepare(client).await.map_err(|e| self.wrap(e))?;
        let claim = client
            .prepare(&claim::claim_sql(&self.schema))
            .await
            .map_err(self.db("preparing the claim"))?;
        let checkpoints =
            Checkpoints::prepare(client, &self.schema, &self.subscriber, self.partitions)
                .await
                .map_err(|e| self.wrap(e))?;
        let dead_letters = DeadLetters::prepare(client, &self.schema)
            .await
            .map_err(|e| self.wrap(e))?;
        Ok(Prepared {
            fence,
            claim,
            checkpoints,
            dead_letters,
        })
    }

    /// The store for one turn on `client` (`log`: a connection to the event log's target
    /// when it is another), with `prepared` made there.
    pub fn on<'c>(
        &'c self,
        client: &'c mut Client,
        log: Option<&'c Client>,
        prepared: &'c Prepared,
    ) -> PgSubscriber<'c> {
        PgSubscriber {
            bound: self,
            client,
            log,
            prepared,
        }
    }

    /// Records (or updates) why the partition is paused; fenced (best effort: the
    /// cause may keep it from landing).
    pub async fn record_pause(
        &self,
        client: &mut Client,
        sqlstate: Option<&str>,
        error: &str,
    ) -> Result<(), StoreError> {
        crate::pause::record_pause(
            client,
            &self.fence,
            &self.schema,
            &self.subscriber,
            self.partition,
            sqlstate,
            error,
        )
        .await
        .map_err(|e| self.wrap(e))
    }

    /// Forgets the partition's pause, after a commit.
    pub async fn clear_pause(&self, client: &Client) -> Result<(), StoreError> {
        crate::pause::clear_pause(client, &self.schema, &self.subscriber, self.partition)
            .await
            .map_err(|e| self.wrap(e))
    }

    /// Events of the log by seq, on `client` or on `log` (the main target's).
    async fn read_events(
        &self,
        client: &impl tokio_postgres::GenericClient,
        log: Option<&Client>,
        seqs: &[i64],
    ) -> Result<Vec<Event>, StoreError> {
        match (log, &self.log_schema) {
            (Some(log), Some(schema)) => read_events(log, schema, seqs).await,
            _ => read_events(client, &self.schema, seqs).await,
        }
        .map_err(|e| self.wrap(e))
    }
}

/// A subscriber partition's store on one connection, for one turn.
pub struct PgSubscriber<'c> {
    bound: &'c Subscriber,
    client: &'c mut Client,
    log: Option<&'c Client>,
    prepared: &'c Prepared,
}

/// A transaction of a subscriber partition on PostgreSQL.
pub struct PgSubscriberTx<'t> {
    tx: Transaction<'t>,
    bound: &'t Subscriber,
    log: Option<&'t Client>,
    prepared: &'t Prepared,
}

impl<'t> PgSubscriberTx<'t> {
    /// The transaction, for the projection's own statements.
    pub fn transaction(&self) -> &Transaction<'t> {
        &self.tx
    }
}

impl SubscriberStore for PgSubscriber<'_> {
    type Tx<'a>
        = PgSubscriberTx<'a>
    where
        Self: 'a;

    async fn begin(&mut self) -> Result<PgSubscriberTx<'_>, StoreError> {
        let bound = self.bound;
        let tx = self
            .client
            .transaction()
            .await
            .map_err(bound.db("starting a transaction"))?;
        Ok(PgSubscriberTx {
            tx,
            bound,
            log: self.log,
            prepared: self.prepared,
        })
    }

    async fn position(&self) -> Result<i64, StoreError> {
        let b = self.bound;
        Checkpoints::position(self.client, &b.schema, &b.subscriber, b.partition)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn parked(&self) -> Result<Vec<(Aggregate, bool)>, StoreError> {
        let b = self.bound;
        DeadLetters::parked(self.client, &b.schema, &b.subscriber)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn retry_aggregates(&self) -> Result<Vec<Aggregate>, StoreError> {
        let b = self.bound;
        DeadLetters::retry_aggregates(self.client, &b.schema, &b.subscriber)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn retry_page(
        &self,
        aggregate: &Aggregate,
        after: i64,
        limit: i64,
    ) -> Result<Vec<RetryItem>, StoreError> {
        let b = self.bound;
        DeadLetters::retry_page(
            self.client,
            &b.schema,
            &b.subscriber,
            aggregate,
            after,
            limit,
        )
        .await
        .map_err(|e| b.wrap(e))
    }

    async fn discarded_parks(&self) -> Result<Vec<Aggregate>, StoreError> {
        let b = self.bound;
        DeadLetters::discarded_parks(self.client, &b.schema, &b.subscriber)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn gaps(&self) -> Result<Vec<Gap>, StoreError> {
        let b = self.bound;
        DeadLetters::gaps(self.client, &b.schema, &b.subscriber)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn read_events(&self, seqs: &[i64]) -> Result<Vec<Event>, StoreError> {
        self.bound.read_events(&*self.client, self.log, seqs).await
    }
}

impl SubscriberTx for PgSubscriberTx<'_> {
    async fn claim(&mut self, ids: &[Uuid]) -> Result<HashSet<Uuid>, StoreError> {
        let b = self.bound;
        claim::claim(&self.tx, &self.prepared.claim, &b.subscriber, ids)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn unclaim(&mut self, ids: &[Uuid]) -> Result<(), StoreError> {
        let b = self.bound;
        claim::unclaim(&self.tx, &b.schema, &b.subscriber, ids)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn applied_versions(
        &self,
        aggregates: &[Aggregate],
    ) -> Result<HashMap<Aggregate, i64>, StoreError> {
        let b = self.bound;
        aggregate_version::applied_versions(&self.tx, &b.schema, &b.subscriber, aggregates)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn record_versions(&mut self, versions: &[(Aggregate, i64)]) -> Result<(), StoreError> {
        let b = self.bound;
        aggregate_version::record_versions(&self.tx, &b.schema, &b.subscriber, versions)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn read_events(&self, seqs: &[i64]) -> Result<Vec<Event>, StoreError> {
        self.bound.read_events(&self.tx, self.log, seqs).await
    }

    async fn dead_letter(&mut self, letter: &DeadLetter) -> Result<Option<i64>, StoreError> {
        let b = self.bound;
        self.prepared
            .dead_letters
            .record(&self.tx, letter)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn park(&mut self, aggregate: &Aggregate, letter: i64) -> Result<(), StoreError> {
        let b = self.bound;
        self.prepared
            .dead_letters
            .park(&self.tx, &b.subscriber, aggregate, letter)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn unpark(&mut self, aggregate: &Aggregate) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::unpark(&self.tx, &b.schema, &b.subscriber, aggregate)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn waiting(&self, aggregates: &[Aggregate]) -> Result<Vec<RetryItem>, StoreError> {
        let b = self.bound;
        DeadLetters::waiting(&self.tx, &b.schema, &b.subscriber, aggregates)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn repark_waiting(
        &mut self,
        aggregate: &Aggregate,
        letter: i64,
    ) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::repark_waiting(&self.tx, &b.schema, &b.subscriber, aggregate, letter)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn forget_waiting(&mut self, letters: &[i64]) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::forget_waiting(&self.tx, &b.schema, letters)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn resolve_gap(
        &mut self,
        aggregate: &Aggregate,
        resolution: &str,
    ) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::resolve_gap(&self.tx, &b.schema, &b.subscriber, aggregate, resolution)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn open_gap(&mut self, gap: &Gap, error: &str) -> Result<(), StoreError> {
        let b = self.bound;
        self.prepared
            .dead_letters
            .open_gap(&self.tx, &b.subscriber, gap, error)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn gap_still_open(&mut self, letter: i64, error: &str) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::gap_still_open(&self.tx, &b.schema, letter, error)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn retried(&mut self, letter: i64, outcome: &str) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::retried(&self.tx, &b.schema, letter, outcome)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn retry_failed(
        &mut self,
        aggregate: &Aggregate,
        head: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        let b = self.bound;
        DeadLetters::retry_failed(&self.tx, &b.schema, &b.subscriber, aggregate, head, error)
            .await
            .map_err(|e| b.wrap(e))
    }

    async fn commit(
        self,
        position: i64,
        stats: PartitionStats,
        last_committed_at: Option<SystemTime>,
    ) -> Result<(), StoreError> {
        let b = self.bound;
        // Sent together: one round trip. On a failed proof nothing is committed.
        futures::try_join!(
            self.prepared.fence.check(&self.tx),
            self.prepared.checkpoints.save(
                &self.tx,
                b.partition,
                position,
                stats,
                last_committed_at
            ),
        )
        .map_err(|e| b.wrap(e))?;
        self.tx.commit().await.map_err(b.db("committing"))
    }
}
