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
    /// The producer's own value when it is no UUID (text, a number, a composite as a
    /// JSON array of its parts' texts): `id` is derived from it ([`producer_event_id`]).
    pub producer_id: Option<String>,
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
    /// replay), the row's index among that record's rows (a COPY writes several rows per
    /// record, heap multi-insert; every other insert one), and the event's index among
    /// the row's (an `[[outbox]] expand` makes one per element; else 0).
    Wal { lsn: Lsn, index: i32, element: i32 },
    /// Read by `walfold backfill`: a digest of the table and the row's values, the same
    /// when the same row is backfilled again (an expanded row's elements: a digest of it
    /// and the element's index, [`RowOrigin::element`]).
    Backfill { digest: Uuid },
}

impl RowOrigin {
    /// Where element `n` of an expanded row was read: distinct per element, the same on
    /// every replay or backfill of the row.
    pub fn element(self, n: usize) -> RowOrigin {
        match self {
            RowOrigin::Wal { lsn, index, .. } => RowOrigin::Wal {
                lsn,
                index,
                element: i32::try_from(n).unwrap_or(i32::MAX),
            },
            RowOrigin::Backfill { digest } => RowOrigin::Backfill {
                digest: Uuid::new_v5(&digest, n.to_string().as_bytes()),
            },
        }
    }
}

/// The namespace of event IDs derived from producers' values that are no UUIDs
/// (UUIDv5). Fixed forever: changing it would give every such event a new ID, so a
/// redelivered row would no longer be recognised as a duplicate.
pub const PRODUCER_ID_NAMESPACE: Uuid = Uuid::from_u128(0x9615d4e4_c104_4e2a_9b91_d7841be89d67);

/// The event ID of a producer's value that is no UUID: UUIDv5, under
/// [`PRODUCER_ID_NAMESPACE`], of the JSON array of the outbox's scope and the value's
/// parts (`["public.tickets","42"]`; a composite has several parts). The same value of
/// one outbox always gives the same ID; two different values, or one value of two
/// outboxes (two tables that both number rows from 1), never give one (within UUIDv5's
/// collision bound, about 2^-61 per pair).
pub fn producer_event_id(scope: &str, parts: &[&str]) -> Uuid {
    let mut all = Vec::with_capacity(parts.len() + 1);
    all.push(Value::String(scope.to_owned()));
    all.extend(parts.iter().map(|p| Value::String((*p).to_owned())));
    Uuid::new_v5(
        &PRODUCER_ID_NAMESPACE,
        Value::Array(all).to_string().as_bytes(),
    )
}

impl NewEvent {
    /// The event as JSON, as a dead letter keeps it.
    pub fn to_json(&self) -> Value {
        json!({
            "event_id": self.id,
            "producer_id": self.producer_id,
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
    /// The seq its dedup claims carry: `seq`, or for an event delivered again after
    /// pruning deleted it, the seq of its first delivery (see `walfold_store::claim`).
    pub claim_seq: i64,
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

    #[test]
    fn a_producer_value_gives_one_stable_event_id() {
        use super::{producer_event_id, RowOrigin};
        // Pinned: changing the namespace or the rule would un-dedup every such event.
        let id = |scope, parts: &[&str]| producer_event_id(scope, parts);
        assert_eq!(
            id("public.t", &["4b81771282e2cebe-db34f0492c9853ef"]),
            id("public.t", &["4b81771282e2cebe-db34f0492c9853ef"])
        );
        assert_eq!(
            id("public.tickets", &["42"]).to_string(),
            "fd02f0dc-36a0-5639-b0dc-213828ca78ff",
            "as uuid_generate_v5(namespace, '[\"public.tickets\",\"42\"]') (uuid-ossp) gives it"
        );
        assert_ne!(id("public.t", &["42"]), id("public.t", &["42 "]));
        assert_ne!(id("public.tickets", &["1"]), id("public.parcels", &["1"]));
        assert_ne!(
            id("public.t", &["a", "b"]),
            id("public.t", &[r#"["a","b"]"#])
        );
        assert_ne!(id("public.t", &["a", "b"]), id("public.t", &["a,b"]));
        assert_eq!(id("public.t", &["42"]).get_version_num(), 5);
        let digest = uuid::Uuid::nil();
        let b = RowOrigin::Backfill { digest };
        assert_ne!(b.element(0), b.element(1));
        assert_eq!(b.element(1), b.element(1));
    }
}
