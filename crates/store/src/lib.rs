//! walfold's durable state in the target database: the event log, dedup claims,
//! checkpoints and dead letters, plus the retry rule every component shares
//! ([`Backoff`]). Connecting, TLS, rows and SQLSTATEs are `walfold-pg`'s; what the rows
//! mean (events, positions, reasons) is `walfold-event`.
//! A projector partition reaches its state through one bound store
//! ([`SubscriberStore`], `subscriber/`): claims, versions, parks and the checkpoint.
//! Operators (status, events, dead letters, phantoms, rebuilds, pruning) go through
//! one handle, [`Operator`], with the types it reads in [`operator`].

mod aggregate_version;
mod backoff;
mod checkpoint;
mod claim;
mod dead_letter;
pub mod definition;
mod error;
mod event_log;
mod event_trail;
mod failover;
mod ingest_position;
pub mod instance;
mod jsonb;
mod large_payload;
mod leader;
mod lock_wait;
mod log_order;
mod migrate;
pub mod operator;
mod pause;
mod phantom;
mod prune;
pub mod rebuild;
mod refusal;
mod registry;
mod schema;
mod status;
mod stream_stage;
mod subscriber;
mod target_lease;
pub mod target_shape;
pub mod wait;
pub mod work_unit;

pub use aggregate_version::ran_without_versions;
pub use backoff::Backoff;
pub use checkpoint::{Checkpoints, PartitionStats};
pub use dead_letter::{DeadLetters, Gap, RetryItem};
pub use error::StoreError;
pub use event_log::{event_rate, latest_types};
pub use event_log::{read_page, read_sql, AppendOutcome, EventLog, Filter, IngestCounts, Page};
pub use failover::{failover_summary, Failover, FailoverSummary};
pub use ingest_position::{
    ingested_rows, ingested_slots, ingested_through, read_through, IngestedSlot,
};
pub use leader::{leader_row, older_release_leader, Attempt, Fence, LeaderRow, Leadership};
pub use lock_wait::lock_waits;
pub use log_order::{head, LogOrder};
pub use migrate::{migrate, schema_access, schema_current, SchemaAccess};
pub use operator::Operator;
pub use pause::{clear_pauses, record_ingest_pause, record_ingest_stop};
pub use prune::register_target;
pub use rebuild::{Rebuild, RebuildState};
pub use refusal::{OpenState, Refusal};
pub use registry::{active_projections, active_subscriber};
pub use schema::Schema;
pub use status::server_time;
pub use stream_stage::{StagedChange, StagedRow, StreamCommit, StreamOutcome};
#[cfg(any(test, feature = "memory"))]
pub use subscriber::memory;
pub use subscriber::{
    PgSubscriber, PgSubscriberTx, Prepared, Subscriber, SubscriberStore, SubscriberTx,
};
pub use target_lease::TargetLease;
