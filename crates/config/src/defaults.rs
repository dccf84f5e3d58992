//! Every default of a config key, in one place: the values the tables of
//! `docs/CONFIGURATION.md` state.

use std::time::Duration;

use crate::duration::Retention;

/// The name of a source that has none (a single `[source]`).
pub const DEFAULT_SOURCE: &str = "default";
pub const DEFAULT_SLOT: &str = "walfold";
pub const DEFAULT_PUBLICATION: &str = "walfold_outbox";
pub const DEFAULT_HEARTBEAT_INTERVAL_S: u64 = 10;
pub const DEFAULT_SCHEMA: &str = "walfold";
/// Connections a target's projectors share, however many projections run.
pub const DEFAULT_POOL_SIZE: usize = 8;
/// An outbox's columns (or JSON keys) default to the names of their keys.
pub const DEFAULT_ID: &str = "id";
pub const DEFAULT_AGGREGATE_TYPE: &str = "aggregate_type";
pub const DEFAULT_AGGREGATE_ID: &str = "aggregate_id";
pub const DEFAULT_EVENT_TYPE: &str = "event_type";
pub const DEFAULT_VERSION: &str = "version";
pub const DEFAULT_PAYLOAD: &str = "payload";
pub const DEFAULT_HEADERS: &str = "headers";
pub const DEFAULT_OCCURRED_AT: &str = "occurred_at";
pub const DEFAULT_APPEND_BATCH_SIZE: usize = 2_000;
pub const DEFAULT_CHANNEL_CAPACITY: usize = 2_000;
pub const DEFAULT_APPEND_LINGER_MS: u64 = 0;
pub const DEFAULT_MAX_BACKOFF_MS: u64 = 30_000;
pub const DEFAULT_SHUTDOWN_TIMEOUT_S: u64 = 30;
pub const DEFAULT_INGEST_BYTES: usize = 8_388_608;
pub const DEFAULT_PAGE_BYTES: usize = 4_194_304;
pub const DEFAULT_MAX_EVENT_BYTES: usize = 67_108_864;
pub const DEFAULT_LOG_LEVEL: &str = "info";
pub const DEFAULT_READY_MAX_LAG_S: u64 = 60;
pub const DEFAULT_READY_MAX_STALL_S: u64 = 60;
pub const DEFAULT_EVENT_LOG_RETENTION: Retention = Retention::Forever;
pub const DEFAULT_PRUNE_INTERVAL_S: u64 = 300;
pub const DEFAULT_PRUNE_BATCH_SIZE: i64 = 5_000;
pub const DEFAULT_DEDUP_RETENTION: Retention = Retention::Forever;
pub const DEFAULT_REBUILD_BATCH_SIZE: usize = 5_000;
pub const DEFAULT_DROP_RETIRED_AFTER: Retention = Retention::Forever;
pub const DEFAULT_PARALLELISM: u32 = 1;
pub const DEFAULT_BATCH_SIZE: usize = 500;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
pub const DEFAULT_RETRY_BACKOFF_MS: u64 = 200;
pub const DEFAULT_FIRST_VERSION: i64 = 1;
pub const DEFAULT_LEASE_S: u64 = 10;
pub const DEFAULT_LEAD: bool = true;
pub const DEFAULT_GAP_TIMEOUT: Retention = Retention::After(Duration::from_secs(10 * 60));

/// serde's `default = "…"` names a function, not a constant: one per constant above.
macro_rules! serde_defaults {
    ($($f:ident -> $t:ty = $c:ident;)*) => {
        $(pub(crate) fn $f() -> $t {
            $c.into()
        })*
    };
}

serde_defaults! {
    source_name -> String = DEFAULT_SOURCE;
    slot -> String = DEFAULT_SLOT;
    publication -> String = DEFAULT_PUBLICATION;
    heartbeat_interval_s -> u64 = DEFAULT_HEARTBEAT_INTERVAL_S;
    schema -> String = DEFAULT_SCHEMA;
    pool_size -> usize = DEFAULT_POOL_SIZE;
    append_batch_size -> usize = DEFAULT_APPEND_BATCH_SIZE;
    channel_capacity -> usize = DEFAULT_CHANNEL_CAPACITY;
    append_linger_ms -> u64 = DEFAULT_APPEND_LINGER_MS;
    max_backoff_ms -> u64 = DEFAULT_MAX_BACKOFF_MS;
    shutdown_timeout_s -> u64 = DEFAULT_SHUTDOWN_TIMEOUT_S;
    ingest_bytes -> usize = DEFAULT_INGEST_BYTES;
    page_bytes -> usize = DEFAULT_PAGE_BYTES;
    max_event_bytes -> usize = DEFAULT_MAX_EVENT_BYTES;
    log_level -> String = DEFAULT_LOG_LEVEL;
    ready_max_lag_s -> u64 = DEFAULT_READY_MAX_LAG_S;
    ready_max_stall_s -> u64 = DEFAULT_READY_MAX_STALL_S;
    prune_interval_s -> u64 = DEFAULT_PRUNE_INTERVAL_S;
    prune_batch_size -> i64 = DEFAULT_PRUNE_BATCH_SIZE;
    rebuild_batch_size -> usize = DEFAULT_REBUILD_BATCH_SIZE;
    parallelism -> u32 = DEFAULT_PARALLELISM;
    batch_size -> usize = DEFAULT_BATCH_SIZE;
    max_attempts -> u32 = DEFAULT_MAX_ATTEMPTS;
    retry_backoff_ms -> u64 = DEFAULT_RETRY_BACKOFF_MS;
    first_version -> i64 = DEFAULT_FIRST_VERSION;
    lease_s -> u64 = DEFAULT_LEASE_S;
    lead -> bool = DEFAULT_LEAD;
}
