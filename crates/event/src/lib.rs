//! What walfold is about, free of any table: the event and its identity, WAL positions,
//! the partition hash, why something is set aside (dead letters), and whose fault an
//! error is. Every other crate depends on this one; it depends on none of them.

mod dead_letter;
mod event;
mod kind;
mod lsn;
mod stored_enum;

pub use dead_letter::{DeadLetter, DeadLetterStatus, Reason};
pub use event::{partition_hash, Event, NewEvent, RowOrigin};
pub use kind::{is_resource_code, kind_for_code, unreachable_target, ErrorKind};
pub use lsn::Lsn;
pub use stored_enum::{assert_round_trips, UnknownValue};

/// What [`stored_enum!`] expands to needs, whichever crate invokes it.
#[doc(hidden)]
pub mod __private {
    pub use postgres_types;
    pub use serde;
}
