//! What walfold is about, free of any table: the event and its identity, WAL positions,
//! the partition hash, why something is set aside (dead letters) or may be missing (slot gaps), and whose fault an
//! error is (by SQLSTATE), with the macro that stores such states as text. Every crate
//! that handles events depends on this one; it depends on no walfold crate.

mod aggregate;
mod dead_letter;
mod event;
pub mod json;
mod json_text;
mod kind;
mod lsn;
mod slot_gap;
mod stored_enum;

pub use aggregate::Aggregate;
pub use dead_letter::{DeadLetter, DeadLetterStatus, Reason};
pub use event::{
    partition_hash, producer_event_id, Event, NewEvent, RowOrigin, PRODUCER_ID_NAMESPACE,
};
pub use json_text::JsonText;
pub use kind::{
    is_insufficient_privilege, is_lock_not_available, is_pooler_startup_refusal, is_resource_code,
    is_undefined_column, is_undefined_object, is_undefined_table, is_unique_violation,
    kind_for_code, unreachable_target, ErrorKind,
};
pub use lsn::Lsn;
pub use slot_gap::GapReason;
#[cfg(any(test, feature = "test-util"))]
pub use stored_enum::assert_round_trips;
pub use stored_enum::UnknownValue;

/// What [`stored_enum!`] expands to needs, whichever crate invokes it.
#[doc(hidden)]
pub mod __private {
    pub use postgres_types;
    pub use serde;
}
