//! walfold's replication source: prepares the slot and publication, reads pgoutput,
//! maps outbox inserts to events and appends them to the event log, acknowledging the
//! slot only up to what is durable.

mod appender;
mod backfill;
mod budget;
mod decode_only;
mod error;
mod feedback;
mod ha;
mod horizon;
mod ingest;
mod outbox;
mod phantoms;
mod reader;
mod setup;
mod slot_holder;
mod timeline;
mod wire;
mod writers;

pub use backfill::{backfill, BackfillReport};
pub use decode_only::{decode_only, DecodeStats};
pub use error::{Refusal, SourceError};
pub use ingest::run_ingest;
pub use outbox::{Mapped, Mapping, TxContext};
pub use reader::{replication_config, Item};
pub use setup::{create_publication, database_identity, inspect, prepare_source, SourceShape};
pub use writers::{definers, emit_grants, emitters, inserters, Definer, EmitGrants, Writers};
