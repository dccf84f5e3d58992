//! A projector: one partition of one subscriber, and its run loop. It tails the event
//! log from its checkpoint, a turn at a time on a connection of the target's pool;
//! every transaction it makes is one unit of work (`work.rs`) on the subscriber's
//! store (`walfold_store::SubscriberStore`), which claims, keeps versions, dead
//! letters and parks, and whose commit proves leadership and writes the checkpoint.
//! Strict order is `strict.rs`, batches and retries `retry.rs`, pauses `pause.rs`.
//! What happens on an error is decided by its [`ErrorKind`] alone:
//!
//! - transient: reconnect and go on from the checkpoint, with backoff;
//! - environment: pause this partition (nothing is dead-lettered), say so once per
//!   cause in the log, `walfold status`, `walfold_projection_paused` and `/readyz`, and
//!   retry from the checkpoint with capped backoff until it works; a batch that ran out
//!   of a resource is first tried again smaller;
//! - data: the batch is applied event by event; the event that keeps failing is
//!   dead-lettered and its aggregate parked, so its later events wait while other
//!   aggregates go on;
//! - definite: stop.

mod pause;
mod retry;
mod strict;
#[cfg(test)]
mod tests;
mod work;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use walfold_config::{ProjectionConfig, VersionMode};
use walfold_event::ErrorKind;
use walfold_store::{
    read_page, read_sql, Backoff, Fence, Filter, PgSubscriber, Prepared, Schema, StoreError,
    Subscriber, SubscriberStore,
};
use walfold_telemetry::signal::Signal;

use self::pause::Pause;
use self::retry::Paged;
use self::strict::HeldAggregates;
use self::work::{Rules, Work};
use crate::error::EngineError;
use crate::pages::SharedPages;
use crate::pool::{Lease, Pool};
use crate::projection::Projection;

/// Everything a partition worker needs.
#[derive(Clone)]
pub(crate) struct Partition {
    pub schema: Schema,
    pub options: ProjectionConfig,
    pub projection: Arc<dyn Projection>,
    pub partition: u32,
    pub fence: Fence,
    /// Pages of the log shared with the leader's other partitions.
    pub pages: Arc<SharedPages>,
    /// The extra target's name when `url` is one (`[targets.NAME]`): not reaching it
    /// pauses this partition (see [`walfold_event::unreachable_target`]).
    pub target: Option<String>,
    /// The main target, whose event log this partition reads, when `url` is an extra
    /// target; `None`: the log is read on the partition's own connection.
    pub log: Option<crate::target::Target>,
    /// Stop once this partition has read (and checkpointed) this far: a rebuild
    /// catching up with the live subscriber before its switch-over.
    pub until: Option<i64>,
    /// Told when a read reaches the head after one that did not (a rebuild's partition:
    /// the leader then looks whether it is due to switch over).
    pub reached_head: Option<Arc<tokio::sync::Notify>>,
    /// The connections of `url`'s target that every partition there shares.
    pub pool: Arc<Pool>,
    /// The main target's, for reading the log when `url` is an extra target.
    pub log_pool: Option<Arc<Pool>>,
}

/// A turn's connection (leased from the target's pool, with a connection to the main
/// target for reading the log when the partition's target is an extra one) as the
/// subscriber's store, with the partition's prepared statements on it.
struct Conn {
    store: PgSubscriber<Lease>,
    /// The page read; sent unnamed each time (see [`read_page`]).
    read: Arc<str>,
    /// Where the prepared statements are kept on the connection between turns.
    key: Arc<str>,
}

/// What every turn of a partition's run reuses: made once, not per turn.
struct Turns {
    key: Arc<str>,
    read: Arc<str>,
    /// The partition's store, bound once.
    bound: Arc<Subscriber>,
}

impl Conn {
    /// The turn ended well: the connections go back to their pools, with the statements.
    fn release(self) {
        let (mut client, log, prepared) = self.store.into_parts();
        client.prepared.insert(self.key, Box::new(prepared));
        client.release();
        if let Some(log) = log {
            log.release();
        }
    }
}

/// How often a projector looks for dead letters an operator asked to retry.
const RETRY_CHECK: Duration = Duration::from_secs(1);
/// Longest wait between attempts while paused or reconnecting.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a partition reading past events it does not take saves its position.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// Batches that must succeed before a batch size shrunk by a resource error grows again.
const GROW_AFTER: u32 = 10;

impl Partition {
    fn subscriber(&self) -> &str {
        &self.options.subscriber
    }

    /// What the rules of this partition go by.
    fn rules(&self) -> Rules<'_, dyn Projection> {
        Rules {
            options: &self.options,
            partition: self.partition,
            projection: &*self.projection,
        }
    }

    /// Runs until cancelled; reconnects on transient errors and pauses on environment
    /// errors, both with backoff, from the last checkpoint.
    pub(crate) async fn run(
        self,
        cancel: CancellationToken,
        head: watch::Receiver<i64>,
    ) -> Result<(), EngineError> {
        let mut backoff = Backoff::new(Duration::from_millis(100), MAX_BACKOFF);
        let mut pause = Pause::default();
        let turns = self.turns();
        Signal::PartitionStarted {
            subscriber: self.subscriber(),
        }
        .report();
        let result = loop {
            let started = tokio::time::Instant::now();
            let e = match self
                .run_once(&cancel, head.clone(), &turns, &mut pause)
                .await
            {
                Ok(()) => break Ok(()),
                Err(_) if cancel.is_cancelled() => break Ok(()),
                Err(e) => e,
            };
            if started.elapsed() > MAX_BACKOFF {
                backoff.reset();
            }
            match e.kind() {
                ErrorKind::Transient => {
                    tracing::warn!(subscriber = %self.subscriber(), partition = self.partition, error = %e, "projector failed, reconnecting");
                }
                ErrorKind::Environment => pause.enter(&self, &turns.bound, &e).await,
                ErrorKind::Data | ErrorKind::Definite => break Err(e),
            }
            if !backoff.sleep(&cancel).await {
                break Ok(());
            }
        };
        pause.drop_gauge(&self);
        result
    }

    /// How a connection failure reads: an extra target's unreachability pauses.
    fn unreachable(&self, source: StoreError) -> EngineError {
        match &self.target {
            Some(target) => EngineError::Unreachable {
                target: target.clone(),
                source,
            },
            None => EngineError::Store(source),
        }
    }

    /// Installs (or checks) the projection, on a connection of the pool. Done at every
    /// start of the partition: a pause caused by a missing table or right ends here once
    /// it is fixed.
    async fn install(&self) -> Result<(), EngineError> {
        let mut client = self.pool.lease().await.map_err(|e| self.unreachable(e))?;
        self.projection
            .install(&mut client)
            .await
            .map_err(|source| EngineError::Apply {
                projection: self.options.name.clone(),
                source,
            })?;
        client.release();
        Ok(())
    }

    /// What [`Partition::lease`] needs for each turn of a run.
    fn turns(&self) -> Turns {
        let log_schema = self.log.as_ref().map(|main| main.schema.clone());
        Turns {
            key: format!(
                "{}|{}|{}",
                self.schema.name(),
                self.subscriber(),
                self.options.parallelism
            )
            .into(),
            read: read_sql(log_schema.as_ref().unwrap_or(&self.schema)).into(),
            bound: Arc::new(Subscriber::new(
                self.schema.clone(),
                log_schema,
                self.subscriber(),
                self.partition,
                self.options.parallelism,
                self.fence.clone(),
            )),
        }
    }

    /// A connection for one turn, with this partition's statements prepared on it.
    async fn lease(&self, turns: &Turns) -> Result<Conn, EngineError> {
        let mut client = self.pool.lease().await.map_err(|e| self.unreachable(e))?;
        let kept = client
            .prepared
            .remove(&*turns.key)
            .and_then(|s| s.downcast::<Prepared>().ok())
            .filter(|s| s.is_for(&self.fence));
        let prepared = match kept {
            Some(prepared) => *prepared,
            None => turns.bound.prepare(&client).await?,
        };
        let log = match &self.log_pool {
            Some(pool) => Some(pool.lease().await?),
            None => None,
        };
        Ok(Conn {
            store: turns.bound.on(client, log, prepared),
            read: turns.read.clone(),
            key: turns.key.clone(),
        })
    }

    async fn run_once(
        &self,
        cancel: &CancellationToken,
        mut head: watch::Receiver<i64>,
        turns: &Turns,
        pause: &mut Pause,
    ) -> Result<(), EngineError> {
        self.install().await?;
        let rules = self.rules();
        let conn = self.lease(turns).await?;
        let mut position = conn.store.position().await?;
        let mut held = HeldAggregates::default();
        for (aggregate, gap) in conn.store.parked().await? {
            // A gap of a projection no longer strict holds like a failure (retry it).
            if gap && self.options.version_mode == VersionMode::Strict {
                held.gaps.insert(aggregate);
            } else {
                held.failed.insert(aggregate);
            }
        }
        let filter = Filter {
            partition: self.partition,
            partitions: self.options.parallelism,
            // A strict projection sees every event type: each carries a version of its
            // aggregate (those it does not take only advance it).
            event_types: match self.options.version_mode {
                VersionMode::Guard => self.options.event_types.clone(),
                VersionMode::Strict => None,
            },
            aggregate_types: self.options.aggregate_types.clone(),
            sources: self.options.sources.clone(),
        };
        // What `wait_for` needs to know of this subscriber: which events it folds.
        walfold_store::wait::record_scope(
            &**conn.store.client(),
            &self.schema,
            self.subscriber(),
            &filter,
        )
        .await?;
        let full = self.options.batch_size as i64;
        let mut limit = full;
        let mut good_batches = 0u32;
        if pause.paused {
            // A paused partition starts again on every try; its pause was logged.
            tracing::debug!(subscriber = %self.subscriber(), partition = self.partition, position, "projector started");
        } else {
            tracing::info!(subscriber = %self.subscriber(), partition = self.partition, position, "projector started");
        }
        conn.release();
        let mut retries_checked = tokio::time::Instant::now() - RETRY_CHECK;
        let mut idle_saved = false;
        // When the position was last saved (a batch's commit, or a window's).
        let mut saved_at = tokio::time::Instant::now();
        // Whether the last read reached the head: only then can a gap be judged too old
        // (after downtime, the missing version may be in the backlog).
        let mut at_head = false;
        let unit = walfold_telemetry::stall::Unit::Partition {
            subscriber: self.subscriber().to_owned(),
            partition: self.partition,
        };
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            // A turn is work held: one that does not commit within the threshold (a
            // lock, a pool that never frees a connection, a read that never answers)
            // stalls the partition (`/readyz`, `walfold_projection_stalled`).
            let turn = walfold_telemetry::stall::hold(
                unit.clone(),
                "waiting for a connection of the target's pool",
            );
            // One turn on a connection of the pool: others take theirs in between.
            let mut conn = self.lease(turns).await?;
            turn.doing(format!("reading the event log after seq {position}"));
            if self.until.is_some_and(|until| position >= until) {
                // Saved: a window short of the head moved the position in memory only.
                Work::begin(&mut conn.store, &rules)
                    .await?
                    .commit(position, None)
                    .await?;
                return Ok(());
            }
            if retries_checked.elapsed() >= RETRY_CHECK {
                let store = &mut conn.store;
                retry::retries(&rules, store, &mut held, cancel).await?;
                retry::release_discarded(&rules, store, &mut held).await?;
                strict::gap_checks(&rules, store, &mut held, at_head).await?;
                retries_checked = tokio::time::Instant::now();
            }
            head.borrow_and_update();
            let (page, shared) = self
                .pages
                .page(position, &filter, limit, || {
                    read_page(
                        conn.store.log().unwrap_or(conn.store.client()),
                        &conn.read,
                        position,
                        &filter,
                        limit,
                        self.pages.page_bytes(),
                    )
                })
                .await?;
            let pool = self.log_pool.as_ref().unwrap_or(&self.pool);
            self.pages
                .read_ahead(&page, &filter, limit, pool, &conn.read);
            Signal::PageRead { shared }.report();
            if page.bytes > self.pages.page_bytes() as usize {
                // An event larger than a page: this turn's buffers grow to it.
                conn.store.client_mut().retire();
                if let Some(log) = conn.store.log_mut() {
                    log.retire();
                }
            }
            if page.events.is_empty() {
                // The first idle read is saved too: a checkpoint row says this partition
                // has read the log once (a rebuild switches over only then). A window
                // with nothing for it, short of the head, moves the position in memory
                // only: the next batch or the head saves it.
                // Through a long stretch of events it does not take (a filtered
                // projection), it is saved every SAVE_EVERY too, so that its progress
                // (`walfold status`, `rebuild --wait`) moves as it reads.
                let stretch = page.position > position && saved_at.elapsed() >= SAVE_EVERY;
                if page.caught_up && (page.position > position || !idle_saved) {
                    Work::begin(&mut conn.store, &rules)
                        .await?
                        .commit(page.position, None)
                        .await?;
                    idle_saved = true;
                    saved_at = tokio::time::Instant::now();
                } else if stretch {
                    Work::begin(&mut conn.store, &rules)
                        .await?
                        .commit(page.position, None)
                        .await?;
                    saved_at = tokio::time::Instant::now();
                }
            } else {
                turn.doing(format!(
                    "applying {} event{} (seq {} to {}) and its checkpoint",
                    page.events.len(),
                    if page.events.len() == 1 { "" } else { "s" },
                    page.events.first().map_or(0, |e| e.seq),
                    page.events.last().map_or(0, |e| e.seq),
                ));
                let store = &mut conn.store;
                let events = &page.events;
                let shrinkable = limit > 1;
                match retry::page(
                    &rules,
                    store,
                    events,
                    page.position,
                    &mut held,
                    cancel,
                    shrinkable,
                )
                .await?
                {
                    Paged::Batch => {
                        good_batches += 1;
                        if limit < full && good_batches >= GROW_AFTER {
                            limit = (limit * 2).min(full);
                            good_batches = 0;
                        }
                    }
                    Paged::OneByOne => {}
                    Paged::Cancelled => return Ok(()),
                    Paged::Shrink(e) => {
                        limit = (limit / 2).max(1);
                        good_batches = 0;
                        tracing::warn!(subscriber = %self.subscriber(), partition = self.partition, batch = limit, error = %e, "the server ran short of a resource; trying a smaller batch");
                        continue;
                    }
                }
            }
            if !page.events.is_empty() {
                saved_at = tokio::time::Instant::now();
            }
            pause.leave(self, &turns.bound, conn.store.client()).await;
            conn.release();
            drop(turn);
            position = page.position;
            if page.caught_up && !at_head {
                if let Some(reached) = &self.reached_head {
                    reached.notify_one();
                }
            }
            at_head = page.caught_up;
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
}
