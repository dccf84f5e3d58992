//! walfold's replication source: prepares the slot and publication, reads pgoutput,
//! maps outbox inserts to events and appends them to the event log, acknowledging the
//! slot only up to what is durable.

mod appender;
mod backfill;
mod budget;
mod decode_only;
mod error;
mod feedback;
mod field_columns;
mod ha;
mod horizon;
mod ingest;
mod outbox;
mod phantoms;
mod reader;
mod sample;
mod setup;
pub mod shape;
mod slot_holder;
mod timeline;
mod verdict;
mod wal_watch;
mod wire;
mod writers;

pub use backfill::{backfill, BackfillReport};
pub use decode_only::{decode_only, DecodeStats};
pub use error::{Refusal, SourceError};
pub use ingest::run_ingest;
pub use outbox::{Mapped, Mapping, TxContext};
pub use reader::{replication_config, Item};
pub use sample::{sample_events, PayloadKind, Sampled};
pub use setup::{inspect, judge, prepare_source};
pub use verdict::Verdict;
pub use writers::{definers, emit_grants, emitters, inserters, Definer, EmitGrants, Writers};
