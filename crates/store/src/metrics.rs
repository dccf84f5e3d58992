//! The process's metrics, in Prometheus text format (prometheus-client). Counters and
//! histograms are kept in process by the code that does the work; gauges that describe
//! the database (lag, retained WAL, table sizes) are read from it at scrape time, so
//! they are right whichever instance leads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio_postgres::Client;

use crate::error::StoreError;
use crate::q;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SubscriberLabel {
    pub subscriber: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type HistogramFamily = Family<SubscriberLabel, Histogram, fn() -> Histogram>;

/// Every metric walfold exports.
pub struct Metrics {
    registry: Registry,
    // Ingest, counted by the appender.
    pub events_read: Counter,
    pub events_appended: Counter,
    pub log_duplicates: Counter,
    pub id_conflicts: Counter,
    pub malformed: Counter,
    // Projectors, per subscriber.
    pub applied: Family<SubscriberLabel, Counter>,
    pub claim_duplicates: Family<SubscriberLabel, Counter>,
    pub stale: Family<SubscriberLabel, Counter>,
    pub failures: Family<SubscriberLabel, Counter>,
    pub retries: Family<SubscriberLabel, Counter>,
    pub dead_letters: Family<SubscriberLabel, Counter>,
    pub batch_size: HistogramFamily,
    pub apply_seconds: HistogramFamily,
    /// Event-log pages projectors read from the log, and took from a page another
    /// partition had read.
    pub log_pages_read: Counter,
    pub log_pages_shared: Counter,
    /// Partitions of a subscriber paused by an environment error, in this process.
    paused: Family<SubscriberLabel, Gauge>,
    /// 1 while ingest waits out an environment error of the target.
    ingest_paused: Gauge,
    /// Paused partitions over every subscriber, and ingest (for `/readyz`).
    paused_total: std::sync::atomic::AtomicI64,
    // Read from the database at scrape time.
    lag_events: Family<SubscriberLabel, Gauge>,
    lag_seconds: Family<SubscriberLabel, FloatGauge>,
    parked: Family<SubscriberLabel, Gauge>,
    slot_retained_bytes: Gauge,
    slot_lag_bytes: Gauge,
    slot_confirmed_flush_lsn: Gauge,
    slot_active: Gauge,
    seconds_since_feedback: FloatGauge,
    dead_letters_open: Gauge,
    processed_message_rows: Gauge,
    event_log_rows: Gauge,
    leader: Gauge,
    slot_gaps: Gauge,
    database_up: Gauge,
    /// Set by the reader while it streams from the slot.
    streaming: AtomicBool,
    /// Unix milliseconds of the last standby status update sent (0: none yet).
    last_feedback_ms: AtomicU64,
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    fn new() -> Metrics {
        let mut r = Registry::with_prefix("walfold");
        macro_rules! reg {
            ($name:literal, $help:literal, $metric:expr) => {{
                let m = $metric;
                r.register($name, $help, m.clone());
                m
            }};
        }
        Metrics {
            events_read: reg!("events_read", "Outbox inserts read from the slot", Counter::default()),
            events_appended: reg!("events_appended", "Events appended to the event log", Counter::default()),
            log_duplicates: reg!("event_log_duplicates", "Events already in the log with the same content (replays, producer retries)", Counter::default()),
            id_conflicts: reg!("id_conflicts", "Event IDs already in the log with different content (dead-lettered)", Counter::default()),
            malformed: reg!("malformed", "Outbox rows that could not become events (dead-lettered)", Counter::default()),
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
            ingest_paused: reg!("ingest_paused", "1 while ingest waits out an error of the environment of the target", Gauge::default()),
            paused_total: std::sync::atomic::AtomicI64::new(0),
            lag_events: reg!("subscriber_lag_events", "Events in the log the subscriber's slowest partition has not read", Family::default()),
            lag_seconds: reg!("subscriber_lag_seconds", "Age of the last applied event's source commit, while behind", Family::default()),
            parked: reg!("parked_aggregates", "Aggregates whose events wait behind a dead letter", Family::default()),
            slot_retained_bytes: reg!("slot_retained_wal_bytes", "WAL the slot keeps on the source (current LSN - restart_lsn)", Gauge::default()),
            slot_lag_bytes: reg!("slot_lag_bytes", "WAL not yet confirmed (current LSN - confirmed_flush_lsn)", Gauge::default()),
            slot_confirmed_flush_lsn: reg!("slot_confirmed_flush_lsn", "The slot's confirmed flush LSN, as a number", Gauge::default()),
            slot_active: reg!("slot_active", "1 while a walsender streams the slot", Gauge::default()),
            seconds_since_feedback: reg!("seconds_since_feedback", "Seconds since this process last sent a standby status update (-1: never)", FloatGauge::default()),
            dead_letters_open: reg!("dead_letters_open", "Dead letters not retried or discarded", Gauge::default()),
            processed_message_rows: reg!("processed_message_rows", "Dedup claims (planner estimate)", Gauge::default()),
            event_log_rows: reg!("event_log_rows", "Events in the log (planner estimate)", Gauge::default()),
            leader: reg!("leader", "1 while this instance leads", Gauge::default()),
            slot_gaps: reg!("slot_gaps", "WAL ranges skipped by recreating a lost slot (walfold.slot_gap rows; page on any increase)", Gauge::default()),
            database_up: reg!("database_up", "1 when the last scrape could read the database gauges (0: they hold older values)", Gauge::default()),
            registry: r,
            streaming: AtomicBool::new(false),
            last_feedback_ms: AtomicU64::new(0),
        }
    }

    pub fn subscriber(subscriber: &str) -> SubscriberLabel {
        SubscriberLabel {
            subscriber: subscriber.to_owned(),
        }
    }

    pub fn set_streaming(&self, on: bool) {
        self.streaming.store(on, Ordering::Relaxed);
    }

    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    pub fn set_leader(&self, on: bool) {
        self.leader.set(i64::from(on));
    }

    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// A partition of `subscriber` paused (`true`) or resumed.
    pub fn set_paused(&self, subscriber: &str, paused: bool) {
        let delta = if paused { 1 } else { -1 };
        self.paused
            .get_or_create(&Self::subscriber(subscriber))
            .inc_by(delta);
        self.paused_total.fetch_add(delta, Ordering::Relaxed);
    }

    /// Ingest paused (`true`) or resumed.
    pub fn set_ingest_paused(&self, paused: bool) {
        let was = self.ingest_paused.set(i64::from(paused));
        self.paused_total
            .fetch_add(i64::from(paused) - was, Ordering::Relaxed);
    }

    /// Whether anything in this process is paused.
    pub fn any_paused(&self) -> bool {
        self.paused_total.load(Ordering::Relaxed) > 0
    }

    pub fn feedback_sent(&self) {
        self.last_feedback_ms.store(unix_ms(), Ordering::Relaxed);
    }

    /// Records one projector batch.
    pub fn batch(&self, subscriber: &str, events: usize, took: Duration) {
        let l = Self::subscriber(subscriber);
        self.batch_size.get_or_create(&l).observe(events as f64);
        self.apply_seconds
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// Renders everything; `database` is the outcome of [`Metrics::refresh`] (on an error
    /// the database gauges keep their last values and `database_up` is 0).
    pub fn render(&self, database: Result<(), StoreError>) -> String {
        if let Err(e) = &database {
            tracing::warn!(error = %e, "metrics: cannot read the database gauges");
        }
        self.database_up.set(i64::from(database.is_ok()));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Reads the gauges that describe the database; `extra` holds the extra targets'
    /// parts of the status (their subscribers' lag, parked aggregates, dead letters).
    pub async fn refresh(
        &self,
        source: &Client,
        target: &Client,
        schema: &str,
        slot: &str,
        extra: Vec<crate::status::TargetStatus>,
    ) -> Result<(), StoreError> {
        let mut s = crate::status::status(source, target, schema, slot).await?;
        for part in extra {
            s.add(part);
        }
        self.slot_gaps.set(s.slot_gaps);
        self.lag_events.clear();
        self.lag_seconds.clear();
        self.parked.clear();
        for sub in &s.subscribers {
            let l = Self::subscriber(&sub.subscriber);
            self.lag_events.get_or_create(&l).set(sub.lag_events);
            self.lag_seconds
                .get_or_create(&l)
                .set(sub.lag_seconds.unwrap_or(0.0));
            self.parked.get_or_create(&l).set(sub.parked_aggregates);
        }
        let slot = s.slot.as_ref();
        self.slot_active
            .set(slot.map_or(0, |s| i64::from(s.active)));
        self.slot_retained_bytes
            .set(slot.and_then(|s| s.retained_bytes).unwrap_or(0));
        self.slot_lag_bytes
            .set(slot.and_then(|s| s.lag_bytes).unwrap_or(0));
        self.slot_confirmed_flush_lsn.set(
            slot.and_then(|s| s.confirmed_flush_lsn.as_deref())
                .and_then(|l| l.parse::<crate::Lsn>().ok())
                .map_or(0, |l| l.0 as i64),
        );
        let last = self.last_feedback_ms.load(Ordering::Relaxed);
        self.seconds_since_feedback.set(if last == 0 {
            -1.0
        } else {
            unix_ms().saturating_sub(last) as f64 / 1000.0
        });
        self.dead_letters_open.set(s.dead_letters_open);
        self.processed_message_rows.set(s.processed_message_rows);
        let rows: i64 = target
            .query_one(
                "select greatest(reltuples, 0)::int8 from pg_class \
                 where oid = to_regclass($1)",
                &[&format!("{}.event_log", q(schema))],
            )
            .await
            .map_err(StoreError::db("estimating event_log"))?
            .get(0);
        self.event_log_rows.set(rows);
        Ok(())
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
