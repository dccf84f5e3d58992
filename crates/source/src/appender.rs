//! The appender: batches what the reader sends into event-log transactions and, only
//! after each commit, publishes the batch's position as durable.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use walfold_event::{DeadLetter, Lsn, NewEvent};
use walfold_store::{
    AppendOutcome, EventLog, IngestCounts, StagedChange, StagedRow, StoreError, StreamCommit,
};
use walfold_telemetry::failpoint;
use walfold_telemetry::signal::Signal;

use crate::budget::{Budget, InFlightBytes};
use crate::error::SourceError;
use crate::feedback::Durable;
use crate::reader::Item;

/// Counters of one run, for logs and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendTotals {
    pub appended: u64,
    pub duplicates: u64,
    pub id_conflicts: u64,
    pub malformed: u64,
    pub ignored: u64,
}

pub(crate) struct Appender {
    pub log: EventLog,
    pub durable: Durable,
    /// The log's head, published for every source's appender (it only moves up).
    pub head: std::sync::Arc<watch::Sender<i64>>,
    /// The source's name, for its metrics.
    pub source: String,
    pub batch_size: usize,
    /// What the batch's items hold of it goes back once they are written.
    pub budget: Budget,
    /// Opens the event log on a new connection, for one that carried a large batch.
    pub reopen: Reopen,
    pub linger: Duration,
    /// When the ingest position was last written.
    pub position_written: tokio::time::Instant,
    /// The slot's horizon as the heartbeat last read it, recorded after the next flush
    /// (see `horizon`).
    pub horizon: watch::Receiver<Option<(walfold_event::Lsn, i64)>>,
    pub repeats: Repeats,
}

/// How often the log says that event IDs came again: a producer that retries would
/// otherwise write a line per batch (the metrics count every one).
const REPEATS_EVERY: Duration = Duration::from_secs(60);

/// Repeated event IDs, said at the first and then at most every [`REPEATS_EVERY`].
#[derive(Default)]
pub(crate) struct Repeats {
    said: Option<tokio::time::Instant>,
    duplicates: u64,
    id_conflicts: u64,
}

impl Repeats {
    fn add(&mut self, duplicates: u64, id_conflicts: u64) {
        self.duplicates += duplicates;
        self.id_conflicts += id_conflicts;
        let due = self.said.is_none_or(|t| t.elapsed() >= REPEATS_EVERY);
        if !due || self.duplicates + self.id_conflicts == 0 {
            return;
        }
        tracing::info!(
            duplicates = self.duplicates,
            id_conflicts = self.id_conflicts,
            "repeated event IDs at the event log (said at most once a minute; the \
             event_log_duplicates and id_conflicts metrics count each)"
        );
        *self = Repeats {
            said: Some(tokio::time::Instant::now()),
            ..Repeats::default()
        };
    }
}

/// How to open the event log on a connection of its own: tokio-postgres keeps a
/// connection's buffers at the largest message they held, so the appender's connection
/// is replaced after it carried an event as large as the whole ingest budget.
pub(crate) struct Reopen {
    pub url: String,
    pub schema: walfold_store::Schema,
    pub slot: String,
    pub source: String,
    pub order: std::sync::Arc<walfold_store::LogOrder>,
    pub fence: walfold_store::Fence,
}

impl Reopen {
    pub(crate) async fn open(&self) -> Result<EventLog, SourceError> {
        let target = walfold_pg::connect(&self.url).await?;
        let mut log = EventLog::open(
            target,
            &self.schema,
            &self.slot,
            &self.source,
            self.order.clone(),
        )
        .await?;
        log.fence_with(&self.fence).await?;
        Ok(log)
    }
}

/// What a batch holds until it is written.
#[derive(Default)]
struct Pending {
    events: Vec<NewEvent>,
    dead: Vec<DeadLetter>,
    counts: IngestCounts,
    through: Option<Lsn>,
    staged: Vec<StagedChange>,
}

/// How often a position-only advance is written to `ingest_position`.
const POSITION_REFRESH: Duration = Duration::from_secs(10);
/// How often it is written while a `wait_for` waits for it (read your own writes).
const AWAITED_REFRESH: Duration = Duration::from_millis(20);

impl Appender {
    /// Runs until the reader closes the channel, then returns after the last commit.
    pub(crate) async fn run(
        mut self,
        mut items: mpsc::Receiver<(Item, InFlightBytes)>,
    ) -> Result<(), SourceError> {
        let mut batch = Vec::with_capacity(self.batch_size);
        let mut held: Vec<InFlightBytes> = Vec::new();
        let mut totals = AppendTotals::default();
        let take = |batch: &mut Vec<Item>,
                    held: &mut Vec<InFlightBytes>,
                    (item, h): (Item, InFlightBytes)| {
            batch.push(item);
            if h.bytes() > 0 {
                held.push(h);
            }
        };
        loop {
            batch.clear();
            let Some(first) = items.recv().await else {
                break;
            };
            take(&mut batch, &mut held, first);
            let deadline = tokio::time::Instant::now() + self.linger;
            // Up to the batch size, or the whole budget (the reader waits for it).
            while batch.len() < self.batch_size && !self.budget.spent() {
                match items.try_recv() {
                    Ok(item) => take(&mut batch, &mut held, item),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, items.recv()).await {
                            Ok(Some(item)) => take(&mut batch, &mut held, item),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
            // Held until written: a flush that does not move (a commit behind a lock)
            // stalls this source's ingest (`/readyz`, `walfold_ingest_stalled`).
            let holding = walfold_telemetry::stall::hold(
                self.unit(),
                format!("appending {} items the source sent", batch.len()),
            );
            self.flush(&mut batch, &mut totals).await?;
            drop(holding);
            self.record_horizon().await;
            let largest = held.iter().map(InFlightBytes::bytes).max().unwrap_or(0);
            held.clear();
            if largest >= self.budget.bytes() {
                self.log = self.reopen.open().await?;
                self.log.streams();
            }
        }
        tracing::info!(
            appended = totals.appended,
            duplicates = totals.duplicates,
            id_conflicts = totals.id_conflicts,
            malformed = totals.malformed,
            "appender stopped"
        );
        Ok(())
    }

    fn unit(&self) -> walfold_telemetry::stall::Unit {
        walfold_telemetry::stall::Unit::Ingest {
            source: self.source.clone(),
        }
    }

    /// Something of the batch is written: its ingest moves.
    fn moved(&self) {
        walfold_telemetry::stall::moved(&self.unit());
    }

    async fn flush(
        &mut self,
        batch: &mut Vec<Item>,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        self.flush_items(batch, totals).await?;
        // Whatever paused ingest (see `run_ingest`) is over once a flush succeeds.
        Signal::IngestResumed {
            source: &self.source,
        }
        .report();
        Ok(())
    }

    /// Writes a batch in stream order: committed transactions' events and staged
    /// changes accumulate; a streamed transaction's abort or commit first writes
    /// what came before it.
    async fn flush_items(
        &mut self,
        batch: &mut Vec<Item>,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        let mut pending = Pending::default();
        for item in batch.drain(..) {
            match item {
                Item::Event(e) => pending.events.push(e),
                Item::Rejected(d) => {
                    pending.counts.malformed += 1;
                    pending.dead.push(*d);
                }
                Item::Ignored => pending.counts.ignored_changes += 1,
                Item::Through(lsn) => {
                    pending.through = Some(pending.through.map_or(lsn, |t| t.max(lsn)))
                }
                Item::Staged(c) => pending.staged.push(c),
                Item::StreamAbort { xid, subxid } => {
                    self.write(&mut pending, totals).await?;
                    let n = self
                        .log
                        .discard_staged(xid, (subxid != xid).then_some(subxid))
                        .await?;
                    tracing::debug!(xid, subxid, rows = n, "streamed transaction aborted");
                    self.moved();
                }
                Item::StreamCommit {
                    xid,
                    commit_lsn,
                    end_lsn,
                    commit_time,
                } => {
                    self.write(&mut pending, totals).await?;
                    let commit = StreamCommit {
                        xid,
                        commit_lsn,
                        end_lsn,
                        commit_time,
                    };
                    self.commit_stream(commit, totals).await?;
                }
            }
        }
        self.write(&mut pending, totals).await
    }

    /// Moves a committed streamed transaction into the event log.
    async fn commit_stream(
        &mut self,
        commit: StreamCommit,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        let started = std::time::Instant::now();
        let moved = match self.log.commit_staged(commit, self.batch_size, false).await {
            Ok(m) => m,
            Err(e) if is_data_error(&e) => {
                tracing::warn!(error = %e, "the event log refused a streamed transaction; moving its events one by one");
                self.log
                    .commit_staged(commit, self.batch_size, true)
                    .await?
            }
            Err(e) => return Err(e.into()),
        };
        let outcome = moved.outcome;
        if outcome.appended > 0 {
            failpoint::hit("after_append_commit");
        }
        tracing::debug!(xid = commit.xid, lsn = %commit.commit_lsn, appended = outcome.appended, elapsed_ms = started.elapsed().as_millis() as u64, "streamed transaction committed");
        let malformed = moved.malformed + moved.refused;
        let counts = IngestCounts {
            malformed,
            ignored_changes: 0,
        };
        let read = outcome.appended + outcome.duplicates + outcome.id_conflicts;
        self.account(read, outcome, counts, totals);
        if outcome.appended > 0 {
            self.publish_head();
        }
        self.position_written = tokio::time::Instant::now();
        self.durable.committed_through(commit.end_lsn);
        Ok(())
    }

    /// Writes what has accumulated: staged changes, then committed transactions' events
    /// with the position they complete.
    async fn write(
        &mut self,
        pending: &mut Pending,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        if !pending.staged.is_empty() || !pending.events.is_empty() {
            // Tests: a slow target, so the reader and the replication client push back.
            failpoint::delay("append").await;
        }
        if !pending.staged.is_empty() {
            let staged = std::mem::take(&mut pending.staged);
            match self.log.stage(&staged).await {
                Ok(()) => {}
                Err(e) if is_data_error(&e) => {
                    tracing::warn!(error = %e, "the event log refused streamed changes; staging them one by one");
                    self.stage_isolated(staged).await?;
                }
                Err(e) => return Err(e.into()),
            }
            // Crash window: a streamed transaction partly staged.
            failpoint::hit("after_stage");
            self.moved();
        }
        let events = std::mem::take(&mut pending.events);
        let dead = std::mem::take(&mut pending.dead);
        let counts = std::mem::take(&mut pending.counts);
        let through = pending.through.take();
        self.append(events, dead, counts, through, totals).await
    }

    async fn append(
        &mut self,
        events: Vec<NewEvent>,
        dead: Vec<DeadLetter>,
        counts: IngestCounts,
        through: Option<Lsn>,
        totals: &mut AppendTotals,
    ) -> Result<(), SourceError> {
        if events.is_empty() && dead.is_empty() && counts == IngestCounts::default() {
            // Only progress markers: everything before them is already committed. The
            // position is recorded, then acknowledged, at most every 10 s: writing it
            // every time would feed back (the write makes WAL, the server sends a
            // keepalive, which is a new marker). Never acknowledged unrecorded, so a
            // slot found past the recorded position was moved by someone else (setup).
            // A `wait_for` waiting for this source to be read further asks for it sooner
            // (at most every AWAITED_REFRESH while one waits).
            if let Some(lsn) = through {
                let since = self.position_written.elapsed();
                if since >= POSITION_REFRESH
                    || (since >= AWAITED_REFRESH && self.log.ingest_awaited().await)
                {
                    self.log.append(&[], &[], Some(lsn), counts).await?;
                    self.position_written = tokio::time::Instant::now();
                    self.durable.committed_through(lsn);
                }
            }
            self.moved();
            return Ok(());
        }
        let events_len = events.len() as u64;
        let outcome = match self.log.append(&events, &dead, through, counts).await {
            Ok(outcome) => outcome,
            Err(e) if is_data_error(&e) => {
                tracing::warn!(error = %e, "the event log refused a batch; appending its events one by one");
                self.isolate(events, dead, through, counts).await?
            }
            Err(e) => return Err(e.into()),
        };
        if outcome.appended > 0 {
            // Crash window: events durable in the log, slot not yet acknowledged.
            failpoint::hit("after_append_commit");
        }
        self.repeats.add(outcome.duplicates, outcome.id_conflicts);
        self.account(events_len, outcome, counts, totals);
        if outcome.appended > 0 {
            self.publish_head();
        }
        if let Some(lsn) = through {
            self.position_written = tokio::time::Instant::now();
            self.durable.committed_through(lsn);
        }
        Ok(())
    }

    /// Records a horizon the heartbeat read since the last one, on this connection
    /// (no connection of its own); best effort: a missed one only widens a later gap's
    /// scan.
    async fn record_horizon(&mut self) {
        if !self.horizon.has_changed().unwrap_or(false) {
            return;
        }
        let Some((lsn, xid)) = *self.horizon.borrow_and_update() else {
            return;
        };
        if let Err(e) = self.log.record_horizon(lsn, xid).await {
            tracing::debug!(error = %e, "cannot record the slot's horizon");
        }
    }

    fn publish_head(&self) {
        let head = self.log.head();
        self.head.send_if_modified(|h| {
            let moved = head > *h;
            *h = (*h).max(head);
            moved
        });
    }

    /// Counts what an append did in the metrics and the run's totals.
    fn account(
        &self,
        events_read: u64,
        outcome: AppendOutcome,
        counts: IngestCounts,
        totals: &mut AppendTotals,
    ) {
        self.moved();
        Signal::Appended {
            source: &self.source,
            read: events_read + counts.malformed,
            appended: outcome.appended,
            duplicates: outcome.duplicates,
            id_conflicts: outcome.id_conflicts,
            malformed: counts.malformed,
        }
        .report();
        totals.appended += outcome.appended;
        totals.duplicates += outcome.duplicates;
        totals.id_conflicts += outcome.id_conflicts;
        totals.malformed += counts.malformed;
        totals.ignored += counts.ignored_changes;
    }

    /// A batch the event log refused for a reason that will not go away (e.g. a value
    /// PostgreSQL cannot store): append event by event, and dead-letter the ones it
    /// refuses, so one bad row never stops the stream.
    async fn isolate(
        &mut self,
        events: Vec<NewEvent>,
        mut dead: Vec<DeadLetter>,
        through: Option<Lsn>,
        mut counts: IngestCounts,
    ) -> Result<AppendOutcome, SourceError> {
        let mut total = AppendOutcome::default();
        for event in events {
            self.moved();
            match self
                .log
                .append(
                    std::slice::from_ref(&event),
                    &[],
                    None,
                    IngestCounts::default(),
                )
                .await
            {
                Ok(o) => {
                    total.appended += o.appended;
                    total.duplicates += o.duplicates;
                    total.id_conflicts += o.id_conflicts;
                }
                Err(e) if is_data_error(&e) => {
                    Signal::EventRefused {
                        source: &self.source,
                        event_id: &event.id,
                        error: &e,
                    }
                    .report();
                    counts.malformed += 1;
                    dead.push(DeadLetter::refused(&event, &e.to_string()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.log.append(&[], &dead, through, counts).await?;
        Ok(total)
    }
}

impl Appender {
    /// Streamed changes the log refused for a reason that will not go away: staged one
    /// by one, and each event it refuses staged as its dead letter instead (as
    /// [`Appender::isolate`] does for committed transactions).
    async fn stage_isolated(&mut self, staged: Vec<StagedChange>) -> Result<(), SourceError> {
        for mut change in staged {
            self.moved();
            let refused = match self.log.stage(std::slice::from_ref(&change)).await {
                Ok(()) => continue,
                Err(e) if is_data_error(&e) => e,
                Err(e) => return Err(e.into()),
            };
            let StagedRow::Event(event) = &change.row else {
                // A rejected row is staged in a form that cannot be refused.
                return Err(SourceError::StagingDeadLetter(refused));
            };
            Signal::EventRefused {
                source: &self.source,
                event_id: &event.id,
                error: &refused,
            }
            .report();
            change.row =
                StagedRow::Rejected(Box::new(DeadLetter::refused(event, &refused.to_string())));
            self.log.stage(std::slice::from_ref(&change)).await?;
        }
        Ok(())
    }
}

/// An error caused by an event's own values (a value PostgreSQL cannot store, too large,
/// violating a check). Anything else (privileges, schema drift, timeouts) is not the
/// event's fault: it stops the stream unacknowledged instead of dead-lettering events.
fn is_data_error(e: &StoreError) -> bool {
    e.kind() == walfold_event::ErrorKind::Data
}
