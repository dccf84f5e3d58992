//! walfold's durable state in the target database: the event log, dedup claims,
//! checkpoints and dead letters, plus the connection and retry rules every component shares.

mod checkpoint;
mod claim;
mod connect;
mod dead_letter;
mod error;
mod event;
mod event_log;
pub mod failpoint;
mod leader;
mod lsn;
pub mod metrics;
mod migrate;
mod prune;
pub mod rebuild;
mod registry;
mod retry;
mod status;
mod tls;

pub use checkpoint::{Checkpoints, PartitionStats};
pub use claim::{claim, claim_sql};
pub use connect::{connect, ConnectOptions, SslMode};
pub use dead_letter::{DeadLetter, DeadLetterEntry, DeadLetters, Reason, RetryItem, RetryRequest};
pub use error::{describe, StoreError};
pub use event::{partition_hash, Event, NewEvent};
pub use event_log::{
    head, read_events, read_page, read_sql, AppendOutcome, EventLog, Filter, IngestCounts, Page,
};
pub use leader::{still_leads, Leadership};
pub use lsn::Lsn;
pub use migrate::migrate;
pub use prune::{prune, PrunePolicy, Pruned};
pub use rebuild::Rebuild;
pub use registry::{active_subscriber, active_subscribers};
pub use retry::{directive, directive_for_code, Directive};
pub use status::{status, IngestStatus, RebuildStatus, SlotStatus, Status, SubscriberStatus};

/// Quotes an identifier (the configured schema) for SQL.
pub(crate) fn q(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
