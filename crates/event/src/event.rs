//! The event: what an outbox row becomes, with the producer's ID.

use std::time::SystemTime;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::json_text::JsonText;
use crate::lsn::Lsn;

/// An event read from an outbox row, before it is in the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The producer's ID: the unit of deduplication.
    pub id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub version: Option<i64>,
    /// As written: a payload may be megabytes, read in parts ([`JsonText::pointer`]).
    pub payload: JsonText,
    pub headers: Option<JsonText>,
    pub occurred_at: Option<SystemTime>,
    /// Commit LSN of the source transaction.
    pub source_lsn: Lsn,
    /// Where the row was read; identifies a rejected row across replays.
    pub origin: Option<RowOrigin>,
    /// Commit time of the source transaction.
    pub committed_at: Option<SystemTime>,
}

/// Where an outbox row was read: what identifies a row rejected at ingest, so it is
/// recorded once however often it is read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrigin {
    /// Streamed from the slot: the LSN of the change's own WAL record (the same on every
    /// replay), and the row's index among that record's rows: a COPY writes several rows
    /// per record (heap multi-insert), every other insert one.
    Wal { lsn: Lsn, index: i32 },
    /// Read by `walfold backfill`: a digest of the table and the row's values, the same
    /// when the same row is backfilled again.
    Backfill { digest: Uuid },
}

impl NewEvent {
    /// The event as JSON, as a dead letter keeps it.
    pub fn to_json(&self) -> Value {
        json!({
            "event_id": self.id,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "event_type": self.event_type,
            "version": self.version,
            "payload": self.payload.to_value(),
            "headers": self.headers.as_ref().map(JsonText::to_value),
            "source_lsn": self.source_lsn.to_string(),
        })
    }
}

/// An event in the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in the event log (commit order).
    pub seq: i64,
    pub id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub version: Option<i64>,
    /// As written: a payload may be megabytes, read in parts ([`JsonText::pointer`]).
    pub payload: JsonText,
    pub headers: Option<JsonText>,
    pub occurred_at: Option<SystemTime>,
    pub source_lsn: Lsn,
    pub committed_at: Option<SystemTime>,
    /// The name of the `[[source]]` it came from.
    pub source: String,
}

/// The hash that assigns an aggregate to a projector partition (FNV-1a, stable across
/// versions and platforms; stored with the event, so it must never change).
pub fn partition_hash(aggregate_type: &str, aggregate_id: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in aggregate_type
        .bytes()
        .chain(std::iter::once(0))
        .chain(aggregate_id.bytes())
    {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h & 0x7fff_ffff) as i32
}

#[cfg(test)]
mod tests {
    use super::partition_hash;

    #[test]
    fn partition_hash_is_stable_and_non_negative() {
        assert_eq!(partition_hash("order", "1"), partition_hash("order", "1"));
        assert_ne!(partition_hash("order", "1"), partition_hash("order1", ""));
        // Pinned: changing the function would reassign aggregates between partitions.
        assert_eq!(partition_hash("order", "42"), 1_554_754_035);
        assert!(partition_hash("x", "y") >= 0);
    }
}
