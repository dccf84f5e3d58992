//! A projector: one partition of one subscriber. It tails the event log from its
//! checkpoint; every transaction it makes is one [`Work`], the single unit through
//! which it writes: the fence (this instance still leads), the claim (which decides
//! what is a duplicate), the apply, dead letters, the checkpoint, the commit and the
//! counters. What happens on an error is decided by its [`ErrorKind`] alone:
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

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_postgres::{Client, Statement, Transaction};
use tokio_util::sync::CancellationToken;
use walfold_config::{ProjectionConfig, VersionMode};
use walfold_event::{partition_hash, DeadLetter, DeadLetterStatus, ErrorKind, Event, Reason};
use walfold_store::{
    claim, claim_sql, read_events, read_page, read_sql, Backoff, Checkpoints, DeadLetters, Fence,
    Filter, PartitionStats, RetryItem, Schema, StoreError,
};
use walfold_telemetry::failpoint;
use walfold_telemetry::signal::Signal;

use crate::error::EngineError;
use crate::pages::SharedPages;
use crate::pool::{Lease, Pool};
use crate::projection::{Applied, Projection};
use crate::sequence::sequence;

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
    /// The connections of `url`'s target that every partition there shares.
    pub pool: Arc<Pool>,
    /// The main target's, for reading the log when `url` is an extra target.
    pub log_pool: Option<Arc<Pool>>,
}

/// A turn's connection (leased from the target's pool) and the partition's prepared
/// statements on it.
struct Conn {
    client: Lease,
    /// A connection to the main target for reading the log, when `client` is an extra
    /// target's.
    log: Option<Lease>,
    /// The page read; sent unnamed each time (see [`read_page`]).
    read: Arc<str>,
    statements: Statements,
    /// Where `statements` are kept on the connection between turns.
    key: Arc<str>,
}

/// What every turn of a partition's run reuses: made once, not per turn.
struct Turns {
    key: Arc<str>,
    read: Arc<str>,
}

impl Conn {
    /// The turn ended well: the connections go back to their pools, with the statements.
    fn release(self) {
        let Conn {
            mut client,
            log,
            statements,
            key,
            ..
        } = self;
        client.prepared.insert(key, Box::new(statements));
        client.release();
        if let Some(log) = log {
            log.release();
        }
    }
}

struct Statements {
    fence: walfold_store::PreparedFence,
    claim: Statement,
    checkpoints: Checkpoints,
    dead_letters: DeadLetters,
}

type AggregateKey = (String, String);

/// The aggregates whose events this partition does not apply as they come.
#[derive(Debug, Default)]
struct Held {
    /// Behind a dead letter (a failure): their events are set aside until a retry.
    failed: HashSet<AggregateKey>,
    /// Waiting for a missing version (strict projections): their events are sequenced
    /// together with the waiting ones.
    gaps: HashSet<AggregateKey>,
}

impl Held {
    /// Applies what a committed transaction changed.
    fn update(&mut self, strict: StrictOutcome) {
        for k in strict.released {
            self.gaps.remove(&k);
        }
        self.gaps.extend(strict.gapped);
    }
}

/// What a strict transaction changed about the aggregates it held.
#[derive(Debug, Default)]
#[must_use]
struct StrictOutcome {
    /// Now waiting for a missing version.
    gapped: Vec<AggregateKey>,
    /// No longer waiting.
    released: Vec<AggregateKey>,
    /// Events of the candidates that wait.
    waiting: usize,
}

/// How often a projector looks for dead letters an operator asked to retry.
const RETRY_CHECK: Duration = Duration::from_secs(1);
/// Dead letters of a chain retried per read.
const RETRY_PAGE: i64 = 200;
/// Longest wait between attempts while paused or reconnecting.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long recording a pause waits for a connection of the pool (best effort).
const PAUSE_RECORD_WAIT: Duration = Duration::from_secs(2);
/// Batches that must succeed before a batch size shrunk by a resource error grows again.
const GROW_AFTER: u32 = 10;

fn db(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> EngineError {
    move |e| {
        EngineError::store(context)(StoreError::Db {
            context: context.into(),
            source: e,
        })
    }
}

fn key(e: &Event) -> AggregateKey {
    (e.aggregate_type.clone(), e.aggregate_id.clone())
}

/// One projector transaction. Every write of a projector goes through it, so each rule
/// lives in one place: [`Work::commit`] proves leadership and saves the checkpoint with
/// the counters, [`Work::claim`] decides what is a duplicate.
struct Work<'c> {
    tx: Transaction<'c>,
    /// Where the log is read when it is not in `tx`'s database.
    log: Option<&'c Client>,
    statements: &'c Statements,
    part: &'c Partition,
    stats: PartitionStats,
    started: std::time::Instant,
    events: usize,
    /// Retrying a dead letter: what its event does resolves that letter, never a new one.
    retrying: bool,
}

impl<'c> Work<'c> {
    async fn begin(conn: &'c mut Conn, part: &'c Partition) -> Result<Work<'c>, EngineError> {
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(db("starting a projector transaction"))?;
        Ok(Work {
            tx,
            log: conn.log.as_deref(),
            statements: &conn.statements,
            part,
            stats: PartitionStats::default(),
            started: std::time::Instant::now(),
            events: 0,
            retrying: false,
        })
    }

    /// Events of the log by seq: in this transaction, or from the main target's log
    /// when the partition's target is an extra one (log rows never change).
    async fn read_events(&self, seqs: &[i64]) -> Result<Vec<Event>, EngineError> {
        let read = match (self.log, &self.part.log) {
            (Some(log), Some(main)) => read_events(log, &main.schema, seqs).await,
            _ => read_events(&self.tx, &self.part.schema, seqs).await,
        };
        read.map_err(EngineError::store("reading waiting events"))
    }

    /// Claims `events` for the subscriber: the ones returned are new and must be
    /// applied in this transaction; the rest were processed before (duplicates).
    async fn claim<'e>(&mut self, events: &[&'e Event]) -> Result<Vec<&'e Event>, EngineError> {
        self.events += events.len();
        let ids: Vec<(uuid::Uuid, i64)> = events.iter().map(|e| (e.id, e.claim_seq)).collect();
        let claimed = claim(
            &self.tx,
            &self.statements.claim,
            self.part.subscriber(),
            &ids,
        )
        .await
        .map_err(EngineError::store("claiming"))?;
        self.stats.duplicates += (ids.len() - claimed.len()) as i64;
        Ok(events
            .iter()
            .copied()
            .filter(|e| claimed.contains(&e.id))
            .collect())
    }

    /// Applies claimed events in order.
    async fn apply(&mut self, events: &[&Event]) -> Result<Vec<Applied>, EngineError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let results = self
            .part
            .projection
            .apply_batch(&self.tx, events)
            .await
            .map_err(|source| EngineError::Apply {
                projection: self.part.options.name.clone(),
                source,
            })?;
        for r in &results {
            match r {
                Applied::Changed => self.stats.applied += 1,
                Applied::Stale => self.stats.stale += 1,
            }
        }
        Ok(results)
    }

    /// Claims and applies `events` by the projection's version mode: in log order behind
    /// the projection's own guard, or strictly in version order (see [`sequence`]).
    async fn process(
        &mut self,
        events: &[&Event],
        held: &Held,
    ) -> Result<StrictOutcome, EngineError> {
        match self.part.options.version_mode {
            VersionMode::Guard => {
                let claimed = self.claim(events).await?;
                self.apply(&claimed).await?;
                Ok(StrictOutcome::default())
            }
            VersionMode::Strict if events.iter().any(|e| e.version.is_none()) => {
                Err(self.part.invalid_event(
                    "event has no version; a strict projection applies versions in order",
                ))
            }
            VersionMode::Strict => self.apply_strict(events, held, &[], &[]).await,
        }
    }

    /// Strict mode: `events`, with the waiting events of their aggregates (and of
    /// `also`), are claimed, and what is next in version order is applied; what still
    /// waits for a missing version gives its claim back and is set aside as waiting (its
    /// aggregate parked behind the gap), to be claimed again in the transaction that
    /// applies it. An aggregate in `accept` gives up on its missing versions: its waiting
    /// events apply from the first of them on.
    async fn apply_strict(
        &mut self,
        events: &[&Event],
        held: &Held,
        also: &[AggregateKey],
        accept: &[AggregateKey],
    ) -> Result<StrictOutcome, EngineError> {
        let part = self.part;
        let (schema, subscriber) = (&part.schema, part.subscriber());
        let mut aggregates: Vec<AggregateKey> = also.to_vec();
        for e in events {
            let k = key(e);
            if !aggregates.contains(&k) {
                aggregates.push(k);
            }
        }
        let gapped: Vec<AggregateKey> = aggregates
            .iter()
            .filter(|k| held.gaps.contains(*k))
            .cloned()
            .collect();
        let letters = DeadLetters::waiting(&self.tx, schema, subscriber, &gapped)
            .await
            .map_err(EngineError::store("reading waiting events"))?;
        let seqs: Vec<i64> = letters.iter().map(|l| l.seq).collect();
        let held_events = self.read_events(&seqs).await?;
        let letter_of = |e: &Event| letters.iter().find(|l| l.seq == e.seq).map(|l| l.id);
        let mut candidates: Vec<&Event> = held_events.iter().collect();
        candidates.extend(events.iter().copied());
        let claimed = self.claim(&candidates).await?;
        let mut applied =
            walfold_store::applied_versions(&self.tx, schema, subscriber, &aggregates)
                .await
                .map_err(EngineError::store("reading applied versions"))?;
        for k in accept {
            let first = held_events
                .iter()
                .filter(|e| key(e) == *k)
                .filter_map(|e| e.version)
                .min();
            if let Some(first) = first {
                applied.insert(k.clone(), first - 1);
            }
        }
        let order = sequence(&claimed, &applied, part.options.first_version);
        if let Some(e) = order.below_first.first() {
            return Err(part.invalid_event(&format!(
                "version {} is below first_version = {} of an aggregate walfold has applied \
                 nothing of yet: set first_version to the producer's first version, or fix the \
                 producer",
                e.version.unwrap_or_default(),
                part.options.first_version
            )));
        }
        // Events of types this projection does not take still carry the aggregate's
        // versions: they advance it without being applied.
        let (apply, passed): (Vec<&Event>, Vec<&Event>) = order.apply.iter().partition(|e| {
            part.options
                .event_types
                .as_ref()
                .is_none_or(|t| t.contains(&e.event_type))
        });
        self.stats.duplicates += passed.len() as i64;
        let results = self.apply(&apply).await?;
        if let Some(i) = results.iter().position(|r| *r == Applied::Stale) {
            return Err(part.invalid_event(&format!(
                "the statement changed no row for version {} of {} {}: in strict mode every \
                 version must apply, or it would be consumed without effect",
                apply[i].version.unwrap_or_default(),
                apply[i].aggregate_type,
                apply[i].aggregate_id
            )));
        }
        // A version the aggregate has passed, under an event ID never claimed: a producer
        // retry with a fresh ID, a second delta claiming the same version, or the missing
        // version of a discarded gap arriving late. Which one, only a person can tell, and
        // a delta skipped unseen is money lost: not applied, and an open dead letter.
        for e in &order.duplicates {
            let held = letter_of(e).is_some();
            if held || self.retrying {
                self.stats.stale += 1;
                continue;
            }
            let version = e.version.unwrap_or_default();
            let through = applied.get(&key(e)).copied().unwrap_or_default();
            tracing::error!(subscriber, event_id = %e.id, aggregate_type = %e.aggregate_type, aggregate_id = %e.aggregate_id, version, applied_through = through, "a version the aggregate has passed came under a new event ID: not applied, dead-lettered");
            let mut letter = waiting_letter(subscriber, e);
            letter.reason = Reason::VersionConflict;
            letter.attempts = 1;
            letter.error = format!(
                "version {version} of {} {} came under a new event ID after the aggregate had \
                 applied through version {through}: not applied. If it repeats an applied \
                 delta (a producer retry with a fresh ID), discard this letter; if it is \
                 another delta, or the missing version of a discarded gap arriving late, \
                 apply its effect by hand, then discard this letter",
                e.aggregate_type, e.aggregate_id
            );
            self.dead_letter(&letter, false).await?;
        }
        let waiting: Vec<i64> = order.waiting.iter().map(|e| e.claim_seq).collect();
        walfold_store::unclaim(&self.tx, schema, subscriber, &waiting)
            .await
            .map_err(EngineError::store("releasing claims"))?;
        let done: Vec<i64> = order
            .apply
            .iter()
            .chain(&order.duplicates)
            .filter_map(|e| letter_of(e))
            .collect();
        let dl = &self.statements.dead_letters;
        walfold_store::record_versions(&self.tx, schema, subscriber, &order.advanced)
            .await
            .map_err(EngineError::store("recording applied versions"))?;
        let mut outcome = StrictOutcome {
            waiting: order.waiting.len(),
            ..StrictOutcome::default()
        };
        for (k, next) in &order.needs {
            let mut first_letter = None;
            for e in order.waiting.iter().filter(|e| key(e) == *k) {
                let id = match letter_of(e) {
                    Some(id) => Some(id),
                    None => {
                        let mut letter = waiting_letter(subscriber, e);
                        letter.reason = Reason::VersionGap;
                        letter.error = format!("waiting for version {next} of this aggregate");
                        self.events += 1;
                        dl.record(&self.tx, &letter)
                            .await
                            .map_err(EngineError::store("setting aside a waiting event"))?
                    }
                };
                first_letter = first_letter.or(id);
            }
            let Some(id) = first_letter else { continue };
            if held.gaps.contains(k) {
                // The park may point at a waiting event that has just applied.
                DeadLetters::repark_waiting(&self.tx, schema, subscriber, k, id)
                    .await
                    .map_err(EngineError::store("parking"))?;
            } else {
                dl.park(&self.tx, subscriber, &k.0, &k.1, id)
                    .await
                    .map_err(EngineError::store("parking"))?;
                outcome.gapped.push(k.clone());
            }
        }
        for k in gapped {
            if order.needs.iter().any(|(n, _)| *n == k) {
                continue;
            }
            let resolution = if accept.contains(&k) {
                "its waiting versions applied without the missing ones"
            } else {
                "the missing versions arrived"
            };
            DeadLetters::resolve_gap(&self.tx, schema, subscriber, &k, resolution)
                .await
                .map_err(EngineError::store("resolving a version gap"))?;
            DeadLetters::unpark(&self.tx, schema, subscriber, &k.0, &k.1)
                .await
                .map_err(EngineError::store("releasing a parked aggregate"))?;
            outcome.released.push(k);
        }
        // The waiting events that went through leave no dead letter behind: waiting is
        // ordinary in strict mode, and the open gap letter (if any) is the record.
        DeadLetters::forget_waiting(&self.tx, schema, &done)
            .await
            .map_err(EngineError::store("clearing waiting events"))?;
        Ok(outcome)
    }

    /// What an open gap of `k` is missing, for its dead letter.
    async fn describe_gap(
        &self,
        k: &AggregateKey,
        timeout: Option<Duration>,
    ) -> Result<String, EngineError> {
        let part = self.part;
        let (schema, subscriber) = (&part.schema, part.subscriber());
        let aggregate = std::slice::from_ref(k);
        let applied = walfold_store::applied_versions(&self.tx, schema, subscriber, aggregate)
            .await
            .map_err(EngineError::store("reading applied versions"))?;
        let next = applied
            .get(k)
            .map_or(part.options.first_version, |v| v.saturating_add(1));
        let letters = DeadLetters::waiting(&self.tx, schema, subscriber, aggregate)
            .await
            .map_err(EngineError::store("reading waiting events"))?;
        let seqs: Vec<i64> = letters.iter().map(|l| l.seq).collect();
        let events = self.read_events(&seqs).await?;
        let first = events
            .iter()
            .filter_map(|e| e.version)
            .min()
            .unwrap_or(next);
        let open = timeout.map_or_else(String::new, |t| format!(" for over {}s", t.as_secs()));
        let missing = if first - 1 == next {
            format!("version {next} of {} {} is", k.0, k.1)
        } else {
            format!("versions {next}..{} of {} {} are", first - 1, k.0, k.1)
        };
        Ok(format!(
            "{missing} missing{open}: {} events wait from version {first}; they apply once \
             the missing versions arrive (discard this dead letter to apply them without)",
            events.len()
        ))
    }

    /// Records a dead letter of this subscriber; parks its aggregate when `park`.
    async fn dead_letter(&mut self, letter: &DeadLetter, park: bool) -> Result<(), EngineError> {
        self.events += 1;
        let dl = &self.statements.dead_letters;
        let id = dl
            .record(&self.tx, letter)
            .await
            .map_err(EngineError::store("dead-lettering"))?;
        self.stats.dead_lettered += 1;
        if park {
            let (Some(id), Some(kind), Some(aggregate)) =
                (id, &letter.aggregate_type, &letter.aggregate_id)
            else {
                return Err(self
                    .part
                    .invalid("a subscriber's dead letter was not recorded"));
            };
            dl.park(&self.tx, self.part.subscriber(), kind, aggregate, id)
                .await
                .map_err(EngineError::store("parking"))?;
        }
        Ok(())
    }

    /// A retried dead letter went through (`strict`: what its strict pass did).
    async fn retried(
        &mut self,
        item: &RetryItem,
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
        DeadLetters::retried(&self.tx, &self.part.schema, item.id, outcome)
            .await
            .map_err(EngineError::store("resolving a retried dead letter"))?;
        Ok(())
    }

    /// Releases an aggregate parked behind a failure (the last event of its retried
    /// chain; a strict pass after it may park it again behind a gap).
    async fn release(&mut self, aggregate: &AggregateKey) -> Result<(), EngineError> {
        DeadLetters::unpark(
            &self.tx,
            &self.part.schema,
            self.part.subscriber(),
            &aggregate.0,
            &aggregate.1,
        )
        .await
        .map_err(EngineError::store("releasing a parked aggregate"))
    }

    /// Proves this instance still leads, saves the checkpoint (`position` 0 keeps it:
    /// positions only grow) with the counters, commits, and counts what it did.
    async fn commit(
        self,
        position: i64,
        last_committed_at: Option<SystemTime>,
    ) -> Result<PartitionStats, EngineError> {
        let part = self.part;
        // Tests: a transaction still open while another instance takes over.
        failpoint::delay("projector_commit").await;
        // Sent together: one round trip. On a failed check nothing is committed.
        futures::try_join!(
            async {
                self.statements
                    .fence
                    .check(&self.tx)
                    .await
                    .map_err(EngineError::store("proving leadership"))
            },
            async {
                self.statements
                    .checkpoints
                    .save(
                        &self.tx,
                        part.partition,
                        position,
                        self.stats,
                        last_committed_at,
                    )
                    .await
                    .map_err(EngineError::store("saving a checkpoint"))
            },
        )?;
        self.tx
            .commit()
            .await
            .map_err(db("committing a projector transaction"))?;
        let s = self.stats;
        if s.applied + s.stale + s.duplicates > 0 {
            // Crash window: applied and checkpointed, not yet counted in this process.
            failpoint::hit("after_projection_commit");
        }
        Signal::Committed {
            subscriber: part.subscriber(),
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

/// A partition's pause: entered on an environment error, left after the next commit.
struct Pause {
    /// The cause last logged (logged again only when it changes).
    cause: Option<String>,
    paused: bool,
}

impl Pause {
    async fn enter(&mut self, part: &Partition, e: &EngineError) {
        let cause = e.to_string();
        if self.cause.as_deref() != Some(cause.as_str()) {
            Signal::PartitionPauseCause {
                subscriber: part.subscriber(),
                projection: &part.options.name,
                partition: part.partition,
                sqlstate: e.sqlstate().unwrap_or(""),
                error: e,
            }
            .report();
            self.cause = Some(cause.clone());
            // Best effort: the cause may keep this write from landing too.
            let recorded = async {
                let mut client = tokio::time::timeout(PAUSE_RECORD_WAIT, part.pool.lease())
                    .await
                    .map_err(|_| {
                        StoreError::Busy("no connection of the pool came free".into())
                    })??;
                walfold_store::record_pause(
                    &mut client,
                    &part.fence,
                    &part.schema,
                    part.subscriber(),
                    part.partition,
                    e.sqlstate(),
                    &cause,
                )
                .await?;
                client.release();
                Ok::<(), StoreError>(())
            };
            if let Err(write) = recorded.await {
                tracing::debug!(error = %write, "could not record the pause");
            }
        }
        if !self.paused {
            self.paused = true;
            Signal::PartitionPaused {
                subscriber: part.subscriber(),
            }
            .report();
        }
    }

    /// After a commit: a paused partition works again.
    async fn leave(&mut self, part: &Partition, client: &Client) {
        if !self.paused {
            return;
        }
        self.paused = false;
        self.cause = None;
        Signal::PartitionResumed {
            subscriber: part.subscriber(),
            partition: part.partition,
        }
        .report();
        if let Err(e) =
            walfold_store::clear_pause(client, &part.schema, part.subscriber(), part.partition)
                .await
        {
            tracing::debug!(error = %e, "could not clear the pause");
        }
    }

    /// On shutdown: the gauge must not stay up for a partition that no longer runs.
    fn drop_gauge(&mut self, part: &Partition) {
        if self.paused {
            self.paused = false;
            Signal::PausedPartitionStopped {
                subscriber: part.subscriber(),
            }
            .report();
        }
    }
}

impl Partition {
    fn subscriber(&self) -> &str {
        &self.options.subscriber
    }

    /// An event this projection can never apply as it is (retrying cannot help).
    fn invalid_event(&self, message: &str) -> EngineError {
        EngineError::Apply {
            projection: self.options.name.clone(),
            source: crate::error::ProjectionError::Invalid(message.into()),
        }
    }

    fn invalid(&self, message: &str) -> EngineError {
        EngineError::Projection {
            projection: self.options.name.clone(),
            message: message.into(),
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
        let mut pause = Pause {
            cause: None,
            paused: false,
        };
        Signal::PartitionStarted {
            subscriber: self.subscriber(),
        }
        .report();
        let result = loop {
            let started = tokio::time::Instant::now();
            let e = match self.run_once(&cancel, head.clone(), &mut pause).await {
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
                ErrorKind::Environment => pause.enter(&self, &e).await,
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
            None => EngineError::store("connecting to the target")(source),
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
        Turns {
            key: format!(
                "{}|{}|{}",
                self.schema.name(),
                self.subscriber(),
                self.options.parallelism
            )
            .into(),
            read: read_sql(self.log.as_ref().map_or(&self.schema, |main| &main.schema)).into(),
        }
    }

    /// A connection for one turn, with this partition's statements prepared on it.
    async fn lease(&self, turns: &Turns) -> Result<Conn, EngineError> {
        let mut client = self.pool.lease().await.map_err(|e| self.unreachable(e))?;
        let kept = client
            .prepared
            .remove(&*turns.key)
            .and_then(|s| s.downcast::<Statements>().ok())
            .filter(|s| s.fence.is_for(&self.fence));
        let statements = match kept {
            Some(statements) => *statements,
            None => self.prepare(&client).await?,
        };
        let log = match &self.log_pool {
            Some(pool) => Some(
                pool.lease()
                    .await
                    .map_err(EngineError::store("connecting to the event log's target"))?,
            ),
            None => None,
        };
        Ok(Conn {
            client,
            log,
            read: turns.read.clone(),
            statements,
            key: turns.key.clone(),
        })
    }

    async fn prepare(&self, client: &Client) -> Result<Statements, EngineError> {
        let fence = self
            .fence
            .prepare(client)
            .await
            .map_err(EngineError::store("preparing the leadership check"))?;
        let claim = client
            .prepare(&claim_sql(&self.schema))
            .await
            .map_err(db("preparing the claim"))?;
        let checkpoints = Checkpoints::prepare(
            client,
            &self.schema,
            self.subscriber(),
            self.options.parallelism,
        )
        .await
        .map_err(EngineError::store("preparing checkpoints"))?;
        let dead_letters = DeadLetters::prepare(client, &self.schema)
            .await
            .map_err(EngineError::store("preparing dead letters"))?;
        Ok(Statements {
            fence,
            claim,
            checkpoints,
            dead_letters,
        })
    }

    async fn run_once(
        &self,
        cancel: &CancellationToken,
        mut head: watch::Receiver<i64>,
        pause: &mut Pause,
    ) -> Result<(), EngineError> {
        self.install().await?;
        let turns = self.turns();
        let conn = self.lease(&turns).await?;
        let mut position = Checkpoints::position(
            &conn.client,
            &self.schema,
            self.subscriber(),
            self.partition,
        )
        .await
        .map_err(EngineError::store("loading the checkpoint"))?;
        let mut held = Held::default();
        for (t, i, gap) in DeadLetters::parked(&conn.client, &self.schema, self.subscriber())
            .await
            .map_err(EngineError::store("loading parked aggregates"))?
        {
            // A gap of a projection no longer strict holds like a failure (retry it).
            if gap && self.options.version_mode == VersionMode::Strict {
                held.gaps.insert((t, i));
            } else {
                held.failed.insert((t, i));
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
        // Whether the last read reached the head: only then can a gap be judged too old
        // (after downtime, the missing version may be in the backlog).
        let mut at_head = false;
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            // One turn on a connection of the pool: others take theirs in between.
            let mut conn = self.lease(&turns).await?;
            if self.until.is_some_and(|until| position >= until) {
                // Saved: a window short of the head moved the position in memory only.
                Work::begin(&mut conn, self)
                    .await?
                    .commit(position, None)
                    .await?;
                return Ok(());
            }
            if retries_checked.elapsed() >= RETRY_CHECK {
                self.retries(&mut conn, &mut held, cancel).await?;
                self.release_discarded(&mut conn, &mut held).await?;
                self.gap_checks(&mut conn, &mut held, at_head).await?;
                retries_checked = tokio::time::Instant::now();
            }
            head.borrow_and_update();
            let (page, shared) = self
                .pages
                .page(position, &filter, limit, || {
                    read_page(
                        conn.log.as_deref().unwrap_or(&conn.client),
                        &conn.read,
                        position,
                        &filter,
                        limit,
                        self.pages.page_bytes(),
                    )
                })
                .await
                .map_err(EngineError::store("reading the event log"))?;
            let pool = self.log_pool.as_ref().unwrap_or(&self.pool);
            self.pages
                .read_ahead(&page, &filter, limit, pool, &conn.read);
            Signal::PageRead { shared }.report();
            if page.bytes > self.pages.page_bytes() as usize {
                // An event larger than a page: this turn's buffers grow to it.
                conn.client.retire();
                if let Some(log) = conn.log.as_mut() {
                    log.retire();
                }
            }
            if page.events.is_empty() {
                // The first idle read is saved too: a checkpoint row says this partition
                // has read the log once (a rebuild switches over only then). A window
                // with nothing for it, short of the head, moves the position in memory
                // only: the next batch or the head saves it.
                if page.caught_up && (page.position > position || !idle_saved) {
                    Work::begin(&mut conn, self)
                        .await?
                        .commit(page.position, None)
                        .await?;
                    idle_saved = true;
                }
            } else {
                match self
                    .batch(&mut conn, &page.events, page.position, &mut held)
                    .await
                {
                    Ok(()) => {
                        good_batches += 1;
                        if limit < full && good_batches >= GROW_AFTER {
                            limit = (limit * 2).min(full);
                            good_batches = 0;
                        }
                    }
                    Err(e) if e.is_resource() && limit > 1 => {
                        limit = (limit / 2).max(1);
                        good_batches = 0;
                        tracing::warn!(subscriber = %self.subscriber(), partition = self.partition, batch = limit, error = %e, "the server ran short of a resource; trying a smaller batch");
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::Data => {
                        tracing::debug!(subscriber = %self.subscriber(), error = %e, "batch failed, isolating the event");
                        // Each event commits its own checkpoint on this path; the page's
                        // end is saved only once every event in it has been handled.
                        if !self
                            .one_by_one(&mut conn, &page.events, &mut held, cancel)
                            .await?
                        {
                            return Ok(());
                        }
                        Work::begin(&mut conn, self)
                            .await?
                            .commit(page.position, None)
                            .await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            pause.leave(self, &conn.client).await;
            conn.release();
            position = page.position;
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

    /// The fast path: the whole batch in one transaction. Events of aggregates parked
    /// behind a failure are set aside behind their aggregate in the same transaction.
    async fn batch(
        &self,
        conn: &mut Conn,
        events: &[Event],
        position: i64,
        held: &mut Held,
    ) -> Result<(), EngineError> {
        let (waiting, live): (Vec<&Event>, Vec<&Event>) =
            events.iter().partition(|e| held.failed.contains(&key(e)));
        let mut work = Work::begin(conn, self).await?;
        let strict = work.process(&live, held).await?;
        for e in &waiting {
            work.dead_letter(&waiting_letter(self.subscriber(), e), false)
                .await?;
        }
        let stats = work.commit(position, last_commit(events)).await?;
        held.update(strict);
        if stats.stale > 0 {
            tracing::debug!(subscriber = %self.subscriber(), stale = stats.stale, "stale events skipped by version guard");
        }
        Ok(())
    }

    /// The slow path after a batch failed on an event's data: one transaction per event;
    /// an event whose data keeps failing is dead-lettered and its aggregate parked.
    /// Returns false when cancelled before every event was handled. Any other error
    /// returns: the run loop goes on from the checkpoint, which every handled event has
    /// moved.
    async fn one_by_one(
        &self,
        conn: &mut Conn,
        events: &[Event],
        held: &mut Held,
        cancel: &CancellationToken,
    ) -> Result<bool, EngineError> {
        for event in events {
            if cancel.is_cancelled() {
                return Ok(false);
            }
            if held.failed.contains(&key(event)) {
                let mut work = Work::begin(conn, self).await?;
                work.dead_letter(&waiting_letter(self.subscriber(), event), false)
                    .await?;
                work.commit(event.seq, event.committed_at).await?;
                continue;
            }
            let first = Duration::from_millis(self.options.retry_backoff_ms);
            let mut backoff = Backoff::exact(first, first * 64);
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let e = match self.single(conn, event, held).await {
                    Ok(()) => break,
                    Err(e) if e.kind() == ErrorKind::Data => e,
                    Err(e) => return Err(e),
                };
                if attempt < self.options.max_attempts && !e.is_permanent() {
                    Signal::ApplyRetrying {
                        subscriber: self.subscriber(),
                        event_id: &event.id,
                        aggregate_id: &event.aggregate_id,
                        attempt,
                        error: &e,
                    }
                    .report();
                    if !backoff.sleep(cancel).await {
                        return Ok(false);
                    }
                    continue;
                }
                Signal::ApplyFailed {
                    subscriber: self.subscriber(),
                    event_id: &event.id,
                    aggregate_id: &event.aggregate_id,
                    attempts: attempt,
                    error: &e,
                }
                .report();
                let mut letter = waiting_letter(self.subscriber(), event);
                letter.reason = Reason::ProjectionFailed;
                letter.error = e.to_string();
                letter.attempts = attempt as i32;
                let mut work = Work::begin(conn, self).await?;
                work.dead_letter(&letter, true).await?;
                work.commit(event.seq, event.committed_at).await?;
                held.failed.insert(key(event));
                break;
            }
        }
        Ok(true)
    }

    /// One event: claim, apply, checkpoint, in one transaction.
    async fn single(
        &self,
        conn: &mut Conn,
        event: &Event,
        held: &mut Held,
    ) -> Result<(), EngineError> {
        let mut work = Work::begin(conn, self).await?;
        let strict = work.process(&[event], held).await?;
        work.commit(event.seq, event.committed_at).await?;
        held.update(strict);
        Ok(())
    }

    /// Applies the dead letters an operator asked to retry (`walfold dead-letters retry`)
    /// for this partition's aggregates, between batches: per aggregate in log order, a
    /// page at a time, each event through the normal claim and guard in its own
    /// transaction. The transaction of the chain's last event releases the parked
    /// aggregate, so its later events follow in order. Cancelling stops between events;
    /// the rest stays requested and goes on next time.
    async fn retries(
        &self,
        conn: &mut Conn,
        held: &mut Held,
        cancel: &CancellationToken,
    ) -> Result<(), EngineError> {
        let aggregates: Vec<AggregateKey> =
            DeadLetters::retry_aggregates(&conn.client, &self.schema, self.subscriber())
                .await
                .map_err(EngineError::store("reading retry requests"))?
                .into_iter()
                .filter(|(t, i)| self.owns(t, i))
                .collect();
        for aggregate in aggregates {
            let (kind, id) = (&aggregate.0, &aggregate.1);
            let mut after = 0;
            let mut applied = 0usize;
            let failure = 'chain: loop {
                let mut page = DeadLetters::retry_page(
                    &conn.client,
                    &self.schema,
                    self.subscriber(),
                    (kind, id),
                    after,
                    RETRY_PAGE + 1,
                )
                .await
                .map_err(EngineError::store("reading dead letters to retry"))?;
                let last_page = page.len() as i64 <= RETRY_PAGE;
                page.truncate(RETRY_PAGE as usize);
                let Some(end) = page.last().map(|i| i.seq) else {
                    break None;
                };
                let seqs: Vec<i64> = page.iter().map(|i| i.seq).collect();
                let events = match (&conn.log, &self.log) {
                    (Some(log), Some(main)) => read_events(&**log, &main.schema, &seqs).await,
                    _ => read_events(&*conn.client, &self.schema, &seqs).await,
                }
                .map_err(EngineError::store("reading events to retry"))?;
                for (k, item) in page.iter().enumerate() {
                    if cancel.is_cancelled() {
                        return Ok(());
                    }
                    let Some(event) = events.iter().find(|e| e.seq == item.seq) else {
                        break 'chain Some((
                            item.id,
                            "the event is no longer in the event log".to_owned(),
                        ));
                    };
                    let release = last_page && k + 1 == page.len();
                    match self.retry_one(conn, item, event, release, held).await {
                        Ok(()) => applied += 1,
                        Err(e) if e.kind() == ErrorKind::Data => {
                            break 'chain Some((item.id, e.to_string()))
                        }
                        Err(e) => return Err(e),
                    }
                }
                if last_page {
                    break None;
                }
                after = end;
            };
            match failure {
                None => {
                    Signal::RetryApplied {
                        subscriber: self.subscriber(),
                        aggregate_type: kind,
                        aggregate_id: id,
                        events: applied,
                    }
                    .report();
                    held.failed.remove(&aggregate);
                }
                Some((head, message)) => {
                    Signal::RetryFailedAgain {
                        subscriber: self.subscriber(),
                        aggregate_type: kind,
                        aggregate_id: id,
                        dead_letter: head,
                        error: &message,
                    }
                    .report();
                    DeadLetters::retry_failed(
                        &*conn.client,
                        &self.schema,
                        self.subscriber(),
                        (kind, id),
                        head,
                        &message,
                    )
                    .await
                    .map_err(EngineError::store("recording a failed retry"))?;
                }
            }
        }
        Ok(())
    }

    /// Releases this partition's aggregates parked behind a dead letter an operator
    /// discarded, once nothing else of theirs waits (`walfold dead-letters discard` of
    /// the only letter): a discard means the event is given up on, and with nothing
    /// left to retry the aggregate would stay parked for good.
    async fn release_discarded(&self, conn: &mut Conn, held: &mut Held) -> Result<(), EngineError> {
        if held.failed.is_empty() {
            return Ok(());
        }
        let released: Vec<AggregateKey> =
            DeadLetters::discarded_parks(&conn.client, &self.schema, self.subscriber())
                .await
                .map_err(EngineError::store(
                    "reading parks behind discarded dead letters",
                ))?
                .into_iter()
                .filter(|k| held.failed.contains(k) && self.owns(&k.0, &k.1))
                .collect();
        for aggregate in released {
            let mut work = Work::begin(conn, self).await?;
            work.release(&aggregate).await?;
            // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
            work.commit(0, None).await?;
            held.failed.remove(&aggregate);
            tracing::info!(subscriber = %self.subscriber(), aggregate_type = %aggregate.0, aggregate_id = %aggregate.1, "aggregate released: the dead letter it was parked behind was discarded, and nothing else of it waits");
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
        release: bool,
        held: &mut Held,
    ) -> Result<(), EngineError> {
        let mut work = Work::begin(conn, self).await?;
        work.retrying = true;
        if release {
            work.release(&key(event)).await?;
        }
        let strict = work.process(&[event], held).await?;
        work.retried(item, &strict).await?;
        // Position 0 keeps the partition's position (the checkpoint keeps the greatest).
        work.commit(0, None).await?;
        held.update(strict);
        Ok(())
    }

    /// A strict projection's gaps, between batches: one open longer than `gap_timeout`
    /// becomes an open dead letter saying which versions are missing; one an operator
    /// discarded gives up on them (its waiting events apply from the first one on); one
    /// an operator retried is checked again and reopened if the versions are still
    /// missing.
    async fn gap_checks(
        &self,
        conn: &mut Conn,
        held: &mut Held,
        at_head: bool,
    ) -> Result<(), EngineError> {
        if self.options.version_mode != VersionMode::Strict || held.gaps.is_empty() {
            return Ok(());
        }
        let gaps = DeadLetters::gaps(&conn.client, &self.schema, self.subscriber())
            .await
            .map_err(EngineError::store("reading version gaps"))?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let timeout = self.options.gap_timeout.after();
        for gap in gaps
            .into_iter()
            .filter(|g| self.owns(&g.aggregate_type, &g.aggregate_id))
        {
            let k = (gap.aggregate_type.clone(), gap.aggregate_id.clone());
            let due = at_head && timeout.is_some_and(|t| now - gap.since_unix >= t.as_secs_f64());
            match gap.status {
                DeadLetterStatus::Waiting if due => {
                    let work = Work::begin(conn, self).await?;
                    let error = work.describe_gap(&k, timeout).await?;
                    tracing::error!(subscriber = %self.subscriber(), aggregate_type = %k.0, aggregate_id = %k.1, error = %error, "a version gap outlived gap_timeout: open dead letter");
                    work.statements
                        .dead_letters
                        .open_gap(&work.tx, self.subscriber(), &gap, &error)
                        .await
                        .map_err(EngineError::store("recording a version gap"))?;
                    work.commit(0, None).await?;
                }
                DeadLetterStatus::Discarded | DeadLetterStatus::Retrying => {
                    let accept = gap.status == DeadLetterStatus::Discarded;
                    let mut work = Work::begin(conn, self).await?;
                    let accepted = if accept { vec![k.clone()] } else { Vec::new() };
                    let strict = work
                        .apply_strict(&[], held, std::slice::from_ref(&k), &accepted)
                        .await?;
                    if !accept && !strict.released.contains(&k) {
                        let error = work.describe_gap(&k, timeout).await?;
                        DeadLetters::gap_still_open(&work.tx, &self.schema, gap.letter, &error)
                            .await
                            .map_err(EngineError::store("reopening a version gap"))?;
                    }
                    work.commit(0, None).await?;
                    if accept {
                        tracing::warn!(subscriber = %self.subscriber(), aggregate_type = %k.0, aggregate_id = %k.1, "version gap discarded: its waiting events applied without the missing versions");
                    }
                    held.update(strict);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether this partition owns the aggregate.
    fn owns(&self, aggregate_type: &str, aggregate_id: &str) -> bool {
        partition_hash(aggregate_type, aggregate_id) % self.options.parallelism as i32
            == self.partition as i32
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
            "payload": e.payload.to_value(),
            "headers": e.headers.as_ref().map(walfold_event::JsonText::to_value),
        })),
        existing: None,
        attempts: 0,
        source_lsn: Some(e.source_lsn),
        origin: None,
    }
}
