//! Pure, panic-free decoder for PostgreSQL's `pgoutput` logical replication protocol (v1 and v2).
//!
//! [`decode`] turns the payload of one XLogData into a [`Message`] that borrows
//! from the input where it can; [`parse_text`] turns a text-format column value
//! into a typed [`Value`] given the column's type OID (see [`oid`]).
//!
//! No I/O, no dependencies. Malformed input of any kind yields a
//! [`DecodeError`] or [`ValueError`], never a panic.

mod cursor;
mod decode;
mod error;
mod message;
mod timestamp;
mod tuple;
mod value;

pub use decode::{decode, decode_insert, decode_message_head, decode_tuple};
pub use error::{DecodeError, ValueError};
pub use message::{
    Begin, Column, Commit, Delete, Insert, InsertAt, LogicalMessage, Message, MessageHead, Origin,
    Relation, RelationColumn, StreamAbort, StreamCommit, StreamStart, Truncate, Tuple, TypeMessage,
    Update,
};
pub use timestamp::parse_time;
pub use value::{oid, parse_text, Value};
