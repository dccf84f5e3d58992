//! The configuration's shape: every field documented, unknown keys rejected.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::defaults::{
    self, DEFAULT_BATCH_SIZE, DEFAULT_DEDUP_RETENTION, DEFAULT_DROP_RETIRED_AFTER,
    DEFAULT_EVENT_LOG_RETENTION, DEFAULT_FIRST_VERSION, DEFAULT_GAP_TIMEOUT, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PARALLELISM, DEFAULT_PRUNE_BATCH_SIZE, DEFAULT_PRUNE_INTERVAL_S,
    DEFAULT_REBUILD_BATCH_SIZE, DEFAULT_RETRY_BACKOFF_MS,
};
use crate::duration::Retention;
use crate::error::Problem;
use crate::ident::QualifiedName;
use crate::redact::redact_url;
use crate::template::{Template, Upsert};

/// The whole `walfold.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The databases whose outboxes are followed through logical replication: one
    /// `[source]`, or several `[[source]]` entries, each with its own `name`.
    #[serde(deserialize_with = "crate::raw::one_or_many")]
    pub source: Vec<SourceConfig>,
    /// The outboxes to follow (at least one): tables, or transactional logical messages.
    #[serde(default)]
    pub outbox: Vec<OutboxConfig>,
    /// Where walfold keeps its state and the read models; defaults to the source database.
    #[serde(default)]
    pub target: TargetConfig,
    /// Extra targets by name (`[targets.reporting]`): a projection with `database =
    /// "reporting"` keeps its read model and all its state there, reading the event log
    /// from `[target]`.
    #[serde(default)]
    pub targets: BTreeMap<String, ExtraTarget>,
    /// Batching and back-pressure of the ingest path.
    #[serde(default)]
    pub pipeline: PipelineConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// The projections: each one is a logical subscriber with its own dedup claims.
    #[serde(default)]
    pub projection: Vec<ProjectionConfig>,
    /// How long the event log keeps events, and how pruning runs.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The HTTP listener for Prometheus metrics and health checks.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Several instances on one config: how long one may go silent before its work moves,
    /// and what this one runs.
    #[serde(default)]
    pub cluster: ClusterConfig,
}

/// `[cluster]`: every instance on one config takes a share of the projections' work
/// units; one of them also leads (reads the slots, prunes, plans the units).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// seconds an instance may go without a heartbeat (frozen, paused or cut off from the
    /// main target) before the others take its work and end its sessions; a killed
    /// instance's work moves within about 3 s, a stopped one's at once. Its work runs
    /// elsewhere within `lease_s` + 3 s, plus the batch in flight
    ///
    /// Default: `10`
    #[serde(default = "defaults::lease_s")]
    pub lease_s: u64,
    /// the projections this instance runs, by name (`[]`: none, an instance that only
    /// leads); set it per instance with `WALFOLD_CLUSTER__PROJECTIONS=a,b` (`=[]` for
    /// none) or `walfold run --projections a,b`
    ///
    /// Default: every projection
    pub projections: Option<Vec<String>>,
    /// whether this instance may lead: read the slots, prune and plan the work units
    ///
    /// Default: `true`
    #[serde(default = "defaults::lead")]
    pub lead: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            lease_s: defaults::lease_s(),
            projections: None,
            lead: defaults::lead(),
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` for `/metrics` (Prometheus/OpenMetrics text), `/healthz`, `/readyz`,
    /// `/wait`, e.g. `"127.0.0.1:9187"`
    ///
    /// Default: off
    pub listen: Option<String>,
    /// `/readyz` fails when an active subscriber's oldest unapplied event is older than
    /// this
    ///
    /// Default: `60`
    #[serde(default = "defaults::ready_max_lag_s")]
    pub ready_max_lag_s: u64,
    /// `/readyz` fails, and `walfold_ingest_stalled` or `walfold_projection_stalled`
    /// counts it, when ingest or a projector partition of this instance has held work
    /// (what a source sent, a turn at the event log) this long without moving it
    ///
    /// Default: `60`
    #[serde(default = "defaults::ready_max_stall_s")]
    pub ready_max_stall_s: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            ready_max_lag_s: defaults::ready_max_lag_s(),
            ready_max_stall_s: defaults::ready_max_stall_s(),
        }
    }
}

/// `[retention]`: how long the event log keeps events, and how pruning runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "crate::raw::RawRetention")]
pub struct RetentionConfig {
    /// How long events stay in the event log.
    pub event_log: Retention,
    /// Seconds between the daemon's prune passes (0: only `walfold prune`).
    pub prune_interval_s: u64,
    /// Rows deleted per prune transaction.
    pub prune_batch_size: i64,
    /// What reading the section found wrong (keys within it); [`Config::validate`]
    /// reports it with every other problem.
    pub(crate) unresolved: Vec<Problem>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            event_log: DEFAULT_EVENT_LOG_RETENTION,
            prune_interval_s: DEFAULT_PRUNE_INTERVAL_S,
            prune_batch_size: DEFAULT_PRUNE_BATCH_SIZE,
            unresolved: Vec::new(),
        }
    }
}

/// `[source]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// the source's name: `[[outbox]] source`, `[[projection]] sources` and the `:source`
    /// placeholder refer to it; each source its own ([Several
    /// sources](SOURCES.md#several-sources)); a single-source deployment that grows a
    /// second keeps `default` for the first
    ///
    /// Default: `default`
    #[serde(default = "defaults::source_name")]
    pub name: String,
    /// `postgresql://user:password@host:port/db`, or libpq's key=value form (`host=a
    /// port=5432 dbname=db user=u`); `sslmode` = `disable`, `prefer` (default), `require`,
    /// `verify-ca`, `verify-full`; `sslrootcert=/path/ca.pem`; several hosts
    /// (`host-a:5432,host-b:5432`, or `host=a,b port=5432,5433`) for a primary and its
    /// standbys: walfold connects to the one that accepts writes, for its SQL and its
    /// replication sessions alike ([After a failover](OPERATIONS.md#after-a-failover)). A
    /// key walfold does not take (`service`, `passfile`, `sslcert`) is refused at load
    ///
    /// Default: required
    pub url: String,
    /// logical replication slot (pgoutput), created if missing
    ///
    /// Default: `walfold`
    #[serde(default = "defaults::slot")]
    pub slot: String,
    /// publication over the outbox tables, created if missing (`publish = 'insert,
    /// truncate', publish_via_partition_root = true`); see [Publications](#publications)
    /// for what an existing one must be
    ///
    /// Default: `walfold_outbox`
    #[serde(default = "defaults::publication")]
    pub publication: String,
    /// seconds between heartbeats (`pg_logical_emit_message`), so the slot advances and WAL
    /// is released even when no outbox row is written; `0` turns them off (each heartbeat
    /// writes a small WAL record, so a database is never fully idle: with `archive_timeout`
    /// set, expect a segment switch per period)
    ///
    /// Default: `10`
    #[serde(default = "defaults::heartbeat_interval_s")]
    pub heartbeat_interval_s: u64,
    /// the slot is missing or invalidated after walfold ingested through it: `stop` exits
    /// with the fix; `recreate` creates a new slot, records the skipped WAL range in
    /// `slot_gap` (logged, `walfold_slot_gaps`, `walfold status`; after a failover from
    /// the fork), backfills the table outboxes over it and goes on
    ///
    /// Default: `"stop"`
    #[serde(default)]
    pub on_slot_lost: OnSlotLost,
    /// pgoutput protocol version: `2` streams a large transaction while it runs (staged in
    /// the target until it commits, so the source does not spill it to disk; see [Large
    /// transactions](SOURCES.md#large-transactions-streaming-with-protocol-2)), `1` sends each
    /// transaction only after its commit. `2` against a server before 14 stops with the fix
    ///
    /// Default: `2` on PostgreSQL 14+ without message outboxes, else `1`
    #[serde(default)]
    pub protocol: Option<u8>,
}

/// `source.on_slot_lost`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSlotLost {
    #[default]
    Stop,
    Recreate,
}

impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceConfig")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("heartbeat_interval_s", &self.heartbeat_interval_s)
            .field("on_slot_lost", &self.on_slot_lost)
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// `[[outbox]]`: where events are read from (a table, or transactional logical decoding
/// messages under a prefix) and the columns (or JSON keys) each field is read from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// the `[[source]]` (by name) whose database holds this outbox; required with several
    /// sources
    ///
    /// Default: the only source
    #[serde(default)]
    pub source: Option<String>,
    /// a table outbox: `schema.table` (or `table` for `public.table`), a table or a
    /// partitioned table (not one of its partitions)
    ///
    /// Default: —
    #[serde(default)]
    pub table: Option<String>,
    /// a message outbox instead: the prefix of `pg_logical_emit_message(true, prefix,
    /// json)` calls; the keys below then name JSON keys ([Message
    /// outboxes](SOURCES.md#message-outboxes))
    ///
    /// Default: —
    #[serde(default)]
    pub message_prefix: Option<String>,
    /// a message outbox only: `true` accepts events from any role that may log in to the
    /// source database (PostgreSQL lets PUBLIC execute `pg_logical_emit_message`), with a
    /// warning at every start; without it walfold refuses to start until that right is
    /// revoked from PUBLIC ([Security](SECURITY.md))
    ///
    /// Default: `false`
    #[serde(default)]
    pub allow_public_emit: bool,
    /// a named mapping for a framework's table (`marten`, `message_db`, …): it supplies
    /// every field below that is not set here ([Frameworks](FRAMEWORKS.md))
    ///
    /// Default: —
    #[serde(default)]
    pub preset: Option<String>,
    /// the producer's event ID: a column or expression, or an array of them for a
    /// composite identity (`["stream_id", "version"]`). A uuid (or text holding one) is
    /// the event ID; any other value (text, a number, a composite) becomes a UUIDv5 of
    /// the outbox and its text ([Event identity](#event-identity)), the value kept as
    /// `producer_id`
    ///
    /// Default: `id`
    #[serde(default)]
    pub id: Option<IdField>,
    /// the outbox name derived event IDs are scoped to, in place of this one's
    /// (`schema.table`, or `message_prefix:<prefix>`): set it to the old name when the
    /// outbox is renamed in the config, so its rows keep their event IDs ([Event
    /// identity](#event-identity))
    ///
    /// Default: this outbox
    #[serde(default)]
    pub id_scope: Option<String>,
    /// aggregate type, e.g. `order`, or a constant (`"'order'"`)
    ///
    /// Default: the column `aggregate_type`, else the table's name
    #[serde(default)]
    pub aggregate_type: Option<String>,
    /// required; events of one aggregate are applied in order
    ///
    /// Default: `aggregate_id`
    #[serde(default)]
    pub aggregate_id: Option<String>,
    /// event type, e.g. `OrderPaid`; required
    ///
    /// Default: `event_type`
    #[serde(default)]
    pub event_type: Option<String>,
    /// integer or null; `table` projections need it
    ///
    /// Default: `version`
    #[serde(default)]
    pub version: Option<String>,
    /// JSON: json, jsonb, text holding JSON, or bytea holding UTF-8 JSON; required
    ///
    /// Default: `payload`
    #[serde(default)]
    pub payload: Option<String>,
    /// optional JSON metadata (not part of an event's identity), stored as the payload
    /// may be
    ///
    /// Default: `headers`
    #[serde(default)]
    pub headers: Option<String>,
    /// optional timestamptz metadata (a `timestamp without time zone` column is read as
    /// UTC)
    ///
    /// Default: `occurred_at`
    #[serde(default)]
    pub occurred_at: Option<String>,
    /// a table outbox only: a boolean expression; rows for which it is not true are no
    /// events (counted as ignored changes), an error evaluating it dead-letters the row
    ///
    /// Default: every row
    #[serde(default)]
    pub r#where: Option<String>,
    /// a table outbox only: an expression giving a JSON array; each element is one
    /// event, read by the other fields as the pseudo-column `element`
    /// (`id = "element->>'MessageId'"`)
    ///
    /// Default: one event per row
    #[serde(default)]
    pub expand: Option<String>,
}

/// `[[outbox]] id`: one column or expression, or several for a composite identity.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum IdField {
    One(String),
    Composite(Vec<String>),
}

/// One field of an `[[outbox]]`, resolved: set in the config, else by its preset, else
/// the default column (or JSON key) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxField<'a> {
    /// The config key: `id`, `aggregate_type`, …, `where`, `expand`.
    pub key: &'static str,
    /// The part of a composite `id`.
    pub part: Option<usize>,
    /// A column name (exactly as written) or an expression.
    pub value: &'a str,
    /// Set in the config or by its preset; `false`: the default name.
    pub set: bool,
}

/// `[target]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// database for walfold's schema and the read models; required with several sources
    ///
    /// Default: `source.url`
    pub url: Option<String>,
    /// walfold's own schema: `event_log`, `processed_message`, `checkpoint`, `dead_letter`,
    /// `parked_aggregate`, `ingest_position`, `projection`, `rebuild`, `_sqlx_migrations`
    ///
    /// Default: `walfold`
    #[serde(default = "defaults::schema")]
    pub schema: String,
    /// most connections the projectors hold on this database, shared by every projection
    /// and partition (each takes turns: a batch per turn); walfold's leader, appenders,
    /// metrics and operator tasks take a few more (see
    /// [Operations](OPERATIONS.md#connections))
    ///
    /// Default: `8`
    #[serde(default = "defaults::pool_size")]
    pub pool_size: usize,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            url: None,
            schema: defaults::schema(),
            pool_size: defaults::pool_size(),
        }
    }
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// `[targets.NAME]`: another database that holds some projections' read models with
/// their claims, checkpoints, parked aggregates and dead letters (walfold's schema is
/// created there too). The event log stays in `[target]`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraTarget {
    /// another database for the read models of the projections with `database = "NAME"`,
    /// and for their claims, checkpoints, parked aggregates, dead letters, pauses and
    /// rebuilds (see [Several targets](PROJECTIONS.md#several-targets)); same URL rules as
    /// `source.url`
    ///
    /// Default: required
    pub url: String,
    /// walfold's own schema in that database, created there on start
    ///
    /// Default: `walfold`
    #[serde(default = "defaults::schema")]
    pub schema: String,
    /// most connections the projectors of this target hold on it (as `target.pool_size`)
    ///
    /// Default: `8`
    #[serde(default = "defaults::pool_size")]
    pub pool_size: usize,
}

impl fmt::Debug for ExtraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExtraTarget")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// `[pipeline]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// most events appended to the event log per transaction
    ///
    /// Default: `2000`
    #[serde(default = "defaults::append_batch_size")]
    pub append_batch_size: usize,
    /// reader → appender buffer, in items; when full, reading stops and back-pressure
    /// reaches the server. Its payloads count against `ingest_bytes` (10000 took the
    /// drain's peak RSS from 36 to 66 MiB, for the same rate)
    ///
    /// Default: `2000`
    #[serde(default = "defaults::channel_capacity")]
    pub channel_capacity: usize,
    /// longest wait for more events before a partial batch is appended; 0 appends what has
    /// arrived (batches grow with the load)
    ///
    /// Default: `0`
    #[serde(default = "defaults::append_linger_ms")]
    pub append_linger_ms: u64,
    /// cap of the reconnect backoff (exponential, with jitter)
    ///
    /// Default: `30000`
    #[serde(default = "defaults::max_backoff_ms")]
    pub max_backoff_ms: u64,
    /// how long SIGTERM waits for in-flight batches before aborting
    ///
    /// Default: `30`
    #[serde(default = "defaults::shutdown_timeout_s")]
    pub shutdown_timeout_s: u64,
    /// bytes of payload in flight per source between the replication stream and the event
    /// log (the reader → appender buffer and the append batch), beside their counts in
    /// rows; an event larger than this flows alone (8 MiB)
    ///
    /// Default: `8388608`
    #[serde(default = "defaults::ingest_bytes")]
    pub ingest_bytes: usize,
    /// bytes of payload in a page of the event log a projector reads (beside
    /// `batch_size`); an event larger than this is read alone (4 MiB)
    ///
    /// Default: `4194304`
    #[serde(default = "defaults::page_bytes")]
    pub page_bytes: usize,
    /// largest outbox row or message that becomes an event, in bytes (64 MiB); a larger
    /// one is dead-lettered as `too_large`, with its small columns, not its large values
    ///
    /// Default: `67108864`
    #[serde(default = "defaults::max_event_bytes")]
    pub max_event_bytes: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            append_batch_size: defaults::append_batch_size(),
            channel_capacity: defaults::channel_capacity(),
            append_linger_ms: defaults::append_linger_ms(),
            max_backoff_ms: defaults::max_backoff_ms(),
            shutdown_timeout_s: defaults::shutdown_timeout_s(),
            ingest_bytes: defaults::ingest_bytes(),
            page_bytes: defaults::page_bytes(),
            max_event_bytes: defaults::max_event_bytes(),
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`
    ///
    /// Default: `text`
    #[serde(default)]
    pub format: LogFormat,
    /// a `tracing` filter (`RUST_LOG` wins when set)
    ///
    /// Default: `info`
    #[serde(default = "defaults::log_level")]
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::default(),
            level: defaults::log_level(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[[projection]]`: one logical subscriber, what it does, and how it runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "crate::raw::RawProjection")]
pub struct ProjectionConfig {
    /// Name used in logs, metrics and the CLI.
    pub name: String,
    /// Logical subscriber ID: dedup claims and checkpoints are scoped to it.
    pub subscriber: String,
    /// Only these event types are applied (all when absent).
    pub event_types: Option<Vec<String>>,
    /// Only these aggregate types are applied (all when absent).
    pub aggregate_types: Option<Vec<String>>,
    /// Only events from these sources are applied (all when absent).
    pub sources: Option<Vec<String>>,
    /// What the projection does: a statement, a state table, or Rust code.
    pub kind: ProjectionKind,
    /// How long dedup claims are kept: a redelivery older than this is applied again.
    pub dedup_retention: Retention,
    /// Events per transaction while a rebuild replays history.
    pub rebuild_batch_size: usize,
    /// After a rebuild switches over, drop the retired table after this long
    /// (`Forever`: keep it until `walfold rebuild --finish`).
    pub drop_retired_after: Retention,
    /// Workers, each owning a hash partition of aggregates.
    pub parallelism: u32,
    /// Most events claimed and applied in one transaction.
    pub batch_size: usize,
    /// Attempts at an event that keeps failing before it is dead-lettered.
    pub max_attempts: u32,
    /// First retry backoff in milliseconds (doubles each attempt).
    pub retry_backoff_ms: u64,
    /// `guard` or `strict`.
    pub version_mode: VersionMode,
    /// `strict`: the first version of an aggregate walfold has not seen yet.
    pub first_version: i64,
    /// `strict`: how long events may wait for a missing version before the gap becomes
    /// an open dead letter.
    pub gap_timeout: Retention,
    /// The `[targets.NAME]` holding this projection's read model and state; `None`:
    /// `[target]`.
    pub database: Option<String>,
    /// What happens when its definition differs from the one its subscriber folded with.
    pub on_definition_change: OnDefinitionChange,
    /// What reading the entry found wrong (keys within the entry); [`Config::validate`]
    /// reports it, with the entry's index, among every other problem.
    pub(crate) unresolved: Vec<Problem>,
}

/// `projection.version_mode`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionMode {
    #[default]
    Guard,
    Strict,
}

/// `projection.on_definition_change`: what happens at start when a projection's
/// definition (see [`crate::FoldDefinition`]) differs from the one its subscriber
/// folded with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDefinitionChange {
    /// The projection is not run: walfold stops with what differs and the fix.
    #[default]
    Refuse,
    /// A blue/green rebuild under a derived subscriber ID starts by itself; the old
    /// definition serves until the switch-over.
    Rebuild,
    /// The change is compatible: recorded (who, when) and the fold goes on.
    Accept,
}

/// What a projection does, resolved once from its flat keys when the config is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionKind {
    /// `sql`: one statement with named placeholders; `target` is the table it names as
    /// `{table}` (substituted, quoted, so a rebuild can write to a shadow table).
    Sql {
        statement: String,
        target: Option<QualifiedName>,
    },
    /// `table`: a state projection, the version-guarded upsert walfold generates.
    Table {
        table: QualifiedName,
        key: String,
        version_column: String,
        columns: BTreeMap<String, String>,
    },
    /// Written in Rust (`Pipeline::with_projection`); `target` names its table for
    /// rebuilds (see `Projection::for_table`).
    Code { target: Option<QualifiedName> },
}

/// A `sql` or `table` projection's statement, compiled for one table.
#[derive(Debug, Clone)]
pub enum Statement {
    Sql(Template),
    Table(Box<TableProjection>),
}

/// A state projection: the generated, version-guarded upsert.
#[derive(Debug, Clone)]
pub struct TableProjection {
    pub table: QualifiedName,
    pub key: String,
    pub version_column: String,
    /// The upsert's parts, for a statement that applies many events at once.
    pub upsert: Upsert,
    /// The compiled upsert of one event.
    pub template: Template,
}

impl ProjectionConfig {
    /// Options for a projection written in Rust, with the defaults of the TOML keys.
    pub fn new(name: &str, subscriber: &str) -> ProjectionConfig {
        ProjectionConfig {
            name: name.to_owned(),
            subscriber: subscriber.to_owned(),
            event_types: None,
            aggregate_types: None,
            sources: None,
            kind: ProjectionKind::Code { target: None },
            dedup_retention: DEFAULT_DEDUP_RETENTION,
            rebuild_batch_size: DEFAULT_REBUILD_BATCH_SIZE,
            drop_retired_after: DEFAULT_DROP_RETIRED_AFTER,
            parallelism: DEFAULT_PARALLELISM,
            batch_size: DEFAULT_BATCH_SIZE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry_backoff_ms: DEFAULT_RETRY_BACKOFF_MS,
            version_mode: VersionMode::default(),
            first_version: DEFAULT_FIRST_VERSION,
            gap_timeout: DEFAULT_GAP_TIMEOUT,
            database: None,
            on_definition_change: OnDefinitionChange::default(),
            unresolved: Vec::new(),
        }
    }
}

/// The subscriber name that stands for the rows rejected before any subscriber
/// (`walfold dead-letters list --subscriber ingest`): no projection may take it.
pub const INGEST_SUBSCRIBER: &str = "ingest";

/// The prefix walfold's own heartbeats use (non-transactional messages).
pub const HEARTBEAT_PREFIX: &str = "walfold.heartbeat";
