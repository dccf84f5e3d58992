//! The process's metrics, in Prometheus text format (prometheus-client). Counters,
//! histograms and the gauges of what this process does (pauses, leadership) are kept in
//! process and moved only by the [`Signal`](crate::signal::Signal)s the code doing the
//! work reports; gauges that describe the database (lag, retained WAL, table sizes) are
//! set at scrape time from what `walfold_store::metrics_reading` reads, so they are
//! right whichever instance leads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SubscriberLabel {
    subscriber: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FoldedLabel {
    projection: String,
    subscriber: String,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DefinitionLabel {
    projection: String,
    subscriber: String,
    /// The short digest `walfold status` prints.
    digest: String,
    /// A Rust projection's own version; empty for `sql` and `table` projections.
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RebuildLabel {
    projection: String,
    subscriber: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProjectionLabel {
    projection: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabel {
    source: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type HistogramFamily = Family<SubscriberLabel, Histogram, fn() -> Histogram>;

/// Every metric walfold exports.
pub struct Metrics {
    registry: Registry,
    // Ingest, counted by each source's appender.
    pub(crate) events_read: Family<SourceLabel, Counter>,
    pub(crate) events_appended: Family<SourceLabel, Counter>,
    pub(crate) log_duplicates: Family<SourceLabel, Counter>,
    pub(crate) id_conflicts: Family<SourceLabel, Counter>,
    pub(crate) malformed: Family<SourceLabel, Counter>,
    // Projectors, per subscriber.
    pub(crate) applied: Family<SubscriberLabel, Counter>,
    pub(crate) claim_duplicates: Family<SubscriberLabel, Counter>,
    pub(crate) stale: Family<SubscriberLabel, Counter>,
    pub(crate) failures: Family<SubscriberLabel, Counter>,
    pub(crate) retries: Family<SubscriberLabel, Counter>,
    pub(crate) dead_letters: Family<SubscriberLabel, Counter>,
    pub(crate) batch_size: HistogramFamily,
    pub(crate) apply_seconds: HistogramFamily,
    /// Event-log pages projectors read from the log, and took from a page another
    /// partition had read.
    pub(crate) log_pages_read: Counter,
    pub(crate) log_pages_shared: Counter,
    /// Partitions of a subscriber paused by an environment error, in this process.
    paused: Family<SubscriberLabel, Gauge>,
    /// 1 while a source's ingest waits out an environment error.
    ingest_paused: Family<SourceLabel, Gauge>,
    /// 1 once a source's ingest stopped on a definite error (the others go on).
    ingest_stopped: Family<SourceLabel, Gauge>,
    /// 1 while PUBLIC may execute `pg_logical_emit_message` on a source with a message
    /// outbox (seen by the running check).
    public_emit: Family<SourceLabel, Gauge>,
    /// Partitions of a subscriber, and a source's ingest, holding work that has not
    /// moved for `ready_max_stall_s` (see [`crate::stall`]), set at each scrape.
    projection_stalled: Family<SubscriberLabel, Gauge>,
    ingest_stalled: Family<SourceLabel, Gauge>,
    /// Paused partitions over every subscriber, and ingest (for `/readyz`).
    paused_total: std::sync::atomic::AtomicI64,
    // Read from the database at scrape time.
    lag_events: Family<SubscriberLabel, Gauge>,
    lag_seconds: Family<SubscriberLabel, FloatGauge>,
    parked: Family<SubscriberLabel, Gauge>,
    folded_lsn: Family<FoldedLabel, Gauge>,
    folded_age: Family<FoldedLabel, FloatGauge>,
    definition_info: Family<DefinitionLabel, Gauge>,
    definition_rebuilding: Family<ProjectionLabel, Gauge>,
    rebuild_read: Family<RebuildLabel, Gauge>,
    rebuild_remaining: Family<RebuildLabel, Gauge>,
    slot_retained_bytes: Family<SourceLabel, Gauge>,
    slot_lag_bytes: Family<SourceLabel, Gauge>,
    slot_confirmed_flush_lsn: Family<SourceLabel, Gauge>,
    slot_active: Family<SourceLabel, Gauge>,
    source_reachable: Family<SourceLabel, Gauge>,
    seconds_since_feedback: Family<SourceLabel, FloatGauge>,
    dead_letters_open: Gauge,
    processed_message_rows: Gauge,
    event_log_rows: Gauge,
    leader: Gauge,
    units_owned: Gauge,
    units_unowned: Gauge,
    slot_gaps: Family<SourceLabel, Gauge>,
    slot_gaps_open: Family<SourceLabel, Gauge>,
    phantom_events: Family<SourceLabel, Gauge>,
    database_up: Gauge,
    /// Per source: whether its reader streams from the slot, and the Unix milliseconds
    /// of its last standby status update (0: none yet).
    sources: std::sync::Mutex<std::collections::BTreeMap<String, SourceState>>,
    /// The parts of this process that stopped or pause on their own (a source's ingest,
    /// an extra target), with why: what `/readyz` names.
    held: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

#[derive(Default, Clone, Copy)]
struct SourceState {
    streaming: bool,
    last_feedback_ms: u64,
    /// When a scrape last reached the source (0: never).
    last_reachable_ms: u64,
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut r = Registry::with_prefix("walfold");
        macro_rules! reg {
            ($name:literal, $help:literal, $metric:expr) => {{
                let m = $metric;
                r.register($name, $help, m.clone());
                m
            }};
        }
        Metrics {
            events_read: reg!("events_read", "Outbox inserts read from the slot", Family::default()),
            events_appended: reg!("events_appended", "Events appended to the event log", Family::default()),
            log_duplicates: reg!("event_log_duplicates", "Events already in the log with the same content (replays, producer retries)", Family::default()),
            id_conflicts: reg!("id_conflicts", "Event IDs already in the log with different content (dead-lettered)", Family::default()),
            malformed: reg!("malformed", "Outbox rows that could not become events (dead-lettered)", Family::default()),
            applied: reg!("applied", "Events that changed a read model", Family::default()),
            claim_duplicates: reg!("claim_duplicates", "Events skipped because the subscriber had claimed them", Family::default()),
            stale: reg!("stale", "Events skipped by a version guard", Family::default()),
            failures: reg!("projection_failures", "Failed attempts at applying an event", Family::default()),
            retries: reg!("projection_retries", "Attempts at an event after a failure", Family::default()),
            dead_letters: reg!("dead_lettered", "Events dead-lettered by a subscriber (failed or waiting behind a parked aggregate)", Family::default()),
            batch_size: reg!("batch_size", "Events per projector batch", HistogramFamily::new_with_constructor(batch_histogram)),
            apply_seconds: reg!("apply_seconds", "Time to claim, apply and checkpoint one batch", HistogramFamily::new_with_constructor(seconds_histogram)),
            log_pages_read: reg!("log_pages_read", "Event-log pages projectors read from the database", Counter::default()),
            log_pages_shared: reg!("log_pages_shared", "Event-log pages projectors took from a page another partition had just read", Counter::default()),
            paused: reg!("projection_paused", "Partitions of the subscriber paused by an error of the environment (privileges, missing table or column, disk full); 0: running", Family::default()),
            ingest_paused: reg!("ingest_paused", "1 while ingest waits out an error of the environment of the target", Family::default()),
            ingest_stopped: reg!("ingest_stopped", "1 once the source's ingest stopped on a definite error (the other sources go on; restart walfold after the fix)", Family::default()),
            public_emit: reg!("public_emit", "1 while any role may write events into a message outbox of the source (pg_logical_emit_message executable by PUBLIC), as the running check last saw", Family::default()),
            projection_stalled: reg!("projection_stalled", "Partitions of the subscriber in this process holding work (a turn: a connection, a page of the log, its apply and checkpoint) that has not moved for metrics.ready_max_stall_s; 0: moving or idle", Family::default()),
            ingest_stalled: reg!("ingest_stalled", "1 while the source's ingest in this process holds what the source sent and has not appended any of it for metrics.ready_max_stall_s", Family::default()),
            paused_total: std::sync::atomic::AtomicI64::new(0),
            lag_events: reg!("subscriber_lag_events", "Events in the log the subscriber's slowest partition has not read", Family::default()),
            lag_seconds: reg!("subscriber_lag_seconds", "Age of the last applied event's source commit, while behind", Family::default()),
            parked: reg!("parked_aggregates", "Aggregates whose events wait behind a dead letter", Family::default()),
            folded_lsn: reg!("projection_folded_lsn", "The source position up to which the projection has applied every event, as a number (read your own writes)", Family::default()),
            folded_age: reg!("projection_folded_age_seconds", "Age of the source commit of the newest event the projection has applied everything up to", Family::default()),
            definition_info: reg!("projection_definition_info", "1 for the definition each subscriber serving or rebuilding a projection folds with (digest as walfold status prints it)", Family::default()),
            definition_rebuilding: reg!("projection_definition_rebuilding", "1 while a rebuild started for the projection's changed definition (on_definition_change = \"rebuild\") replays; the old definition serves until its switch-over", Family::default()),
            rebuild_read: reg!("rebuild_read_positions", "Positions of the event log a rebuild's slowest partition has read past (every event, its filter's or not)", Family::default()),
            rebuild_remaining: reg!("rebuild_remaining_positions", "Positions of the event log between a rebuild's slowest partition and the head (0 once switched over)", Family::default()),
            slot_retained_bytes: reg!("slot_retained_wal_bytes", "WAL the slot keeps on the source (current LSN - restart_lsn)", Family::default()),
            slot_lag_bytes: reg!("slot_lag_bytes", "WAL not yet confirmed (current LSN - confirmed_flush_lsn)", Family::default()),
            slot_confirmed_flush_lsn: reg!("slot_confirmed_flush_lsn", "The slot's confirmed flush LSN, as a number", Family::default()),
            slot_active: reg!("slot_active", "1 while a walsender streams the slot", Family::default()),
            source_reachable: reg!("source_reachable", "1 when the last scrape could ask the source about its slot; 0: unreachable (its slot gauges are absent or 0, not old values)", Family::default()),
            seconds_since_feedback: reg!("seconds_since_feedback", "Seconds since this process last sent a standby status update (-1: never)", Family::default()),
            dead_letters_open: reg!("dead_letters_open", "Dead letters not retried or discarded", Gauge::default()),
            processed_message_rows: reg!("processed_message_rows", "Dedup claims (planner estimate)", Gauge::default()),
            event_log_rows: reg!("event_log_rows", "Events in the log (planner estimate)", Gauge::default()),
            leader: reg!("leader", "1 while this instance leads", Gauge::default()),
            units_owned: reg!(
                "work_units_owned",
                "work units (projection partitions) this instance owns",
                Gauge::default()
            ),
            units_unowned: reg!(
                "work_units_unowned",
                "work units no live instance owns, as this instance last read them (a dead owner's, or one no instance may run)",
                Gauge::default()
            ),
            slot_gaps: reg!("slot_gaps", "WAL ranges skipped by recreating a lost slot (walfold.slot_gap rows; page on any increase)", Family::default()),
            slot_gaps_open: reg!("slot_gaps_open", "Slot gaps no backfill filled (a message outbox's events in them may be lost)", Family::default()),
            phantom_events: reg!("phantom_events", "Events read from an old primary past a failover's fork that the new primary does not have (walfold.phantom_event, not accepted); rebuild the projections they reached", Family::default()),
            database_up: reg!("database_up", "1 when the last scrape could read the database gauges (0: they hold older values)", Gauge::default()),
            registry: r,
            sources: Default::default(),
            held: Default::default(),
        }
    }

    pub(crate) fn subscriber(subscriber: &str) -> SubscriberLabel {
        SubscriberLabel {
            subscriber: subscriber.to_owned(),
        }
    }

    pub(crate) fn source(source: &str) -> SourceLabel {
        SourceLabel {
            source: source.to_owned(),
        }
    }

    fn with_source<T>(&self, source: &str, f: impl FnOnce(&mut SourceState) -> T) -> T {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        f(sources.entry(source.to_owned()).or_default())
    }

    pub fn set_streaming(&self, source: &str, on: bool) {
        self.with_source(source, |s| s.streaming = on);
    }

    /// The sources this process follows that are not streaming from their slots.
    pub fn not_streaming(&self, sources: &[&str]) -> Vec<String> {
        sources
            .iter()
            .filter(|s| !self.with_source(s, |st| st.streaming))
            .map(|s| (*s).to_owned())
            .collect()
    }

    pub(crate) fn set_leader(&self, on: bool) {
        self.leader.set(i64::from(on));
    }

    pub(crate) fn set_units(&self, owned: usize, unowned: usize) {
        self.units_owned.set(owned as i64);
        self.units_unowned.set(unowned as i64);
    }

    /// How many work units this instance owns.
    pub fn units_owned(&self) -> i64 {
        self.units_owned.get()
    }

    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Makes `subscriber`'s series exist (at their current values, 0 at first): its
    /// paused gauge and its counters, so that a dashboard shows 0 and a `rate()` has a
    /// series before the first event of each kind.
    pub(crate) fn show_subscriber(&self, subscriber: &str) {
        let l = Self::subscriber(subscriber);
        let _ = self.paused.get_or_create(&l);
        for counter in [
            &self.applied,
            &self.claim_duplicates,
            &self.stale,
            &self.failures,
            &self.retries,
            &self.dead_letters,
        ] {
            let _ = counter.get_or_create(&l);
        }
    }

    /// A partition of `subscriber` paused (`true`) or resumed.
    pub(crate) fn set_paused(&self, subscriber: &str, paused: bool) {
        let delta = if paused { 1 } else { -1 };
        self.paused
            .get_or_create(&Self::subscriber(subscriber))
            .inc_by(delta);
        self.paused_total.fetch_add(delta, Ordering::Relaxed);
    }

    /// A source's ingest paused (`true`) or resumed.
    pub(crate) fn set_ingest_paused(&self, source: &str, paused: bool) {
        let was = self
            .ingest_paused
            .get_or_create(&Self::source(source))
            .set(i64::from(paused));
        self.paused_total
            .fetch_add(i64::from(paused) - was, Ordering::Relaxed);
    }

    /// Whether PUBLIC may write a source's message outboxes' events, as last checked;
    /// returns what it was.
    pub(crate) fn set_public_emit(&self, source: &str, public: bool) -> bool {
        self.public_emit
            .get_or_create(&Self::source(source))
            .set(i64::from(public))
            == 1
    }

    /// A source's ingest stopped for good, because of `cause`.
    pub(crate) fn set_ingest_stopped(&self, source: &str, cause: String) {
        self.ingest_stopped
            .get_or_create(&Self::source(source))
            .set(1);
        self.hold(format!("ingest of source {source} stopped"), Some(cause));
    }

    /// Says that `part` is held by `cause`, or (`None`) no longer.
    pub(crate) fn hold(&self, part: String, cause: Option<String>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match cause {
            Some(cause) => held.insert(part, cause),
            None => held.remove(&part),
        };
    }

    /// The parts that stopped or pause on their own, each with why (for `/readyz`).
    pub fn held(&self) -> Vec<(String, String)> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().map(|(p, c)| (p.clone(), c.clone())).collect()
    }

    /// Whether anything in this process is paused.
    pub fn any_paused(&self) -> bool {
        self.paused_total.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn feedback_sent(&self, source: &str) {
        self.with_source(source, |s| s.last_feedback_ms = unix_ms());
    }

    /// Counts what one append of `source` did.
    pub(crate) fn appended(
        &self,
        source: &str,
        read: u64,
        appended: u64,
        duplicates: u64,
        conflicts: u64,
        malformed: u64,
    ) {
        let l = Self::source(source);
        self.events_read.get_or_create(&l).inc_by(read);
        self.events_appended.get_or_create(&l).inc_by(appended);
        self.log_duplicates.get_or_create(&l).inc_by(duplicates);
        self.id_conflicts.get_or_create(&l).inc_by(conflicts);
        self.malformed.get_or_create(&l).inc_by(malformed);
    }

    /// Counts an attempt at applying an event: `projection_failures` counts the failed
    /// ones, `projection_retries` those after a failure (the next one, or an operator's).
    pub(crate) fn attempt(&self, subscriber: &str, attempt: Attempt) {
        let l = Self::subscriber(subscriber);
        if !matches!(attempt, Attempt::RetryApplied) {
            self.failures.get_or_create(&l).inc();
        }
        if !matches!(attempt, Attempt::FailedForGood) {
            self.retries.get_or_create(&l).inc();
        }
    }

    /// Records one projector batch.
    pub(crate) fn batch(&self, subscriber: &str, events: usize, took: Duration) {
        let l = Self::subscriber(subscriber);
        self.batch_size.get_or_create(&l).observe(events as f64);
        self.apply_seconds
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// Renders everything; `database` is the outcome of reading the database gauges (on
    /// an error they keep their last values and `database_up` is 0).
    pub fn render<E: std::fmt::Display>(&self, database: Result<(), E>) -> String {
        if let Err(e) = &database {
            tracing::warn!(error = %e, "metrics: cannot read the database gauges");
        }
        self.database_up.set(i64::from(database.is_ok()));
        self.set_stalled();
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Sets the stalled gauges from what this process holds now.
    fn set_stalled(&self) {
        let mut partitions = std::collections::BTreeMap::<&str, i64>::new();
        let mut sources = std::collections::BTreeMap::<&str, i64>::new();
        let mut units = Vec::new();
        crate::stall::each(|unit, stalled| units.push((unit.clone(), stalled)));
        for (unit, stalled) in &units {
            let count = match unit {
                crate::stall::Unit::Ingest { source } => sources.entry(source).or_default(),
                crate::stall::Unit::Partition { subscriber, .. } => {
                    partitions.entry(subscriber).or_default()
                }
            };
            *count += i64::from(*stalled);
        }
        for (subscriber, n) in partitions {
            self.projection_stalled
                .get_or_create(&Self::subscriber(subscriber))
                .set(n);
        }
        for (source, n) in sources {
            self.ingest_stalled
                .get_or_create(&Self::source(source))
                .set(n);
        }
    }

    /// Sets the gauges that describe the database, read at scrape time.
    pub fn set_database(&self, reading: &DatabaseReading) {
        self.lag_events.clear();
        self.lag_seconds.clear();
        self.parked.clear();
        self.folded_lsn.clear();
        self.folded_age.clear();
        self.definition_info.clear();
        self.definition_rebuilding.clear();
        self.rebuild_read.clear();
        self.rebuild_remaining.clear();
        for r in &reading.rebuilds {
            let l = RebuildLabel {
                projection: r.projection.clone(),
                subscriber: r.subscriber.clone(),
            };
            self.rebuild_read.get_or_create(&l).set(r.read);
            self.rebuild_remaining.get_or_create(&l).set(r.remaining);
        }
        for sub in &reading.subscribers {
            let l = Self::subscriber(&sub.subscriber);
            if let Some(lag) = &sub.lag {
                self.lag_events.get_or_create(&l).set(lag.events);
                self.lag_seconds.get_or_create(&l).set(lag.seconds);
            }
            self.parked.get_or_create(&l).set(sub.parked_aggregates);
            for f in &sub.folded {
                let l = FoldedLabel {
                    projection: f.projection.clone(),
                    subscriber: sub.subscriber.clone(),
                    source: f.source.clone(),
                };
                self.folded_lsn.get_or_create(&l).set(f.lsn as i64);
                if let Some(age) = f.newest_commit_age_s {
                    self.folded_age.get_or_create(&l).set(age);
                }
            }
            if let Some(d) = &sub.definition {
                let l = DefinitionLabel {
                    projection: d.projection.clone(),
                    subscriber: sub.subscriber.clone(),
                    digest: d.digest.clone(),
                    version: d.version.map_or_else(String::new, |v| v.to_string()),
                };
                self.definition_info.get_or_create(&l).set(1);
                let _ = self.definition_rebuilding.get_or_create(&ProjectionLabel {
                    projection: d.projection.clone(),
                });
            }
        }
        for projection in &reading.rebuilding_for_definition {
            self.definition_rebuilding
                .get_or_create(&ProjectionLabel {
                    projection: projection.clone(),
                })
                .set(1);
        }
        for source in &reading.sources {
            let l = Self::source(&source.name);
            self.slot_gaps.get_or_create(&l).set(source.slot_gaps);
            self.slot_gaps_open
                .get_or_create(&l)
                .set(source.slot_gaps_open);
            self.phantom_events.get_or_create(&l).set(source.phantoms);
            let Some(slot) = &source.slot else {
                // Unreachable: nobody streams its slot from here, and what the slot
                // retains is unknown, not the last values read. Feedback written into a
                // silent partition reaches nobody: the age counts from the last feedback
                // sent while the source was known to answer.
                self.source_reachable.get_or_create(&l).set(0);
                self.slot_active.get_or_create(&l).set(0);
                let (feedback, reachable) = self.with_source(&source.name, |st| {
                    (st.last_feedback_ms, st.last_reachable_ms)
                });
                let last = match reachable {
                    0 => feedback,
                    r => feedback.min(r),
                };
                self.seconds_since_feedback
                    .get_or_create(&l)
                    .set(seconds_since(last));
                self.slot_retained_bytes.remove(&l);
                self.slot_lag_bytes.remove(&l);
                self.slot_confirmed_flush_lsn.remove(&l);
                continue;
            };
            self.source_reachable.get_or_create(&l).set(1);
            // Known without the database: how long since this process reported.
            let last = self.with_source(&source.name, |st| {
                st.last_reachable_ms = unix_ms();
                st.last_feedback_ms
            });
            self.seconds_since_feedback
                .get_or_create(&l)
                .set(seconds_since(last));
            self.slot_active
                .get_or_create(&l)
                .set(i64::from(slot.active));
            self.slot_retained_bytes
                .get_or_create(&l)
                .set(slot.retained_bytes);
            self.slot_lag_bytes.get_or_create(&l).set(slot.lag_bytes);
            self.slot_confirmed_flush_lsn
                .get_or_create(&l)
                .set(slot.confirmed_flush_lsn);
        }
        self.dead_letters_open.set(reading.dead_letters_open);
        self.processed_message_rows
            .set(reading.processed_message_rows);
    }

    /// Sets the event log's row estimate (read after the other database gauges).
    pub fn set_event_log_rows(&self, rows: i64) {
        self.event_log_rows.set(rows);
    }
}

/// An attempt at applying an event, as the failure and retry counters see it.
#[derive(Clone, Copy)]
pub(crate) enum Attempt {
    /// Failed on the event's data; it is tried again.
    FailedRetrying,
    /// Failed for the last time: dead-lettered.
    FailedForGood,
    /// An operator's retry that applied.
    RetryApplied,
    /// An operator's retry that failed again.
    RetryFailed,
}

/// The database gauges, as read at scrape time.
#[derive(Debug, Default)]
pub struct DatabaseReading {
    pub subscribers: Vec<SubscriberReading>,
    pub sources: Vec<SourceReading>,
    pub dead_letters_open: i64,
    pub processed_message_rows: i64,
    /// Projections with a rebuild for a changed definition replaying.
    pub rebuilding_for_definition: Vec<String>,
    /// Rebuilds not ended (running, aborting, switched with the retired table kept).
    pub rebuilds: Vec<RebuildReading>,
}

/// A rebuild's progress, in positions of the event log.
#[derive(Debug)]
pub struct RebuildReading {
    pub projection: String,
    pub subscriber: String,
    pub read: i64,
    pub remaining: i64,
}

#[derive(Debug)]
pub struct SubscriberReading {
    pub subscriber: String,
    /// Only for a subscriber serving a projection now: a rebuild's replaying subscriber
    /// is behind by design, and a retired one forever.
    pub lag: Option<Lag>,
    pub parked_aggregates: i64,
    /// Per source, for a subscriber serving a projection now.
    pub folded: Vec<Folded>,
    /// What it folds with, for a subscriber serving or rebuilding a projection.
    pub definition: Option<DefinitionReading>,
}

/// The recorded definition of a subscriber serving or rebuilding a projection.
#[derive(Debug)]
pub struct DefinitionReading {
    pub projection: String,
    /// Short, as `walfold status` prints it.
    pub digest: String,
    /// A Rust projection's own version.
    pub version: Option<u32>,
}

/// How far a live subscriber has folded one source (read your own writes).
#[derive(Debug)]
pub struct Folded {
    pub projection: String,
    pub source: String,
    pub lsn: u64,
    pub newest_commit_age_s: Option<f64>,
}

#[derive(Debug)]
pub struct Lag {
    pub events: i64,
    pub seconds: f64,
}

#[derive(Debug)]
pub struct SourceReading {
    pub name: String,
    pub slot_gaps: i64,
    pub slot_gaps_open: i64,
    pub phantoms: i64,
    /// `None`: the source could not be reached.
    pub slot: Option<SlotReading>,
}

/// A reachable source's slot; zeros when the slot is missing.
#[derive(Debug, Default)]
pub struct SlotReading {
    pub active: bool,
    pub retained_bytes: i64,
    pub lag_bytes: i64,
    pub confirmed_flush_lsn: i64,
}

/// Seconds since the Unix milliseconds `ms` (-1: never).
fn seconds_since(ms: u64) -> f64 {
    match ms {
        0 => -1.0,
        ms => unix_ms().saturating_sub(ms) as f64 / 1000.0,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}
