//! What the process reports as it works: one typed [`Signal`] per thing that happens,
//! whose [`Signal::report`] moves the metrics it affects and writes its log line, so a
//! count and the line that explains it are decided in one place and cannot drift apart.
//!
//! Each log line names its `target`: the module that reports the signal (the module
//! that wrote the line before signals existed). Without it every line would come from
//! `walfold_telemetry::signal`, and operators filter on the module
//! (`level = "walfold_engine=debug"`).
//!
//! A signal does the same every time it is reported; when to report it (once per cause,
//! only when not paused yet) is decided by the code that knows that state. Where the
//! line and the count happen at different moments (a pause is logged, then recorded in
//! the database, then counted), they are separate signals.

use std::fmt::Display;
use std::time::Duration;

use crate::metrics::{metrics, Attempt, Metrics};

/// Log targets: the modules that report signals.
const PROJECTOR: &str = "walfold_engine::projector";
const PIPELINE: &str = "walfold_engine::pipeline";
const INGEST: &str = "walfold_source::ingest";
const APPENDER: &str = "walfold_source::appender";

/// Something that happened, with what the metrics and the log need to know about it.
pub enum Signal<'a> {
    // Projectors (walfold_engine::projector).
    /// An attempt at applying an event failed on the event's data; it is tried again.
    ApplyRetrying {
        subscriber: &'a str,
        event_id: &'a dyn Display,
        aggregate_id: &'a dyn Display,
        attempt: u32,
        error: &'a dyn Display,
    },
    /// An event failed on its data for the last time: it is dead-lettered and its
    /// aggregate parked (the dead letter is counted by the commit that writes it).
    ApplyFailed {
        subscriber: &'a str,
        event_id: &'a dyn Display,
        aggregate_id: &'a dyn Display,
        attempts: u32,
        error: &'a dyn Display,
    },
    /// An aggregate's dead letters that an operator asked to retry all applied: the
    /// aggregate is released. One attempt after a failure.
    RetryApplied {
        subscriber: &'a str,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        events: usize,
    },
    /// An operator's retry of an aggregate's dead letters failed again at `dead_letter`:
    /// the aggregate stays parked. One failed attempt after a failure.
    RetryFailedAgain {
        subscriber: &'a str,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        dead_letter: i64,
        error: &'a dyn Display,
    },
    /// A projector transaction committed: what it did, and how long it took from its
    /// start. One with no events (an idle checkpoint) is not a batch: only its counters
    /// are added.
    Committed {
        subscriber: &'a str,
        applied: u64,
        stale: u64,
        duplicates: u64,
        dead_lettered: u64,
        events: usize,
        took: Duration,
    },
    /// A projector took a page of the event log: read from the database, or `shared`
    /// by another partition that had just read it.
    PageRead { shared: bool },
    /// A partition of `subscriber` started: its paused gauge and its counters exist from
    /// then on, at 0 until something happens (a dashboard shows 0, not "no data").
    PartitionStarted { subscriber: &'a str },
    /// A partition of `subscriber` paused on an environment error (once per pause, not
    /// per retry).
    PartitionPaused { subscriber: &'a str },
    /// Why a partition is paused: on its first error, and whenever the cause changes.
    PartitionPauseCause {
        subscriber: &'a str,
        projection: &'a str,
        partition: u32,
        sqlstate: &'a str,
        error: &'a dyn Display,
    },
    /// A paused partition committed again.
    PartitionResumed { subscriber: &'a str, partition: u32 },
    /// A paused partition stopped (shutdown, a new generation) before it resumed: it
    /// no longer counts as paused.
    PausedPartitionStopped { subscriber: &'a str },

    // The pipeline (walfold_engine::pipeline).
    /// This instance took leadership.
    LeadershipTaken,
    /// This instance stopped leading: lost, shut down, or stopped by an error.
    LeadershipEnded,
    /// How many work units this instance owns, and how many no live instance does.
    WorkUnits { owned: usize, unowned: usize },
    /// An extra target became unreachable: each of its `subscribers` counts as paused.
    TargetPaused { subscribers: &'a [String] },
    /// Why a target is unreachable: when it goes down, and whenever the cause changes.
    TargetPauseCause {
        target: &'a str,
        subscribers: &'a [String],
        error: &'a dyn Display,
    },
    /// An unreachable target works again: its `subscribers` resume.
    TargetResumed {
        target: &'a str,
        subscribers: &'a [String],
    },

    // Ingest (walfold_source).
    /// The running check of who may write a source's message outboxes' events: `public`
    /// while `pg_logical_emit_message` is executable by PUBLIC (reported every check;
    /// logged when it changes), with what to do.
    PublicEmit {
        source: &'a str,
        public: Option<&'a dyn Display>,
    },
    /// A source's ingest waits out an environment error (reported on every retry).
    IngestPaused { source: &'a str },
    /// Why a source's ingest is paused: on the first error, and whenever the cause
    /// changes.
    IngestPauseCause {
        source: &'a str,
        slot: &'a str,
        error: &'a dyn Display,
    },
    /// A source's ingest stopped on a definite error (its slot lost, its publication
    /// dropped): that source only; the other sources, and every projection, go on.
    IngestStopped {
        source: &'a str,
        slot: &'a str,
        error: &'a dyn Display,
    },
    /// A flush of the source's appender succeeded: whatever paused its ingest is over
    /// (reported after every flush; nothing changes when it was not paused).
    IngestResumed { source: &'a str },
    /// What one append of a source did.
    Appended {
        source: &'a str,
        read: u64,
        appended: u64,
        duplicates: u64,
        id_conflicts: u64,
        malformed: u64,
    },
    /// The event log refused an event for its values: it is dead-lettered and counted
    /// as malformed (its batch's [`Signal::Appended`] counts it as read).
    EventRefused {
        source: &'a str,
        event_id: &'a dyn Display,
        error: &'a dyn Display,
    },
    /// A standby status update that advanced the position was sent for a source.
    FeedbackSent { source: &'a str },
}

impl Signal<'_> {
    /// Moves the process's metrics and writes the log line, if the signal has one.
    pub fn report(self) {
        self.report_to(metrics());
    }

    fn report_to(self, m: &Metrics) {
        match self {
            Signal::ApplyRetrying {
                subscriber,
                event_id,
                aggregate_id,
                attempt,
                error,
            } => {
                m.attempt(subscriber, Attempt::FailedRetrying);
                tracing::warn!(target: PROJECTOR, subscriber = %subscriber, event_id = %event_id, aggregate_id = %aggregate_id, attempt, error = %error, "projection failed on the event's data, retrying");
            }
            Signal::RetryApplied {
                subscriber,
                aggregate_type,
                aggregate_id,
                events,
            } => {
                m.attempt(subscriber, Attempt::RetryApplied);
                tracing::info!(target: PROJECTOR, subscriber = %subscriber, aggregate_type = %aggregate_type, aggregate_id = %aggregate_id, events, "dead letters retried; aggregate released");
            }
            Signal::RetryFailedAgain {
                subscriber,
                aggregate_type,
                aggregate_id,
                dead_letter,
                error,
            } => {
                m.attempt(subscriber, Attempt::RetryFailed);
                tracing::error!(target: PROJECTOR, subscriber = %subscriber, aggregate_type = %aggregate_type, aggregate_id = %aggregate_id, dead_letter, error = %error, "retry failed again; the aggregate stays parked");
            }
            Signal::ApplyFailed {
                subscriber,
                event_id,
                aggregate_id,
                attempts,
                error,
            } => {
                m.attempt(subscriber, Attempt::FailedForGood);
                tracing::error!(target: PROJECTOR, subscriber = %subscriber, event_id = %event_id, aggregate_id = %aggregate_id, attempts, error = %error, "projection failed for good: event dead-lettered, aggregate parked");
            }
            Signal::Committed {
                subscriber,
                applied,
                stale,
                duplicates,
                dead_lettered,
                events,
                took,
            } => {
                let label = Metrics::subscriber(subscriber);
                m.applied.get_or_create(&label).inc_by(applied);
                m.stale.get_or_create(&label).inc_by(stale);
                m.claim_duplicates.get_or_create(&label).inc_by(duplicates);
                m.dead_letters.get_or_create(&label).inc_by(dead_lettered);
                if events > 0 {
                    m.batch(subscriber, events, took);
                }
            }
            Signal::PageRead { shared } => {
                if shared {
                    m.log_pages_shared.inc();
                } else {
                    m.log_pages_read.inc();
                }
            }
            Signal::PartitionStarted { subscriber } => m.show_subscriber(subscriber),
            Signal::PartitionPaused { subscriber } => m.set_paused(subscriber, true),
            Signal::PartitionPauseCause {
                subscriber,
                projection,
                partition,
                sqlstate,
                error,
            } => {
                tracing::error!(target: PROJECTOR, subscriber = %subscriber, projection = %projection, partition, sqlstate, error = %error, "projection paused: the target or the config is wrong; nothing is dead-lettered for it, and it resumes by itself once fixed");
            }
            Signal::PartitionResumed {
                subscriber,
                partition,
            } => {
                m.set_paused(subscriber, false);
                tracing::info!(target: PROJECTOR, subscriber = %subscriber, partition, "projection resumed");
            }
            Signal::PausedPartitionStopped { subscriber } => m.set_paused(subscriber, false),
            Signal::LeadershipTaken => m.set_leader(true),
            Signal::LeadershipEnded => m.set_leader(false),
            Signal::WorkUnits { owned, unowned } => m.set_units(owned, unowned),
            Signal::TargetPaused { subscribers } => {
                for s in subscribers {
                    m.set_paused(s, true);
                }
            }
            Signal::TargetPauseCause {
                target,
                subscribers,
                error,
            } => {
                m.hold(format!("target {target}"), Some(error.to_string()));
                tracing::error!(target: PIPELINE, target = %target, subscribers = ?subscribers, error = %error, "target unreachable or refusing: its projections are paused; the others go on, and these resume by themselves once it works again");
            }
            Signal::TargetResumed {
                target,
                subscribers,
            } => {
                for s in subscribers {
                    m.set_paused(s, false);
                }
                m.hold(format!("target {target}"), None);
                tracing::info!(target: PIPELINE, target = %target, "target reachable again; its projections resume");
            }
            Signal::PublicEmit { source, public } => {
                let was = m.set_public_emit(source, public.is_some());
                match public {
                    Some(problem) if !was => {
                        tracing::warn!(target: INGEST, source = %source, problem = %problem, "any role may now write events into a message outbox of this source (granted since the start, which refuses it): lock pg_logical_emit_message down again; a restart refuses to read it until then");
                    }
                    None if was => {
                        tracing::info!(target: INGEST, source = %source, "pg_logical_emit_message is no longer executable by PUBLIC");
                    }
                    _ => {}
                }
            }
            Signal::IngestPaused { source } => m.set_ingest_paused(source, true),
            Signal::IngestPauseCause {
                source,
                slot,
                error,
            } => {
                tracing::error!(target: INGEST, error = %error, source = %source, slot = %slot, "ingest paused: the environment is wrong (fix it; walfold retries by itself)");
            }
            Signal::IngestResumed { source } => m.set_ingest_paused(source, false),
            Signal::IngestStopped {
                source,
                slot,
                error,
            } => {
                m.set_ingest_stopped(source, error.to_string());
                tracing::error!(target: INGEST, error = %error, source = %source, slot = %slot, "ingest of this source stopped: a definite error (the fix is in the message); the other sources and the projections go on; restart walfold once it is fixed");
            }
            Signal::Appended {
                source,
                read,
                appended,
                duplicates,
                id_conflicts,
                malformed,
            } => m.appended(source, read, appended, duplicates, id_conflicts, malformed),
            Signal::EventRefused {
                source,
                event_id,
                error,
            } => {
                tracing::warn!(target: APPENDER, event_id = %event_id, error = %error, "event refused by the event log, dead-lettered");
                m.appended(source, 0, 0, 0, 0, 1);
            }
            Signal::FeedbackSent { source } => m.feedback_sent(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use super::*;

    /// Records each log line as `LEVEL target field=value…`.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl Subscriber for Lines {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let meta = event.metadata();
            let mut line = format!("{} {}", meta.level(), meta.target());
            event.record(&mut Fields(&mut line));
            self.0.lock().unwrap().push(line);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    struct Fields<'a>(&'a mut String);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    /// Reports `signals` to fresh metrics; what they render and the lines logged.
    fn report(signals: Vec<Signal<'_>>) -> (Metrics, Vec<String>) {
        let m = Metrics::new();
        let lines = Lines::default();
        tracing::subscriber::with_default(lines.clone(), || {
            for s in signals {
                s.report_to(&m);
            }
        });
        let logged = lines.0.lock().unwrap().clone();
        (m, logged)
    }

    /// The rendered samples (no `#` lines) that start with `prefix`, sorted (a family's
    /// series render in hash order).
    fn samples(m: &Metrics, prefix: &str) -> Vec<String> {
        let mut found: Vec<String> = m
            .render(Ok::<(), String>(()))
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect();
        found.sort();
        found
    }

    #[test]
    fn a_retried_attempt_counts_a_failure_and_a_retry_and_warns_from_the_projector() {
        let (m, lines) = report(vec![Signal::ApplyRetrying {
            subscriber: "s",
            event_id: &"e1",
            aggregate_id: &"a1",
            attempt: 2,
            error: &"boom",
        }]);
        assert_eq!(
            samples(&m, "walfold_projection_"),
            [
                r#"walfold_projection_failures_total{subscriber="s"} 1"#,
                r#"walfold_projection_retries_total{subscriber="s"} 1"#,
            ]
        );
        assert_eq!(
            lines,
            ["WARN walfold_engine::projector message=projection failed on the event's data, retrying subscriber=s event_id=e1 aggregate_id=a1 attempt=2 error=boom"]
        );
    }

    #[test]
    fn a_final_failure_counts_a_failure_but_no_retry() {
        let (m, lines) = report(vec![Signal::ApplyFailed {
            subscriber: "s",
            event_id: &"e1",
            aggregate_id: &"a1",
            attempts: 3,
            error: &"boom",
        }]);
        assert_eq!(
            samples(&m, "walfold_projection_"),
            [r#"walfold_projection_failures_total{subscriber="s"} 1"#]
        );
        assert_eq!(
            lines,
            ["ERROR walfold_engine::projector message=projection failed for good: event dead-lettered, aggregate parked subscriber=s event_id=e1 aggregate_id=a1 attempts=3 error=boom"]
        );
    }

    #[test]
    fn an_operator_retry_is_an_attempt_after_a_failure_and_failing_again_counts_too() {
        let (m, lines) = report(vec![
            Signal::RetryFailedAgain {
                subscriber: "s",
                aggregate_type: "order",
                aggregate_id: "o-1",
                dead_letter: 7,
                error: &"boom",
            },
            Signal::RetryApplied {
                subscriber: "s",
                aggregate_type: "order",
                aggregate_id: "o-1",
                events: 2,
            },
        ]);
        assert_eq!(
            samples(&m, "walfold_projection_"),
            [
                r#"walfold_projection_failures_total{subscriber="s"} 1"#,
                r#"walfold_projection_retries_total{subscriber="s"} 2"#,
            ]
        );
        assert_eq!(
            lines,
            [
                "ERROR walfold_engine::projector message=retry failed again; the aggregate stays parked subscriber=s aggregate_type=order aggregate_id=o-1 dead_letter=7 error=boom",
                "INFO walfold_engine::projector message=dead letters retried; aggregate released subscriber=s aggregate_type=order aggregate_id=o-1 events=2",
            ]
        );
    }

    #[test]
    fn a_commit_adds_its_counters_and_only_a_batch_of_events_is_observed() {
        let committed = |events| Signal::Committed {
            subscriber: "s",
            applied: 2,
            stale: 1,
            duplicates: 3,
            dead_lettered: 4,
            events,
            took: Duration::from_millis(5),
        };
        let (m, lines) = report(vec![committed(0)]);
        assert!(lines.is_empty());
        assert!(samples(&m, "walfold_batch_size_count").is_empty());
        let (m, _) = report(vec![committed(0), committed(6)]);
        for expected in [
            r#"walfold_applied_total{subscriber="s"} 4"#,
            r#"walfold_stale_total{subscriber="s"} 2"#,
            r#"walfold_claim_duplicates_total{subscriber="s"} 6"#,
            r#"walfold_dead_lettered_total{subscriber="s"} 8"#,
            r#"walfold_batch_size_sum{subscriber="s"} 6.0"#,
            r#"walfold_batch_size_count{subscriber="s"} 1"#,
            r#"walfold_apply_seconds_count{subscriber="s"} 1"#,
        ] {
            assert_eq!(samples(&m, expected), [expected]);
        }
    }

    #[test]
    fn pages_count_as_read_or_shared() {
        let (m, lines) = report(vec![
            Signal::PageRead { shared: false },
            Signal::PageRead { shared: true },
            Signal::PageRead { shared: true },
        ]);
        assert!(lines.is_empty());
        assert_eq!(
            samples(&m, "walfold_log_pages_"),
            [
                "walfold_log_pages_read_total 1",
                "walfold_log_pages_shared_total 2"
            ]
        );
    }

    #[test]
    fn a_partition_pause_counts_once_and_its_cause_only_logs() {
        let cause = || Signal::PartitionPauseCause {
            subscriber: "s",
            projection: "p",
            partition: 1,
            sqlstate: "42501",
            error: &"permission denied",
        };
        let (m, lines) = report(vec![cause()]);
        assert!(!m.any_paused());
        assert!(samples(&m, "walfold_projection_paused").is_empty());
        assert_eq!(
            lines,
            ["ERROR walfold_engine::projector message=projection paused: the target or the config is wrong; nothing is dead-lettered for it, and it resumes by itself once fixed subscriber=s projection=p partition=1 sqlstate=\"42501\" error=permission denied"]
        );

        let (m, lines) = report(vec![cause(), Signal::PartitionPaused { subscriber: "s" }]);
        assert!(m.any_paused());
        assert_eq!(
            samples(&m, "walfold_projection_paused"),
            [r#"walfold_projection_paused{subscriber="s"} 1"#]
        );
        assert_eq!(lines.len(), 1);
    }

    #[test]
    fn a_started_partition_shows_its_series_at_0_and_keeps_a_pause() {
        let started = || Signal::PartitionStarted { subscriber: "s" };
        let (m, lines) = report(vec![started()]);
        assert!(lines.is_empty());
        assert!(!m.any_paused());
        assert_eq!(
            samples(&m, "walfold_projection_paused"),
            [r#"walfold_projection_paused{subscriber="s"} 0"#]
        );
        for counter in [
            "applied",
            "claim_duplicates",
            "stale",
            "projection_failures",
            "projection_retries",
            "dead_lettered",
        ] {
            let sample = format!(r#"walfold_{counter}_total{{subscriber="s"}} 0"#);
            assert_eq!(samples(&m, &sample), vec![sample]);
        }
        let (m, _) = report(vec![
            started(),
            Signal::PartitionPaused { subscriber: "s" },
            started(),
        ]);
        assert_eq!(
            samples(&m, "walfold_projection_paused"),
            [r#"walfold_projection_paused{subscriber="s"} 1"#]
        );
    }

    #[test]
    fn a_partition_resumes_with_a_line_and_stops_without_one() {
        let paused = || Signal::PartitionPaused { subscriber: "s" };
        let (m, lines) = report(vec![
            paused(),
            Signal::PartitionResumed {
                subscriber: "s",
                partition: 1,
            },
        ]);
        assert!(!m.any_paused());
        assert_eq!(
            samples(&m, "walfold_projection_paused"),
            [r#"walfold_projection_paused{subscriber="s"} 0"#]
        );
        assert_eq!(
            lines,
            ["INFO walfold_engine::projector message=projection resumed subscriber=s partition=1"]
        );

        let (m, lines) = report(vec![
            paused(),
            Signal::PausedPartitionStopped { subscriber: "s" },
        ]);
        assert!(!m.any_paused());
        assert!(lines.is_empty());
    }

    #[test]
    fn a_target_down_pauses_each_subscriber_and_logs_from_the_pipeline() {
        let subscribers = ["a".to_owned(), "b".to_owned()];
        let (m, lines) = report(vec![
            Signal::TargetPaused {
                subscribers: &subscribers,
            },
            Signal::TargetPauseCause {
                target: "reports",
                subscribers: &subscribers,
                error: &"connection refused",
            },
        ]);
        assert!(m.any_paused());
        assert_eq!(
            samples(&m, "walfold_projection_paused"),
            [
                r#"walfold_projection_paused{subscriber="a"} 1"#,
                r#"walfold_projection_paused{subscriber="b"} 1"#,
            ]
        );
        assert_eq!(
            lines,
            [
                r#"ERROR walfold_engine::pipeline message=target unreachable or refusing: its projections are paused; the others go on, and these resume by themselves once it works again target=reports subscribers=["a", "b"] error=connection refused"#
            ]
        );

        let (m, lines) = report(vec![
            Signal::TargetPaused {
                subscribers: &subscribers,
            },
            Signal::TargetResumed {
                target: "reports",
                subscribers: &subscribers,
            },
        ]);
        assert!(!m.any_paused());
        assert_eq!(
            lines,
            ["INFO walfold_engine::pipeline message=target reachable again; its projections resume target=reports"]
        );
    }

    #[test]
    fn leadership_sets_the_leader_gauge() {
        let (m, _) = report(vec![Signal::LeadershipTaken]);
        assert!(m.is_leader());
        assert_eq!(samples(&m, "walfold_leader"), ["walfold_leader 1"]);
        let (m, lines) = report(vec![Signal::LeadershipTaken, Signal::LeadershipEnded]);
        assert!(!m.is_leader());
        assert!(lines.is_empty());
    }

    #[test]
    fn ingest_pauses_on_every_retry_but_counts_once_and_its_cause_logs_from_ingest() {
        let paused = || Signal::IngestPaused { source: "main" };
        let (m, lines) = report(vec![
            paused(),
            paused(),
            Signal::IngestPauseCause {
                source: "main",
                slot: "walfold",
                error: &"disk full",
            },
        ]);
        assert!(m.any_paused());
        assert_eq!(
            samples(&m, "walfold_ingest_paused"),
            [r#"walfold_ingest_paused{source="main"} 1"#]
        );
        assert_eq!(
            lines,
            ["ERROR walfold_source::ingest message=ingest paused: the environment is wrong (fix it; walfold retries by itself) error=disk full source=main slot=walfold"]
        );

        let (m, _) = report(vec![
            paused(),
            paused(),
            Signal::IngestResumed { source: "main" },
        ]);
        assert!(!m.any_paused());
        assert_eq!(
            samples(&m, "walfold_ingest_paused"),
            [r#"walfold_ingest_paused{source="main"} 0"#]
        );
    }

    #[test]
    fn an_append_counts_and_a_refused_event_counts_as_malformed() {
        let (m, lines) = report(vec![
            Signal::Appended {
                source: "main",
                read: 10,
                appended: 6,
                duplicates: 2,
                id_conflicts: 1,
                malformed: 1,
            },
            Signal::EventRefused {
                source: "main",
                event_id: &"e1",
                error: &"value too long",
            },
        ]);
        for expected in [
            r#"walfold_events_read_total{source="main"} 10"#,
            r#"walfold_events_appended_total{source="main"} 6"#,
            r#"walfold_event_log_duplicates_total{source="main"} 2"#,
            r#"walfold_id_conflicts_total{source="main"} 1"#,
            r#"walfold_malformed_total{source="main"} 2"#,
        ] {
            assert_eq!(samples(&m, expected), [expected]);
        }
        assert_eq!(
            lines,
            ["WARN walfold_source::appender message=event refused by the event log, dead-lettered event_id=e1 error=value too long"]
        );
    }

    #[test]
    fn definitions_and_their_rebuilds_are_gauges() {
        let sub = |name: &str, projection: &str, digest: &str, version| {
            crate::metrics::SubscriberReading {
                subscriber: name.into(),
                lag: None,
                parked_aggregates: 0,
                folded: Vec::new(),
                definition: Some(crate::metrics::DefinitionReading {
                    projection: projection.into(),
                    digest: digest.into(),
                    version,
                }),
            }
        };
        let (m, _) = report(vec![]);
        m.set_database(&crate::metrics::DatabaseReading {
            subscribers: vec![
                sub("t.v1", "total", "aaaa", None),
                sub("t.v1~def2", "total", "bbbb", None),
                sub("r.v1", "rust", "cccc", Some(3)),
            ],
            rebuilding_for_definition: vec!["total".into()],
            ..Default::default()
        });
        let mut info = samples(&m, "walfold_projection_definition_info");
        info.sort();
        assert_eq!(
            info,
            [
                r#"walfold_projection_definition_info{projection="rust",subscriber="r.v1",digest="cccc",version="3"} 1"#,
                r#"walfold_projection_definition_info{projection="total",subscriber="t.v1",digest="aaaa",version=""} 1"#,
                r#"walfold_projection_definition_info{projection="total",subscriber="t.v1~def2",digest="bbbb",version=""} 1"#,
            ]
        );
        let mut rebuilding = samples(&m, "walfold_projection_definition_rebuilding");
        rebuilding.sort();
        assert_eq!(
            rebuilding,
            [
                r#"walfold_projection_definition_rebuilding{projection="rust"} 0"#,
                r#"walfold_projection_definition_rebuilding{projection="total"} 1"#,
            ]
        );
        // The switch-over retires the old subscriber and ends the rebuild.
        m.set_database(&crate::metrics::DatabaseReading {
            subscribers: vec![sub("t.v1~def2", "total", "bbbb", None)],
            ..Default::default()
        });
        assert_eq!(
            samples(&m, "walfold_projection_definition_rebuilding"),
            [r#"walfold_projection_definition_rebuilding{projection="total"} 0"#]
        );
        assert_eq!(samples(&m, "walfold_projection_definition_info").len(), 1);
    }

    #[test]
    fn a_rebuilds_progress_is_in_positions_and_goes_with_it() {
        let (m, _) = report(vec![]);
        let reading = |remaining| crate::metrics::DatabaseReading {
            rebuilds: vec![crate::metrics::RebuildReading {
                projection: "total".into(),
                subscriber: "t.v2".into(),
                read: 4000 - remaining,
                remaining,
            }],
            ..Default::default()
        };
        m.set_database(&reading(3000));
        assert_eq!(
            samples(&m, "walfold_rebuild_remaining_positions"),
            [r#"walfold_rebuild_remaining_positions{projection="total",subscriber="t.v2"} 3000"#]
        );
        assert_eq!(
            samples(&m, "walfold_rebuild_read_positions"),
            [r#"walfold_rebuild_read_positions{projection="total",subscriber="t.v2"} 1000"#]
        );
        m.set_database(&crate::metrics::DatabaseReading::default());
        assert!(samples(&m, "walfold_rebuild_read_positions").is_empty());
    }

    #[test]
    fn feedback_sent_is_the_time_since_feedback() {
        let reading = crate::metrics::DatabaseReading {
            sources: vec![crate::metrics::SourceReading {
                name: "main".into(),
                slot_gaps: 0,
                slot_gaps_open: 0,
                phantoms: 0,
                slot: Some(crate::metrics::SlotReading::default()),
            }],
            ..Default::default()
        };
        let (m, _) = report(vec![]);
        m.set_database(&reading);
        assert_eq!(
            samples(&m, "walfold_seconds_since_feedback"),
            [r#"walfold_seconds_since_feedback{source="main"} -1.0"#]
        );
        let (m, _) = report(vec![Signal::FeedbackSent { source: "main" }]);
        m.set_database(&reading);
        let sample = samples(&m, "walfold_seconds_since_feedback");
        assert!(!sample[0].ends_with(" -1.0"), "{sample:?}");
    }

    #[test]
    fn an_unreachable_source_has_no_fresh_gauges() {
        let reading = |slot| crate::metrics::DatabaseReading {
            sources: vec![crate::metrics::SourceReading {
                name: "main".into(),
                slot_gaps: 0,
                slot_gaps_open: 0,
                phantoms: 0,
                slot,
            }],
            ..Default::default()
        };
        let (m, _) = report(vec![Signal::FeedbackSent { source: "main" }]);
        m.set_database(&reading(Some(crate::metrics::SlotReading {
            active: true,
            retained_bytes: 10,
            ..Default::default()
        })));
        assert_eq!(
            samples(&m, "walfold_slot_active"),
            [r#"walfold_slot_active{source="main"} 1"#]
        );
        assert_eq!(
            samples(&m, "walfold_source_reachable"),
            [r#"walfold_source_reachable{source="main"} 1"#]
        );
        // Feedback keeps being written into the partition: it reaches nobody.
        Signal::FeedbackSent { source: "main" }.report_to(&m);
        m.set_database(&reading(None));
        assert_eq!(
            samples(&m, "walfold_source_reachable"),
            [r#"walfold_source_reachable{source="main"} 0"#]
        );
        assert_eq!(
            samples(&m, "walfold_slot_active"),
            [r#"walfold_slot_active{source="main"} 0"#]
        );
        // Counted from the last scrape that reached the source, not the newest write.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        Signal::FeedbackSent { source: "main" }.report_to(&m);
        m.set_database(&reading(None));
        let age = samples(&m, "walfold_seconds_since_feedback");
        let age: f64 = age[0].rsplit(' ').next().unwrap().parse().unwrap();
        assert!(age >= 1.0, "{age}");
        assert!(samples(&m, "walfold_slot_retained_wal_bytes").is_empty());
    }
}
