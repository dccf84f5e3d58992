//! A projector: one partition of one subscriber. It tails the event log from its
//! checkpoint and, per batch, in ONE transaction: claims the events (the claim decides
//! what is a duplicate), applies the claimed ones in order, saves the checkpoint. An
//! event that keeps failing is dead-lettered and its aggregate parked for this
//! subscriber, so its later events wait while other aggregates go on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_postgres::{Client, Statement};
use tokio_util::sync::CancellationToken;
use walfold_config::ProjectionConfig;
use walfold_store::{
    claim, claim_sql, connect, failpoint, partition_hash, read_events, read_page, read_sql,
    Checkpoints, DeadLetter, DeadLetters, Directive, Event, Filter, PartitionStats, Reason,
    RetryItem,
};

use walfold_store::metrics::{metrics, Metrics};

use crate::error::{EngineError, ProjectionError};
use crate::projection::{Applied, Projection};

/// Everything a partition worker needs.
#[derive(Clone)]
pub(crate) struct Partition {
    pub url: String,
    pub schema: String,
    pub options: ProjectionConfig,
    pub projection: Arc<dyn Projection>,
    pub partition: u32,
}

struct Conn {
    client: Client,
    /// The page read; sent unnamed each time (see [`read_page`]).
    read: String,
    claim: Statement,
    checkpoints: Checkpoints,
    dead_letters: DeadLetters,
}

type AggregateKey = (String, String);

/// How often a projector looks for dead letters an operator asked to retry.
const RETRY_CHECK: Duration = Duration::from_secs(1);

impl Partition {
    fn subscriber(&self) -> &str {
        &self.options.subscriber
    }

    /// Runs until cancelled; reconnects with backoff on transient errors.
    pub(crate) async fn run(
        self,
        cancel: CancellationToken,
        head: watch::Receiver<i64>,
    ) -> Result<(), EngineError> {
        let mut delay = Duration::from_millis(100);
        loop {
            let started = tokio::time::Instant::now();
            match self.run_once(&cancel, head.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) if e.directive() == Directive::Retry && !cancel.is_cancelled() => {
                    if started.elapsed() > Duration::from_secs(30) {
                        delay = Duration::from_millis(100);
                    }
                    tracing::warn!(subscriber = %self.subscriber(), partition = self.partition, error = %e, "projector failed, retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
                Err(_) if cancel.is_cancelled() => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// A retryable projection error, kept retryable (classified by its SQLSTATE).
    fn transient(&self, e: ProjectionError) -> EngineError {
        match e {
            ProjectionError::Db(source) => EngineError::Store {
                context: format!("projection {}", self.options.name),
                source: walfold_store::StoreError::Db {
                    context: "apply".into(),
                    source,
                },
            },
            other => EngineError::Projection {
                projection: self.options.name.clone(),
                message: other.to_string(),
            },
        }
    }

    async fn connect(&self) -> Result<Conn, EngineError> {
        let client = connect(&self.url)
            .await
            .map_err(EngineError::store("connecting to the target"))?;
        let prep = |sql: String| {
            let client = &client;
            async move {
                client.prepare(&sql).await.map_err(|e| EngineError::Store {
                    context: "preparing projector statements".into(),
                    source: walfold_store::StoreError::Db {
                        context: "prepare".into(),
                        source: e,
                    },
                })
            }
        };
        let read = read_sql(&self.schema);
        let claim = prep(claim_sql(&self.schema)).await?;
        let checkpoints = Checkpoints::prepare(
            &client,
            &self.schema,
            self.subscriber(),
            self.options.parallelism,
        )
        .await
        .map_err(EngineError::store("preparing checkpoints"))?;
        let dead_letters = DeadLetters::prepare(&client, &self.schema)
            .await
            .map_err(EngineError::store("preparing dead letters"))?;
        Ok(Conn {
            client,
            read,
            claim,
            checkpoints,
            dead_letters,
        })
    }

    async fn run_once(
        &self,
        cancel: &CancellationToken,
        mut head: watch::Receiver<i64>,
    ) -> Result<(), EngineError> {
        let mut conn = self.connect().await?;
        let positions = Checkpoints::load(
            &conn.client,
            &self.schema,
            self.subscriber(),
            self.options.parallelism,
        )
        .await
        .map_err(EngineError::store("loading checkpoints"))?;
        let mut position = positions[self.partition as usize];
        let mut parked: HashSet<AggregateKey> =
            DeadLetters::parked(&conn.client, &self.schema, self.subscriber())
                .await
                .map_err(EngineError::store("loading parked aggregates"))?
                .into_iter()
                .collect();
        let filter = Filter {
            partition: self.partition,
            partitions: self.options.parallelism,
            event_types: self.options.event_types.clone(),
            aggregate_types: self.options.aggregate_types.clone(),
        };
        let limit = self.options.batch_size as i64;
        tracing::info!(subscriber = %self.subscriber(), partition = self.partition, position, "projector started");
        let mut retries_checked = tokio::time::Instant::now() - RETRY_CHECK;
        let mut idle_saved = false;
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            if retries_checked.elapsed() >= RETRY_CHECK {
                self.retries(&mut conn, &mut parked).await?;
                retries_checked = tokio::time::Instant::now();
            }
            head.borrow_and_update();
            let page = read_page(&conn.client, &conn.read, position, &filter, limit)
                .await
                .map_err(EngineError::store("reading the event log"))?;
            if page.events.is_empty() {
                // The first idle read is saved too: a checkpoint row says this partition
                // has read the log once (a rebuild switches over only then).
                if page.position > position || !idle_saved {
                    self.save_position(&mut conn, page.position, PartitionStats::default(), None)
                        .await?;
                    idle_saved = true;
                }
            } else {
                match self
                    .batch(&mut conn, &page.events, page.position, &parked)
                    .await
                {
                    Ok(()) => {}
                    Err(BatchError::Transient(e)) => return Err(e),
                    Err(BatchError::Event) => {
                        // Each event commits its own checkpoint on this path; the page's
                        // end is saved only once every event in it has been handled.
                        if !self
                            .one_by_one(&mut conn, &page.events, &mut parked, cancel)
                            .await?
                        {
                            return Ok(());
                        }
                        self.save_position(
                            &mut conn,
                            page.position,
                            PartitionStats::default(),
                            None,
                        )
                        .await?;
                    }
                }
            }
            position = page.position;
            if page.caught_up {
                // The page reached the head: wait for the appender's signal (an append
                // since the read has already signalled) or poll, for appends made by
                // another process. No read that would find nothing.
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Ok(()),
                    _ = head.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }

    /// Applies the dead letters an operator asked to retry (`walfold dead-letters retry`)
    /// for this partition's aggregates, between batches: per aggregate in log order, each
    /// event through the normal claim and guard in its own transaction. The transaction
    /// of the last one releases the parked aggregate, so its later events follow in order.
    async fn retries(
        &self,
        conn: &mut Conn,
        parked: &mut HashSet<AggregateKey>,
    ) -> Result<(), EngineError> {
        let items = DeadLetters::retries(&conn.client, &self.schema, self.subscriber())
            .await
            .map_err(EngineError::store("reading retry requests"))?;
        let partitions = self.options.parallelism as i32;
        let mine: Vec<RetryItem> = items
            .into_iter()
            .filter(|i| {
                partition_hash(&i.aggregate_type, &i.aggregate_id) % partitions
                    == self.partition as i32
            })
            .collect();
        for chain in mine.chunk_by(|a, b| {
            (&a.aggregate_type, &a.aggregate_id) == (&b.aggregate_type, &b.aggregate_id)
        }) {
            let seqs: Vec<i64> = chain.iter().map(|i| i.seq).collect();
            let events = read_events(&conn.client, &self.schema, &seqs)
                .await
                .map_err(EngineError::store("reading events to retry"))?;
            let mut failure = None;
            for (k, item) in chain.iter().enumerate() {
                let Some(event) = events.iter().find(|e| e.seq == item.seq) else {
                    failure = Some((k, "the event is no longer in the event log".to_owned()));
                    break;
                };
                match self
                    .retry_one(conn, item, event, k + 1 == chain.len())
                    .await
                {
                    Ok(()) => {}
                    Err(SingleError::Transient(e)) => return Err(e),
                    Err(SingleError::Failed(message)) => {
                        failure = Some((k, message));
                        break;
                    }
                }
            }
            let (kind, id) = (&chain[0].aggregate_type, &chain[0].aggregate_id);
            match failure {
                None => {
                    tracing::info!(subscriber = %self.subscriber(), aggregate_type = %kind, aggregate_id = %id, events = chain.len(), "dead letters retried; aggregate released");
                    parked.remove(&(kind.clone(), id.clone()));
                }
                Some((k, message)) => {
                    tracing::error!(subscriber = %self.subscriber(), aggregate_type = %kind, aggregate_id = %id, dead_letter = chain[k].id, error = %message, "retry failed again; the aggregate stays parked");
                    let rest: Vec<i64> = chain[k..].iter().map(|i| i.id).collect();
                    DeadLetters::retry_failed(
                        &conn.client,
                        &self.schema,
                        chain[k].id,
                        &rest,
                        &message,
                    )
                    .await
                    .map_err(EngineError::store("recording a failed retry"))?;
                }
            }
        }
        Ok(())
    }

    /// One retried event: claim, apply, resolve its dead letter (and release the
    /// aggregate after its last one), in one transaction.
    async fn retry_one(
        &self,
        conn: &mut Conn,
        item: &RetryItem,
        event: &Event,
        last: bool,
    ) -> Result<(), SingleError> {
        let transient = |e: walfold_store::StoreError| {
            SingleError::Transient(EngineError::store("retrying a dead letter")(e))
        };
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(|e| SingleError::Transient(db_err(e)))?;
        let stats = self.claim_and_apply(&tx, &conn.claim, event).await?;
        let outcome = if stats.applied == 1 {
            "retried: applied"
        } else if stats.stale == 1 {
            "retried: stale (a newer version was already applied)"
        } else {
            "retried: already applied (duplicate)"
        };
        DeadLetters::retried(&tx, &self.schema, item.id, outcome)
            .await
            .map_err(transient)?;
        if last {
            DeadLetters::unpark(
                &tx,
                &self.schema,
                self.subscriber(),
                &event.aggregate_type,
                &event.aggregate_id,
            )
            .await
            .map_err(transient)?;
        }
        // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
        conn.checkpoints
            .save(&tx, self.partition, 0, stats, None)
            .await
            .map_err(transient)?;
        tx.commit()
            .await
            .map_err(|e| SingleError::Transient(db_err(e)))?;
        self.count(stats);
        Ok(())
    }

    /// The fast path: the whole batch in one transaction.
    async fn batch(
        &self,
        conn: &mut Conn,
        events: &[Event],
        position: i64,
        parked: &HashSet<AggregateKey>,
    ) -> Result<(), BatchError> {
        let (waiting, live): (Vec<&Event>, Vec<&Event>) = events
            .iter()
            .partition(|e| parked.contains(&(e.aggregate_type.clone(), e.aggregate_id.clone())));
        let started = std::time::Instant::now();
        let tx = conn.client.transaction().await.map_err(BatchError::db)?;
        let ids: Vec<uuid::Uuid> = live.iter().map(|e| e.id).collect();
        let claimed = claim(&tx, &conn.claim, self.subscriber(), &ids)
            .await
            .map_err(BatchError::store)?;
        let to_apply: Vec<&Event> = live
            .into_iter()
            .filter(|e| claimed.contains(&e.id))
            .collect();
        let results = match self.options_apply(&tx, &to_apply).await {
            Ok(r) => r,
            Err(e) if e.directive() == Directive::Retry => {
                return Err(BatchError::Transient(self.transient(e)));
            }
            Err(e) => {
                tracing::debug!(subscriber = %self.subscriber(), error = %e, "batch failed, isolating the event");
                return Err(BatchError::Event);
            }
        };
        for e in &waiting {
            conn.dead_letters
                .record(&tx, &waiting_letter(self.subscriber(), e))
                .await
                .map_err(BatchError::store)?;
        }
        let stats = PartitionStats {
            applied: results.iter().filter(|r| **r == Applied::Changed).count() as i64,
            stale: results.iter().filter(|r| **r == Applied::Stale).count() as i64,
            duplicates: (ids.len() - claimed.len()) as i64,
            dead_lettered: waiting.len() as i64,
        };
        conn.checkpoints
            .save(&tx, self.partition, position, stats, last_commit(events))
            .await
            .map_err(BatchError::store)?;
        tx.commit().await.map_err(BatchError::db)?;
        failpoint::hit("after_projection_commit");
        self.count(stats);
        metrics().batch(self.subscriber(), events.len(), started.elapsed());
        if stats.stale > 0 {
            tracing::debug!(subscriber = %self.subscriber(), stale = stats.stale, "stale events skipped by version guard");
        }
        Ok(())
    }

    async fn options_apply(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        events: &[&Event],
    ) -> Result<Vec<Applied>, ProjectionError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.projection.apply_batch(tx, events).await
    }

    /// The slow path after a batch failed on an event: one transaction per event, with
    /// retries; an event that still fails is dead-lettered and its aggregate parked.
    /// Returns false when cancelled before every event was handled.
    async fn one_by_one(
        &self,
        conn: &mut Conn,
        events: &[Event],
        parked: &mut HashSet<AggregateKey>,
        cancel: &CancellationToken,
    ) -> Result<bool, EngineError> {
        for event in events {
            let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
            if parked.contains(&key) {
                let tx = conn.client.transaction().await.map_err(db_err)?;
                conn.dead_letters
                    .record(&tx, &waiting_letter(self.subscriber(), event))
                    .await
                    .map_err(EngineError::store("dead-lettering a parked event"))?;
                let stats = PartitionStats {
                    dead_lettered: 1,
                    ..PartitionStats::default()
                };
                conn.checkpoints
                    .save(&tx, self.partition, event.seq, stats, event.committed_at)
                    .await
                    .map_err(EngineError::store("saving a checkpoint"))?;
                tx.commit().await.map_err(db_err)?;
                self.count(stats);
                continue;
            }
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                match self.single(conn, event).await {
                    Ok(()) => break,
                    Err(SingleError::Transient(e)) => return Err(e),
                    Err(SingleError::Failed(message)) if attempt < self.options.max_attempts => {
                        let label = Metrics::subscriber(self.subscriber());
                        metrics().failures.get_or_create(&label).inc();
                        metrics().retries.get_or_create(&label).inc();
                        let wait = Duration::from_millis(self.options.retry_backoff_ms)
                            * 2u32.saturating_pow(attempt - 1).min(64);
                        tracing::warn!(subscriber = %self.subscriber(), event_id = %event.id, attempt, error = %message, "projection failed, retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return Ok(false),
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    Err(SingleError::Failed(message)) => {
                        metrics()
                            .failures
                            .get_or_create(&Metrics::subscriber(self.subscriber()))
                            .inc();
                        tracing::error!(subscriber = %self.subscriber(), event_id = %event.id, aggregate_id = %event.aggregate_id, attempts = attempt, error = %message, "projection failed for good: event dead-lettered, aggregate parked");
                        self.dead_letter_and_park(conn, event, &message, attempt)
                            .await?;
                        parked.insert(key);
                        break;
                    }
                }
            }
        }
        Ok(true)
    }

    /// Claims one event in `tx` and applies it if the claim is new; what happened, as
    /// counters (exactly one of applied, stale, duplicates is 1).
    async fn claim_and_apply(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        statement: &Statement,
        event: &Event,
    ) -> Result<PartitionStats, SingleError> {
        let claimed = claim(tx, statement, self.subscriber(), &[event.id])
            .await
            .map_err(|e| SingleError::Transient(EngineError::store("claiming")(e)))?;
        let mut stats = PartitionStats::default();
        if !claimed.contains(&event.id) {
            stats.duplicates = 1;
            return Ok(stats);
        }
        match self.projection.apply(tx, event).await {
            Ok(Applied::Changed) => stats.applied = 1,
            Ok(Applied::Stale) => stats.stale = 1,
            Err(e) if e.directive() == Directive::Retry => {
                return Err(SingleError::Transient(self.transient(e)))
            }
            Err(e) => return Err(SingleError::Failed(e.to_string())),
        }
        Ok(stats)
    }

    async fn single(&self, conn: &mut Conn, event: &Event) -> Result<(), SingleError> {
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(|e| SingleError::Transient(db_err(e)))?;
        let stats = self.claim_and_apply(&tx, &conn.claim, event).await?;
        conn.checkpoints
            .save(&tx, self.partition, event.seq, stats, event.committed_at)
            .await
            .map_err(|e| SingleError::Transient(EngineError::store("saving a checkpoint")(e)))?;
        tx.commit()
            .await
            .map_err(|e| SingleError::Transient(db_err(e)))?;
        failpoint::hit("after_projection_commit");
        self.count(stats);
        Ok(())
    }

    async fn dead_letter_and_park(
        &self,
        conn: &mut Conn,
        event: &Event,
        error: &str,
        attempts: u32,
    ) -> Result<(), EngineError> {
        let tx = conn.client.transaction().await.map_err(db_err)?;
        let mut letter = waiting_letter(self.subscriber(), event);
        letter.reason = Reason::ProjectionFailed;
        letter.error = error.to_owned();
        letter.attempts = attempts as i32;
        let id = conn
            .dead_letters
            .record(&tx, &letter)
            .await
            .map_err(EngineError::store("dead-lettering"))?
            .ok_or_else(|| EngineError::Projection {
                projection: self.options.name.clone(),
                message: "a subscriber's dead letter was not recorded".into(),
            })?;
        conn.dead_letters
            .park(
                &tx,
                self.subscriber(),
                &event.aggregate_type,
                &event.aggregate_id,
                id,
            )
            .await
            .map_err(EngineError::store("parking"))?;
        let stats = PartitionStats {
            dead_lettered: 1,
            ..PartitionStats::default()
        };
        conn.checkpoints
            .save(&tx, self.partition, event.seq, stats, event.committed_at)
            .await
            .map_err(EngineError::store("saving a checkpoint"))?;
        tx.commit().await.map_err(db_err)?;
        self.count(stats);
        Ok(())
    }

    /// Adds a committed transaction's outcome to the process's metrics.
    fn count(&self, stats: PartitionStats) {
        let m = metrics();
        let label = Metrics::subscriber(self.subscriber());
        m.applied.get_or_create(&label).inc_by(stats.applied as u64);
        m.stale.get_or_create(&label).inc_by(stats.stale as u64);
        m.claim_duplicates
            .get_or_create(&label)
            .inc_by(stats.duplicates as u64);
        m.dead_letters
            .get_or_create(&label)
            .inc_by(stats.dead_lettered as u64);
    }

    async fn save_position(
        &self,
        conn: &mut Conn,
        position: i64,
        stats: PartitionStats,
        last: Option<SystemTime>,
    ) -> Result<(), EngineError> {
        let tx = conn.client.transaction().await.map_err(db_err)?;
        conn.checkpoints
            .save(&tx, self.partition, position, stats, last)
            .await
            .map_err(EngineError::store("saving a checkpoint"))?;
        tx.commit().await.map_err(db_err)?;
        Ok(())
    }
}

enum BatchError {
    /// Reconnect and retry the batch from the checkpoint.
    Transient(EngineError),
    /// An event failed: isolate it on the slow path.
    Event,
}

impl BatchError {
    fn db(e: tokio_postgres::Error) -> Self {
        BatchError::Transient(db_err(e))
    }
    fn store(e: walfold_store::StoreError) -> Self {
        BatchError::Transient(EngineError::store("projector")(e))
    }
}

enum SingleError {
    Transient(EngineError),
    Failed(String),
}

fn db_err(e: tokio_postgres::Error) -> EngineError {
    EngineError::Store {
        context: "projector".into(),
        source: walfold_store::StoreError::Db {
            context: "transaction".into(),
            source: e,
        },
    }
}

fn last_commit(events: &[Event]) -> Option<SystemTime> {
    events.iter().filter_map(|e| e.committed_at).max()
}

/// The dead letter for an event that waits behind a parked aggregate.
fn waiting_letter(subscriber: &str, e: &Event) -> DeadLetter {
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
            "payload": e.payload,
            "headers": e.headers,
        })),
        existing: None,
        attempts: 0,
        source_lsn: Some(e.source_lsn),
        source_ordinal: None,
    }
}
