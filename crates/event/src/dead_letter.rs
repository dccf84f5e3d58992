//! Dead letters: what was set aside, and why. The table that keeps them is in
//! `walfold-store`.

use serde_json::Value;
use uuid::Uuid;

use crate::event::{NewEvent, RowOrigin};
use crate::lsn::Lsn;

crate::stored_enum! {
    /// Where a dead letter is: the `dead_letter.status` column, whose check constraint
    /// allows exactly these.
    pub enum DeadLetterStatus {
        /// Set aside; waits for an operator (retry or discard).
        Open = "open",
        /// A retry was requested; its subscriber's projector applies it.
        Retrying = "retrying",
        /// Went through on a retry (or its gap closed).
        Retried = "retried",
        /// An operator (or a rebuild replacing its subscriber) gave up on it.
        Discarded = "discarded",
        /// A strict projection's event held for a missing version: not open yet.
        Waiting = "waiting",
    }
}

impl DeadLetterStatus {
    /// Open or retrying: what holds a rebuild's switch-over, and an aggregate's chain.
    pub const OPEN_OR_RETRYING: &'static [DeadLetterStatus] =
        &[DeadLetterStatus::Open, DeadLetterStatus::Retrying];
    /// Not resolved yet: open, retrying, or waiting for a missing version.
    pub const UNRESOLVED: &'static [DeadLetterStatus] = &[
        DeadLetterStatus::Open,
        DeadLetterStatus::Retrying,
        DeadLetterStatus::Waiting,
    ];
}

crate::stored_enum! {
    /// Why something was set aside: the `dead_letter.reason` column, whose check
    /// constraint allows exactly these.
    pub enum Reason {
        /// An outbox row that cannot become an event (bad ID, missing column, bad version).
        Malformed = "malformed",
        /// An event ID already in the log with different content.
        IdConflict = "id_conflict",
        /// A projection kept failing on the event.
        ProjectionFailed = "projection_failed",
        /// The event's aggregate is parked for the subscriber behind an earlier failure.
        AggregateParked = "aggregate_parked",
        /// A strict projection's event waiting for a missing version (status `waiting`),
        /// or, once the gap has outlived `gap_timeout`, the gap itself (no event; `open`).
        VersionGap = "version_gap",
        /// A strict projection's event whose version its aggregate had passed, under an
        /// event ID never applied: not applied.
        VersionConflict = "version_conflict",
        /// An outbox row or message over `pipeline.max_event_bytes`: kept without its
        /// large values.
        TooLarge = "too_large",
    }
}

impl Reason {
    /// The status a new dead letter starts in: an event waiting for a missing version is
    /// not an open dead letter (nothing to act on yet); everything else is.
    pub fn initial_status(self, has_event: bool) -> DeadLetterStatus {
        match (self, has_event) {
            (Reason::VersionGap, true) => DeadLetterStatus::Waiting,
            _ => DeadLetterStatus::Open,
        }
    }
}

/// One dead-letter entry to record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// `None` for rows rejected at ingest.
    pub subscriber_id: Option<String>,
    pub event_id: Option<Uuid>,
    pub seq: Option<i64>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub reason: Reason,
    pub error: String,
    /// The raw outbox row or the event, as JSON.
    pub raw: Option<Value>,
    /// For `id_conflict`: the event already in the log.
    pub existing: Option<Value>,
    pub attempts: i32,
    /// The commit LSN of the source transaction.
    pub source_lsn: Option<Lsn>,
    /// For a row rejected at ingest: where it was read (`None`: recorded every time).
    pub origin: Option<RowOrigin>,
}

impl DeadLetter {
    /// An event set aside at ingest, identified by its place in the source WAL.
    pub fn ingest(event: &NewEvent, reason: Reason, error: String) -> Self {
        DeadLetter {
            subscriber_id: None,
            event_id: Some(event.id),
            seq: None,
            aggregate_type: Some(event.aggregate_type.clone()),
            aggregate_id: Some(event.aggregate_id.clone()),
            reason,
            error,
            raw: Some(event.to_json()),
            existing: None,
            attempts: 1,
            source_lsn: Some(event.source_lsn),
            origin: event.origin,
        }
    }

    /// An event the event log refused (a value PostgreSQL cannot store).
    pub fn refused(event: &NewEvent, error: &str) -> DeadLetter {
        Self::ingest(
            event,
            Reason::Malformed,
            format!("the event log refused the event: {error}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{DeadLetterStatus, Reason};
    use crate::stored_enum::assert_round_trips;

    #[test]
    fn every_status_and_reason_round_trips() {
        assert_round_trips(DeadLetterStatus::ALL, DeadLetterStatus::as_str);
        assert_round_trips(Reason::ALL, Reason::as_str);
    }
}
