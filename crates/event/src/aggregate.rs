//! An aggregate's identity: its type and ID, the unit of ordering, parking and
//! partitioning.

use std::fmt;

use crate::event::{partition_hash, Event};

/// An aggregate: what its events are ordered, versioned and parked by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Aggregate {
    /// `aggregate_type` of its events.
    pub kind: String,
    /// `aggregate_id` of its events.
    pub id: String,
}

impl Aggregate {
    pub fn new(kind: impl Into<String>, id: impl Into<String>) -> Aggregate {
        Aggregate {
            kind: kind.into(),
            id: id.into(),
        }
    }

    /// The aggregate `event` belongs to.
    pub fn of(event: &Event) -> Aggregate {
        Aggregate::new(&event.aggregate_type, &event.aggregate_id)
    }

    /// Whether `event` belongs to this aggregate (no allocation).
    pub fn has(&self, event: &Event) -> bool {
        self.kind == event.aggregate_type && self.id == event.aggregate_id
    }

    /// The partition hash of this aggregate ([`partition_hash`]).
    pub fn partition_hash(&self) -> i32 {
        partition_hash(&self.kind, &self.id)
    }
}

impl fmt::Display for Aggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.id)
    }
}
