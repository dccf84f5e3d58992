//! The subscriber's store on PostgreSQL: [`Subscriber`] is bound once per partition,
//! [`Prepared`] are its statements on one connection, [`PgSubscriber`] the two
//! together for one turn of the partition.

use std::collections::{HashMap, HashSet};
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use tokio_postgres::{Client, Statement, Transaction};
use uuid::Uuid;
use walfold_event::{Aggregate, DeadLetter, Event};

use super::{Claimed, SubscriberStore, SubscriberTx};
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
    pub fn on<C>(
        self: &Arc<Self>,
        client: C,
        log: Option<C>,
        prepared: Prepared,
    ) -> PgSubscriber<C> {
        PgSubscriber {
            bound: self.clone(),
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
        client: &(impl tokio_postgres::GenericClient + Sync),
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

/// A subscriber partition's store on one connection (`C`: a client, or what holds
/// one), for one turn.
pub struct PgSubscriber<C> {
    bound: Arc<Subscriber>,
    client: C,
    log: Option<C>,
    prepared: Prepared,
}

impl<C> PgSubscriber<C> {
    pub fn client(&self) -> &C {
        &self.client
    }

    pub fn client_mut(&mut self) -> &mut C {
        &mut self.client
    }

    /// The connection to the event log's target, when it is another.
    pub fn log(&self) -> Option<&C> {
        self.log.as_ref()
    }

    pub fn log_mut(&mut self) -> Option<&mut C> {
        self.log.as_mut()
    }

    /// The connections and statements back, at the end of the turn.
    pub fn into_parts(self) -> (C, Option<C>, Prepared) {
        (self.client, self.log, self.prepared)
    }
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

impl<C> SubscriberStore for PgSubscriber<C>
where
    C: DerefMut<Target = Client> + Send + Sync,
{
    type Tx<'a>
        = PgSubscriberTx<'a>
    where
        Self: 'a;

    fn begin<'a>(&'a mut self) -> BoxFuture<'a, Result<PgSubscriberTx<'a>, StoreError>> {
        Box::pin(async move {
            let bound = &*self.bound;
            let tx = self
                .client
                .transaction()
                .await
                .map_err(bound.db("starting a transaction"))?;
            Ok(PgSubscriberTx {
                tx,
                bound,
                log: self.log.as_deref(),
                prepared: &self.prepared,
            })
        })
    }

    fn position<'a>(&'a self) -> BoxFuture<'a, Result<i64, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            Checkpoints::position(&self.client, &b.schema, &b.subscriber, b.partition)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn parked<'a>(&'a self) -> BoxFuture<'a, Result<Vec<(Aggregate, bool)>, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            DeadLetters::parked(&self.client, &b.schema, &b.subscriber)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn retry_aggregates<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            DeadLetters::retry_aggregates(&self.client, &b.schema, &b.subscriber)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn retry_page<'a>(
        &'a self,
        aggregate: &'a Aggregate,
        after: i64,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            DeadLetters::retry_page(
                &self.client,
                &b.schema,
                &b.subscriber,
                aggregate,
                after,
                limit,
            )
            .await
            .map_err(|e| b.wrap(e))
        })
    }

    fn discarded_parks<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Aggregate>, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            DeadLetters::discarded_parks(&self.client, &b.schema, &b.subscriber)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn gaps<'a>(&'a self) -> BoxFuture<'a, Result<Vec<Gap>, StoreError>> {
        Box::pin(async move {
            let b = &*self.bound;
            DeadLetters::gaps(&self.client, &b.schema, &b.subscriber)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move {
            self.bound
                .read_events(&*self.client, self.log.as_deref(), seqs)
                .await
        })
    }
}

impl SubscriberTx for PgSubscriberTx<'_> {
    fn claim<'a>(
        &'a mut self,
        ids: &'a [(Uuid, i64)],
    ) -> BoxFuture<'a, Result<HashSet<Uuid>, StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            claim::claim(&self.tx, &self.prepared.claim, &b.subscriber, ids)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn claim_alongside<'a, T: Send + 'a>(
        &'a self,
        ids: &'a [(Uuid, i64)],
        alongside: BoxFuture<'a, T>,
    ) -> Option<BoxFuture<'a, (Claimed, T)>> {
        Some(Box::pin(async move {
            let b = self.bound;
            let claim = async {
                claim::claim(&self.tx, &self.prepared.claim, &b.subscriber, ids)
                    .await
                    .map_err(|e| b.wrap(e))
            };
            // Polled in this order, the claim is sent first: the server runs them in
            // that order, one round trip for both.
            futures::join!(claim, alongside)
        }))
    }

    fn unclaim<'a>(&'a mut self, seqs: &'a [i64]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            claim::unclaim(&self.tx, &b.schema, &b.subscriber, seqs)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn applied_versions<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<HashMap<Aggregate, i64>, StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            aggregate_version::applied_versions(&self.tx, &b.schema, &b.subscriber, aggregates)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn record_versions<'a>(
        &'a mut self,
        versions: &'a [(Aggregate, i64)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            aggregate_version::record_versions(&self.tx, &b.schema, &b.subscriber, versions)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn read_events<'a>(&'a self, seqs: &'a [i64]) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        Box::pin(async move { self.bound.read_events(&self.tx, self.log, seqs).await })
    }

    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a DeadLetter,
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            self.prepared
                .dead_letters
                .record(&self.tx, letter)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn park<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            self.prepared
                .dead_letters
                .park(&self.tx, &b.subscriber, aggregate, letter)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn unpark<'a>(&'a mut self, aggregate: &'a Aggregate) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::unpark(&self.tx, &b.schema, &b.subscriber, aggregate)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn waiting<'a>(
        &'a self,
        aggregates: &'a [Aggregate],
    ) -> BoxFuture<'a, Result<Vec<RetryItem>, StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::waiting(&self.tx, &b.schema, &b.subscriber, aggregates)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn repark_waiting<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        letter: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::repark_waiting(&self.tx, &b.schema, &b.subscriber, aggregate, letter)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn forget_waiting<'a>(
        &'a mut self,
        letters: &'a [i64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::forget_waiting(&self.tx, &b.schema, letters)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn resolve_gap<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        resolution: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::resolve_gap(&self.tx, &b.schema, &b.subscriber, aggregate, resolution)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn open_gap<'a>(
        &'a mut self,
        gap: &'a Gap,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            self.prepared
                .dead_letters
                .open_gap(&self.tx, &b.subscriber, gap, error)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn gap_still_open<'a>(
        &'a mut self,
        letter: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::gap_still_open(&self.tx, &b.schema, letter, error)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn retried<'a>(
        &'a mut self,
        letter: i64,
        outcome: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::retried(&self.tx, &b.schema, letter, outcome)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn retry_failed<'a>(
        &'a mut self,
        aggregate: &'a Aggregate,
        head: i64,
        error: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let b = self.bound;
            DeadLetters::retry_failed(&self.tx, &b.schema, &b.subscriber, aggregate, head, error)
                .await
                .map_err(|e| b.wrap(e))
        })
    }

    fn commit<'a>(
        self,
        position: i64,
        stats: PartitionStats,
        last_committed_at: Option<SystemTime>,
    ) -> BoxFuture<'a, Result<(), StoreError>>
    where
        Self: 'a,
    {
        Box::pin(async move {
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
        })
    }
}
