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
use crate::error::{ConfigError, Problem};
use crate::ident::{is_identifier, QualifiedName, IDENTIFIER_RULE};
use crate::redact::redact_url;
use crate::template::{Template, Upsert};

/// The whole `walfold.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The databases whose outboxes are followed through logical replication: one
    /// `[source]`, or several `[[source]]` entries, each with its own `name`.
    #[serde(deserialize_with = "one_or_many")]
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
}

/// `[metrics]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` for `/metrics` (Prometheus/OpenMetrics text), `/healthz`, `/readyz`,
    /// e.g. `"127.0.0.1:9187"`
    ///
    /// Default: off
    pub listen: Option<String>,
    /// `/readyz` fails when an active subscriber's oldest unapplied event is older than
    /// this
    ///
    /// Default: `60`
    #[serde(default = "defaults::ready_max_lag_s")]
    pub ready_max_lag_s: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            ready_max_lag_s: defaults::ready_max_lag_s(),
        }
    }
}

/// `[retention]`, as written in the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    /// how long events stay in the event log (rebuilds replay only what it holds)
    ///
    /// Default: `"forever"`
    #[serde(default)]
    event_log: Option<String>,
    /// seconds between the daemon's prune passes; `0`: only `walfold prune`
    ///
    /// Default: `300`
    #[serde(default = "defaults::prune_interval_s")]
    prune_interval_s: u64,
    /// rows deleted per statement (short transactions, no long locks)
    ///
    /// Default: `5000`
    #[serde(default = "defaults::prune_batch_size")]
    prune_batch_size: i64,
}

/// `[retention]`: how long the event log keeps events, and how pruning runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawRetention")]
pub struct RetentionConfig {
    /// How long events stay in the event log.
    pub event_log: Retention,
    /// Seconds between the daemon's prune passes (0: only `walfold prune`).
    pub prune_interval_s: u64,
    /// Rows deleted per prune transaction.
    pub prune_batch_size: i64,
    /// What reading the section found wrong (keys within it); [`Config::validate`]
    /// reports it with every other problem.
    unresolved: Vec<Problem>,
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

impl From<RawRetention> for RetentionConfig {
    fn from(raw: RawRetention) -> Self {
        let mut unresolved = Vec::new();
        let event_log = retention(
            &mut unresolved,
            "event_log",
            raw.event_log.as_deref(),
            DEFAULT_EVENT_LOG_RETENTION,
        );
        RetentionConfig {
            event_log,
            prune_interval_s: raw.prune_interval_s,
            prune_batch_size: raw.prune_batch_size,
            unresolved,
        }
    }
}

/// Parses a retention key (`default` when absent); a bad one becomes a problem under `key`.
fn retention(
    problems: &mut Vec<Problem>,
    key: &str,
    text: Option<&str>,
    default: Retention,
) -> Retention {
    match text.map(Retention::parse) {
        None => default,
        Some(Ok(r)) => r,
        Some(Err(message)) => {
            problems.push(Problem {
                key: key.to_owned(),
                message,
            });
            default
        }
    }
}

/// `[source]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// the source's name: `[[outbox]] source`, `[[projection]] sources` and the `:source`
    /// placeholder refer to it; each source its own ([Several sources](#several-sources));
    /// a single-source deployment that grows a second keeps `default` for the first
    ///
    /// Default: `default`
    #[serde(default = "defaults::source_name")]
    pub name: String,
    /// `postgresql://user:password@host:port/db`, or libpq's key=value form (`host=a
    /// port=5432 dbname=db user=u`); `sslmode` = `disable`, `prefer` (default), `require`,
    /// `verify-ca`, `verify-full`; `sslrootcert=/path/ca.pem`; several hosts
    /// (`host-a:5432,host-b:5432`, or `host=a,b port=5432,5433`) for a primary and its
    /// standbys: walfold connects to the one that accepts writes, for its SQL and its
    /// replication sessions alike ([After a failover](#after-a-failover)). A key walfold
    /// does not take (`service`, `passfile`, `sslcert`) is refused at load
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
    /// transactions](#large-transactions-streaming-with-protocol-2)), `1` sends each
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
    /// outboxes](#message-outboxes))
    ///
    /// Default: —
    #[serde(default)]
    pub message_prefix: Option<String>,
    /// a message outbox only: `true` accepts events from any role that may log in to the
    /// source database (PostgreSQL lets PUBLIC execute `pg_logical_emit_message`), with a
    /// warning at every start; without it walfold refuses to start until that right is
    /// revoked from PUBLIC ([Security](#security))
    ///
    /// Default: `false`
    #[serde(default)]
    pub allow_public_emit: bool,
    /// a named mapping for a framework's table (`marten`, `message_db`, …): it supplies
    /// every field below that is not set here ([Frameworks](#frameworks))
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

impl OutboxField<'_> {
    /// `id`, `id[1]` or `payload`: where it sits in `[[outbox]]`.
    pub fn name(&self) -> String {
        match self.part {
            Some(i) => format!("{}[{i}]", self.key),
            None => self.key.to_owned(),
        }
    }

    /// A bare column name (used exactly as written), not an expression.
    pub fn is_column(&self) -> bool {
        is_identifier(self.value)
    }
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
    /// metrics and operator tasks take a few more (see [Operations](#connections))
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
    /// rebuilds (see [Several targets](#several-targets)); same URL rules as `source.url`
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

/// `[[projection]]` as written in the file: flat keys, some of which belong to one kind
/// of projection only. Reading it resolves them into a [`ProjectionConfig`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProjection {
    /// used in logs and status
    ///
    /// Default: required
    name: String,
    /// logical subscriber ID; claims and checkpoints are scoped to it; a new ID starts from
    /// the beginning of the event log (`ingest` is taken: it names the rows rejected
    /// before any subscriber)
    ///
    /// Default: required
    subscriber: String,
    /// only these event types are applied
    ///
    /// Default: all
    event_types: Option<Vec<String>>,
    /// only these aggregate types are applied
    ///
    /// Default: all
    aggregate_types: Option<Vec<String>>,
    /// only events from these sources (`[[source]] name`) are applied
    ///
    /// Default: all
    sources: Option<Vec<String>>,
    /// a `sql` projection: one statement with named placeholders
    ///
    /// Default: —
    sql: Option<String>,
    /// a `table` (state) projection: `schema.table`; walfold generates the guarded upsert
    ///
    /// Default: —
    table: Option<String>,
    /// `table`: key column, filled from the aggregate ID (needs a unique index)
    ///
    /// Default: —
    key: Option<String>,
    /// `table`: the guard column; a row is updated only when its version is lower than the
    /// event's
    ///
    /// Default: —
    version_column: Option<String>,
    /// `table`: column → placeholder expression, e.g. `{ total = ":payload.total::numeric"
    /// }`
    ///
    /// Default: —
    columns: Option<BTreeMap<String, String>>,
    /// `sql`: the table the statement writes, named `{table}` in `sql` (walfold substitutes
    /// the quoted name); needed to rebuild a `sql` projection
    ///
    /// Default: —
    target: Option<String>,
    /// how long claims are kept (`"30d"`, `"12h"`, `"15m"`, `"90s"`); see
    /// [Retention](#retention-as-replay-policy)
    ///
    /// Default: `"forever"`
    #[serde(default)]
    dedup_retention: Option<String>,
    /// events per transaction while a rebuild replays
    ///
    /// Default: `5000`
    #[serde(default = "defaults::rebuild_batch_size")]
    rebuild_batch_size: usize,
    /// after a rebuild switches over, drop the retired table after this long; by default it
    /// stays until `walfold rebuild NAME --finish`
    ///
    /// Default: `"forever"`
    #[serde(default)]
    drop_retired_after: Option<String>,
    /// workers, each owning a hash partition of aggregates; may be changed across a restart
    /// (every partition then resumes at the old layout's lowest position)
    ///
    /// Default: `1`
    #[serde(default = "defaults::parallelism")]
    parallelism: u32,
    /// most events claimed and applied per transaction
    ///
    /// Default: `500`
    #[serde(default = "defaults::batch_size")]
    batch_size: usize,
    /// attempts at an event whose data keeps failing before it is dead-lettered and its
    /// aggregate parked (environment errors pause instead and are not counted)
    ///
    /// Default: `5`
    #[serde(default = "defaults::max_attempts")]
    max_attempts: u32,
    /// first retry delay (doubles per attempt)
    ///
    /// Default: `200`
    #[serde(default = "defaults::retry_backoff_ms")]
    retry_backoff_ms: u64,
    /// `guard`: apply when the stored version is lower (state events); `strict`: apply
    /// every version exactly once, in order (delta events); see [Strict-sequence
    /// projections](#strict-sequence-projections)
    ///
    /// Default: `"guard"`
    #[serde(default)]
    version_mode: VersionMode,
    /// `strict`: the version an aggregate walfold has not seen starts at (a lower one is
    /// dead-lettered, never skipped)
    ///
    /// Default: `1`
    #[serde(default = "defaults::first_version")]
    first_version: i64,
    /// `strict`: how long events may wait for a missing version before the gap becomes an
    /// open dead letter (`"forever"`: never)
    ///
    /// Default: `"10m"`
    #[serde(default)]
    gap_timeout: Option<String>,
    /// the `[targets.NAME]` holding this projection's read model and state; its events
    /// still come from the main target's event log (an unknown name is refused, listing the
    /// known ones)
    ///
    /// Default: the main target
    #[serde(default)]
    database: Option<String>,
}

/// `[[projection]]`: one logical subscriber, what it does, and how it runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "RawProjection")]
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
    /// What reading the entry found wrong (keys within the entry); [`Config::validate`]
    /// reports it, with the entry's index, among every other problem.
    unresolved: Vec<Problem>,
}

/// `projection.version_mode`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionMode {
    #[default]
    Guard,
    Strict,
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

impl From<RawProjection> for ProjectionConfig {
    fn from(raw: RawProjection) -> Self {
        let mut unresolved = Vec::new();
        let problems = &mut unresolved;
        let dedup_retention = retention(
            problems,
            "dedup_retention",
            raw.dedup_retention.as_deref(),
            DEFAULT_DEDUP_RETENTION,
        );
        let drop_retired_after = retention(
            problems,
            "drop_retired_after",
            raw.drop_retired_after.as_deref(),
            DEFAULT_DROP_RETIRED_AFTER,
        );
        let gap_timeout = retention(
            problems,
            "gap_timeout",
            raw.gap_timeout.as_deref(),
            DEFAULT_GAP_TIMEOUT,
        );
        let kind = raw.kind().unwrap_or_else(|ps| {
            unresolved.extend(ps);
            ProjectionKind::Code { target: None }
        });
        ProjectionConfig {
            name: raw.name,
            subscriber: raw.subscriber,
            event_types: raw.event_types,
            aggregate_types: raw.aggregate_types,
            sources: raw.sources,
            kind,
            dedup_retention,
            rebuild_batch_size: raw.rebuild_batch_size,
            drop_retired_after,
            parallelism: raw.parallelism,
            batch_size: raw.batch_size,
            max_attempts: raw.max_attempts,
            retry_backoff_ms: raw.retry_backoff_ms,
            version_mode: raw.version_mode,
            first_version: raw.first_version,
            gap_timeout,
            database: raw.database,
            unresolved,
        }
    }
}

/// A problem under `key`, relative to the projection's entry.
fn problem(key: &str, message: String) -> Problem {
    Problem {
        key: key.to_owned(),
        message,
    }
}

impl RawProjection {
    /// Reconciles `sql`, `table`, `key`, `version_column`, `columns` and `target` into
    /// what the projection does, and compiles it once to report what cannot compile.
    fn kind(&self) -> Result<ProjectionKind, Vec<Problem>> {
        match (&self.sql, &self.table) {
            (Some(_), Some(_)) => Err(vec![problem(
                "sql",
                "set either `sql` or `table`, not both".into(),
            )]),
            (None, None) => Err(vec![problem(
                "sql",
                "missing: set `sql` (a statement) or `table` (a state projection)".into(),
            )]),
            (Some(sql), None) => self.sql_kind(sql),
            (None, Some(_)) if self.target.is_some() => Err(vec![problem(
                "target",
                "only used with `sql` projections (a `table` projection writes `table`)".into(),
            )]),
            (None, Some(table)) => self.table_kind(table),
        }
    }

    fn sql_kind(&self, sql: &str) -> Result<ProjectionKind, Vec<Problem>> {
        let names_table = match Template::replace_in_code(sql, "{table}", "") {
            Ok(without) => without != sql,
            Err(e) => return Err(vec![problem("sql", e.to_string())]),
        };
        let target = match (&self.target, names_table) {
            (Some(t), true) => {
                Some(QualifiedName::parse(t).map_err(|m| vec![problem("target", m)])?)
            }
            (Some(_), false) => {
                return Err(vec![problem(
                    "sql",
                    "write `{table}` where the statement names its `target` table".into(),
                )])
            }
            (None, true) => {
                return Err(vec![problem(
                    "target",
                    "missing: `sql` names `{table}`; set `target` to that table".into(),
                )])
            }
            (None, false) => None,
        };
        let mut problems = Vec::new();
        for (k, set) in [
            ("key", self.key.is_some()),
            ("version_column", self.version_column.is_some()),
            ("columns", self.columns.is_some()),
        ] {
            if set {
                problems.push(problem(k, "only used with `table` projections".into()));
            }
        }
        let kind = ProjectionKind::Sql {
            statement: sql.to_owned(),
            target,
        };
        match kind.compile(None) {
            Ok(_) if problems.is_empty() => Ok(kind),
            Ok(_) => Err(problems),
            Err(ps) => {
                problems.extend(ps);
                Err(problems)
            }
        }
    }

    fn table_kind(&self, table: &str) -> Result<ProjectionKind, Vec<Problem>> {
        let mut problems = Vec::new();
        let name = match QualifiedName::parse(table) {
            Ok(n) => Some(n),
            Err(m) => {
                problems.push(problem("table", m));
                None
            }
        };
        let mut column = |k: &str, v: &Option<String>| match v {
            None => {
                problems.push(problem(
                    k,
                    "missing: required for `table` projections".into(),
                ));
                None
            }
            Some(c) if !is_identifier(c) => {
                problems.push(problem(
                    k,
                    format!("`{c}` is not a valid column name: {IDENTIFIER_RULE}"),
                ));
                None
            }
            Some(c) => Some(c.clone()),
        };
        let key = column("key", &self.key);
        let version_column = column("version_column", &self.version_column);
        let columns = self.columns.clone().unwrap_or_default();
        for (col, expr) in &columns {
            if !is_identifier(col) {
                problems.push(problem(
                    &format!("columns.{col}"),
                    format!("not a valid column name: {IDENTIFIER_RULE}"),
                ));
            }
            if let Err(e) = Template::compile(expr) {
                problems.push(problem(&format!("columns.{col}"), e.to_string()));
            }
        }
        let (Some(table), Some(key), Some(version_column)) = (name, key, version_column) else {
            return Err(problems);
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let kind = ProjectionKind::Table {
            table,
            key,
            version_column,
            columns,
        };
        kind.compile(None)?;
        Ok(kind)
    }
}

impl ProjectionKind {
    /// The statement, writing to `storage` instead of the projection's own table when
    /// given (a rebuild's shadow table); problems' keys are within the entry.
    fn compile(&self, storage: Option<&QualifiedName>) -> Result<Statement, Vec<Problem>> {
        match self {
            ProjectionKind::Sql { statement, target } => {
                let sql = match storage.or(target.as_ref()) {
                    Some(table) if target.is_some() => {
                        Template::replace_in_code(statement, "{table}", &table.quoted())
                            .map_err(|e| vec![problem("sql", e.to_string())])?
                    }
                    _ => statement.clone(),
                };
                Template::compile(&sql)
                    .map(Statement::Sql)
                    .map_err(|e| vec![problem("sql", e.to_string())])
            }
            ProjectionKind::Table {
                table,
                key,
                version_column,
                columns,
            } => {
                let table = storage.unwrap_or(table);
                let upsert = Upsert::new(table, key, version_column, columns);
                match Template::compile(&upsert.one()) {
                    Ok(template) => Ok(Statement::Table(Box::new(TableProjection {
                        table: table.clone(),
                        key: key.clone(),
                        version_column: version_column.clone(),
                        upsert,
                        template,
                    }))),
                    Err(e) => Err(vec![problem("columns", e.to_string())]),
                }
            }
            ProjectionKind::Code { .. } => Err(vec![problem(
                "sql",
                "a projection written in Rust has no statement to compile".into(),
            )]),
        }
    }
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
            unresolved: Vec::new(),
        }
    }

    /// Compiles the projection's statement; `index` is its position, for error keys.
    pub fn statement(&self, index: usize) -> Result<Statement, Vec<Problem>> {
        self.statement_for(index, None)
    }

    /// Compiles the projection's statement writing to `storage` instead of its own table
    /// (a rebuild's shadow table) when given.
    pub fn statement_for(
        &self,
        index: usize,
        storage: Option<&QualifiedName>,
    ) -> Result<Statement, Vec<Problem>> {
        self.kind.compile(storage).map_err(|ps| {
            ps.into_iter()
                .map(|p| Problem {
                    key: format!("projection[{index}].{}", p.key),
                    message: p.message,
                })
                .collect()
        })
    }

    /// The table this projection writes: `table`, or `target` of a `sql` (or Rust)
    /// projection.
    pub fn storage(&self) -> Option<QualifiedName> {
        match &self.kind {
            ProjectionKind::Table { table, .. } => Some(table.clone()),
            ProjectionKind::Sql { target, .. } | ProjectionKind::Code { target } => target.clone(),
        }
    }
}

impl Config {
    /// The table outboxes with their tables (message outboxes have none).
    pub fn table_outboxes(&self) -> impl Iterator<Item = (&OutboxConfig, QualifiedName)> {
        self.outbox
            .iter()
            .filter_map(|o| o.table_name().map(|t| (o, t)))
    }

    /// The table outbox named `table` (`schema.table`, or as written in the config).
    pub fn table_outbox(&self, table: &str) -> Option<(&OutboxConfig, QualifiedName)> {
        self.table_outboxes()
            .find(|(o, t)| t.to_string() == table || o.table.as_deref() == Some(table))
    }

    /// The target database URL (`target.url`, else the only source's URL).
    pub fn target_url(&self) -> &str {
        self.target.url.as_deref().unwrap_or(&self.source().url)
    }

    /// The first source: the only one in a single-source config, and in every view made
    /// by [`Config::for_source`].
    pub fn source(&self) -> &SourceConfig {
        &self.source[0]
    }

    /// Every source, in config order.
    pub fn sources(&self) -> &[SourceConfig] {
        &self.source
    }

    /// The source an outbox belongs to (valid after [`Config::validate`]).
    pub fn source_of<'a>(&'a self, outbox: &'a OutboxConfig) -> &'a str {
        outbox.source.as_deref().unwrap_or(&self.source().name)
    }

    /// The config as one source sees it: only that source, only its outboxes, the
    /// target made explicit. Readers, setup and backfill work on such a view.
    pub fn for_source(&self, name: &str) -> Option<Config> {
        let source = self.source.iter().find(|s| s.name == name)?.clone();
        let mut view = self.clone();
        view.target.url = Some(self.target_url().to_owned());
        view.outbox = self
            .outbox
            .iter()
            .filter(|o| self.source_of(o) == name)
            .cloned()
            .map(|mut o| {
                o.source = Some(name.to_owned());
                o
            })
            .collect();
        view.source = vec![source];
        Some(view)
    }

    /// One view per source ([`Config::for_source`]), in config order.
    pub fn source_views(&self) -> Vec<Config> {
        self.source
            .iter()
            .filter_map(|s| self.for_source(&s.name))
            .collect()
    }

    /// Checks everything and reports every problem at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut push = |key: &str, message: String| {
            problems.push(Problem {
                key: key.to_owned(),
                message,
            })
        };
        self.validate_sources(&mut push);
        if let Some(url) = &self.target.url {
            check_url(&mut push, "target.url", url);
        }
        if !is_identifier(&self.target.schema) {
            push(
                "target.schema",
                format!(
                    "`{}` is not a valid name: {IDENTIFIER_RULE}",
                    self.target.schema
                ),
            );
        }
        if self.outbox.is_empty() {
            push(
                "outbox",
                "missing: add at least one [[outbox]] (a table, or a message_prefix) to follow"
                    .into(),
            );
        }
        let mut tables = Vec::new();
        let mut prefixes = Vec::new();
        for (i, o) in self.outbox.iter().enumerate() {
            match &o.source {
                Some(name) if !self.source.iter().any(|s| s.name == *name) => push(
                    &format!("outbox[{i}].source"),
                    format!("no [[source]] is named `{name}` (sources: {})", self.source_names()),
                ),
                None if self.source.len() > 1 => push(
                    &format!("outbox[{i}].source"),
                    format!(
                        "missing: with several sources, name the one whose database holds this outbox ({})",
                        self.source_names()
                    ),
                ),
                _ => {}
            }
            match (&o.table, &o.message_prefix) {
                // Twice in one source's database; two databases may share names.
                (Some(table), None) => match QualifiedName::parse(table) {
                    Ok(n) if tables.contains(&(self.source_of(o), n.clone())) => {
                        push(&format!("outbox[{i}].table"), "listed twice".into())
                    }
                    Ok(n) => tables.push((self.source_of(o), n)),
                    Err(m) => push(&format!("outbox[{i}].table"), m),
                },
                (None, Some(prefix)) => match check_prefix(prefix) {
                    Err(m) => push(&format!("outbox[{i}].message_prefix"), m),
                    Ok(()) if prefixes.contains(&(self.source_of(o), prefix)) => {
                        push(&format!("outbox[{i}].message_prefix"), "listed twice".into())
                    }
                    Ok(()) => prefixes.push((self.source_of(o), prefix)),
                },
                (None, None) => push(
                    &format!("outbox[{i}].table"),
                    "missing: set table (an outbox table) or message_prefix (transactional \
                     pg_logical_emit_message calls)"
                        .into(),
                ),
                (Some(_), Some(_)) => push(
                    &format!("outbox[{i}].message_prefix"),
                    "set either table or message_prefix, not both: one [[outbox]] per source of events"
                        .into(),
                ),
            }
            if o.allow_public_emit && o.table.is_some() && o.message_prefix.is_none() {
                push(
                    &format!("outbox[{i}].allow_public_emit"),
                    "only a message outbox (message_prefix) takes it: a table outbox's events \
                     are written by whoever may insert into the table"
                        .into(),
                );
            }
            if let Some(name) = &o.preset {
                if crate::presets::preset(name).is_none() {
                    let names: Vec<&str> = crate::presets::PRESETS.iter().map(|p| p.name).collect();
                    push(
                        &format!("outbox[{i}].preset"),
                        format!(
                            "no preset is named `{name}` (presets: {})",
                            if names.is_empty() {
                                "none".into()
                            } else {
                                names.join(", ")
                            }
                        ),
                    );
                }
            }
            if o.message_prefix.is_some() {
                // A message's fields are its JSON keys: no row to evaluate expressions over.
                let table_only = [
                    ("preset", o.preset.is_some()),
                    ("where", o.r#where.is_some()),
                    ("expand", o.expand.is_some()),
                    ("id", matches!(o.id, Some(IdField::Composite(_)))),
                ];
                for (key, set) in table_only {
                    if set {
                        push(
                            &format!("outbox[{i}].{key}"),
                            format!(
                                "a message outbox's fields are JSON keys of its messages: {} \
                                 is for table outboxes",
                                if key == "id" { "a composite id" } else { key }
                            ),
                        );
                    }
                }
                for f in o.fields() {
                    if !f.is_column() {
                        push(
                            &format!("outbox[{i}].{}", f.name()),
                            format!(
                                "`{}` is not a valid JSON key: {IDENTIFIER_RULE} (expressions \
                                 are for table outboxes)",
                                f.value
                            ),
                        );
                    }
                }
            } else {
                if matches!(&o.id, Some(IdField::Composite(parts)) if parts.is_empty()) {
                    push(
                        &format!("outbox[{i}].id"),
                        "an empty array: name the column (or the columns) of the producer's ID"
                            .into(),
                    );
                }
                for f in o.fields() {
                    if f.is_column() {
                        continue;
                    }
                    let word = f
                        .value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    let problem = if word {
                        // A name PostgreSQL would truncate, or one starting with a digit.
                        Some(format!(
                            "`{}` is not a valid column name: {IDENTIFIER_RULE}",
                            f.value
                        ))
                    } else {
                        walfold_expr::parse(f.value).err().map(|e| {
                            format!(
                                "not a valid column name ({IDENTIFIER_RULE}) nor an expression \
                                 walfold evaluates: {e}"
                            )
                        })
                    };
                    if let Some(problem) = problem {
                        push(&format!("outbox[{i}].{}", f.name()), problem);
                    }
                }
            }
        }
        let p = &self.pipeline;
        if !(1..=100_000).contains(&p.append_batch_size) {
            push(
                "pipeline.append_batch_size",
                "must be between 1 and 100000".into(),
            );
        }
        if !(1..=1_000_000).contains(&p.channel_capacity) {
            push(
                "pipeline.channel_capacity",
                "must be between 1 and 1000000".into(),
            );
        }
        for (key, bytes, least) in [
            ("pipeline.ingest_bytes", p.ingest_bytes, 65_536),
            ("pipeline.page_bytes", p.page_bytes, 65_536),
            ("pipeline.max_event_bytes", p.max_event_bytes, 1024),
        ] {
            // PostgreSQL's own limit on one value is 1 GB.
            if !(least..=1 << 30).contains(&bytes) {
                push(
                    key,
                    format!("must be between {least} and 1073741824 (1 GiB)"),
                );
            }
        }
        if p.max_backoff_ms == 0 {
            push("pipeline.max_backoff_ms", "must be at least 1".into());
        }
        let pools = std::iter::once(("target.pool_size".to_owned(), self.target.pool_size)).chain(
            self.targets
                .iter()
                .map(|(name, t)| (format!("targets.{name}.pool_size"), t.pool_size)),
        );
        for (key, size) in pools {
            if !(1..=1000).contains(&size) {
                push(&key, "must be between 1 and 1000".into());
            }
        }
        let mut names: Vec<&str> = Vec::new();
        let mut subscribers: Vec<&str> = Vec::new();
        for (i, proj) in self.projection.iter().enumerate() {
            let key = |k: &str| format!("projection[{i}].{k}");
            if proj.name.trim().is_empty() {
                push(&key("name"), "must not be empty".into());
            } else if names.contains(&proj.name.as_str()) {
                push(&key("name"), format!("`{}` is used twice", proj.name));
            }
            names.push(&proj.name);
            if proj.subscriber.trim().is_empty() || proj.subscriber.len() > 200 {
                push(&key("subscriber"), "must be 1-200 characters".into());
            } else if proj.subscriber == INGEST_SUBSCRIBER {
                push(
                    &key("subscriber"),
                    "`ingest` names the rows rejected before any subscriber (`walfold dead-letters list --subscriber ingest`); choose another ID".into(),
                );
            } else if subscribers.contains(&proj.subscriber.as_str()) {
                push(
                    &key("subscriber"),
                    format!(
                        "`{}` is used by two projections; each projection needs its own subscriber ID",
                        proj.subscriber
                    ),
                );
            }
            subscribers.push(&proj.subscriber);
            match &proj.sources {
                Some(list) if list.is_empty() => push(
                    &key("sources"),
                    "is empty: the projection would apply nothing; remove the key to take every source"
                        .into(),
                ),
                Some(list) => {
                    for (j, name) in list.iter().enumerate() {
                        if list[..j].contains(name) {
                            push(&key("sources"), format!("`{name}` is listed twice"));
                        }
                    }
                }
                None => {}
            }
            for name in proj.sources.iter().flatten() {
                if !self.source.iter().any(|s| s.name == *name) {
                    push(
                        &key("sources"),
                        format!(
                            "no [[source]] is named `{name}` (sources: {})",
                            self.source_names()
                        ),
                    );
                }
            }
            if !(1..=64).contains(&proj.parallelism) {
                push(&key("parallelism"), "must be between 1 and 64".into());
            }
            if !(1..=100_000).contains(&proj.batch_size) {
                push(&key("batch_size"), "must be between 1 and 100000".into());
            }
            if proj.max_attempts == 0 {
                push(&key("max_attempts"), "must be at least 1".into());
            }
            if !(1..=100_000).contains(&proj.rebuild_batch_size) {
                push(
                    &key("rebuild_batch_size"),
                    "must be between 1 and 100000".into(),
                );
            }
            for p in &proj.unresolved {
                push(&key(&p.key), p.message.clone());
            }
        }
        if let Some(listen) = &self.metrics.listen {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                push(
                    "metrics.listen",
                    format!("`{listen}` is not an address like 127.0.0.1:9187"),
                );
            }
        }
        for p in &self.retention.unresolved {
            push(&format!("retention.{}", p.key), p.message.clone());
        }
        if !(1..=1_000_000).contains(&self.retention.prune_batch_size) {
            push(
                "retention.prune_batch_size",
                "must be between 1 and 1000000".into(),
            );
        }
        self.validate_targets(&mut push);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// `[targets.NAME]` and the projections' `database`: names, URLs, schemas, and
    /// that every `database` names a target.
    fn validate_targets(&self, push: &mut impl FnMut(&str, String)) {
        for (name, t) in &self.targets {
            if !is_identifier(name) {
                push(
                    &format!("targets.{name}"),
                    format!("`{name}` is not a valid target name: {IDENTIFIER_RULE}"),
                );
            }
            check_url(push, &format!("targets.{name}.url"), &t.url);
            // Two targets on one database: on one schema their generations would run
            // twice; on two, a projection moved between them starts afresh (its claims
            // stay behind) and applies every event again to the same table.
            if t.url == self.target_url() {
                push(
                    &format!("targets.{name}.url"),
                    "names the main target's database: leave `database` out of its \
                     projections instead (a projection moved between two targets on one \
                     database would apply every event again to the same table)"
                        .into(),
                );
            } else if let Some((other, _)) = self
                .targets
                .iter()
                .take_while(|(n, _)| *n != name)
                .find(|(_, o)| o.url == t.url)
            {
                push(
                    &format!("targets.{name}.url"),
                    format!("names the same database as targets.{other}"),
                );
            }
            if !is_identifier(&t.schema) {
                push(
                    &format!("targets.{name}.schema"),
                    format!("`{}` is not a valid name: {IDENTIFIER_RULE}", t.schema),
                );
            }
        }
        for (i, p) in self.projection.iter().enumerate() {
            let Some(database) = &p.database else {
                continue;
            };
            if !self.targets.contains_key(database) {
                let known: Vec<&str> = self.targets.keys().map(String::as_str).collect();
                push(
                    &format!("projection[{i}].database"),
                    if known.is_empty() {
                        format!(
                            "unknown target `{database}`: add [targets.{database}] with its url"
                        )
                    } else {
                        format!(
                            "unknown target `{database}`; the targets are: {}",
                            known.join(", ")
                        )
                    },
                );
            }
        }
    }

    /// The extra target a projection's state lives on (`None`: the main target).
    pub fn target_of(&self, projection: &ProjectionConfig) -> Option<(&str, &ExtraTarget)> {
        let name = projection.database.as_deref()?;
        self.targets
            .get_key_value(name)
            .map(|(n, t)| (n.as_str(), t))
    }
}

impl Config {
    fn source_names(&self) -> String {
        self.source
            .iter()
            .map(|s| format!("`{}`", s.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each source on its own, and what sources must not share.
    fn validate_sources(&self, push: &mut impl FnMut(&str, String)) {
        let several = self.source.len() > 1;
        if self.source.is_empty() {
            push(
                "source",
                "missing: add a [source] with the url to follow".into(),
            );
        }
        if several && self.target.url.is_none() {
            push(
                "target.url",
                "missing: with several sources, name the database walfold writes to".into(),
            );
        }
        for (i, source) in self.source.iter().enumerate() {
            let key = |k: &str| {
                if several {
                    format!("source[{i}].{k}")
                } else {
                    format!("source.{k}")
                }
            };
            check_url(push, &key("url"), &source.url);
            if !is_identifier(&source.name) {
                push(
                    &key("name"),
                    format!("`{}` is not a valid name: {IDENTIFIER_RULE}", source.name),
                );
            } else if self.source[..i].iter().any(|s| s.name == source.name) {
                // Two without a name are both `default`.
                push(
                    &key("name"),
                    format!(
                        "`{}` is used twice: with several sources, give each its own name",
                        source.name
                    ),
                );
            }
            if !is_slot_name(&source.slot) {
                push(
                    &key("slot"),
                    format!(
                        "`{}` is not a valid slot name: 1-63 lowercase letters, digits or _ (PostgreSQL's rule for slots)",
                        source.slot
                    ),
                );
            } else if let Some(other) = self.source[..i].iter().find(|s| s.slot == source.slot) {
                push(
                    &key("slot"),
                    format!(
                        "`{}` is also the slot of source `{}`: each source needs its own slot name \
                         (the target keeps each slot's ingest position under it)",
                        source.slot, other.name
                    ),
                );
            }
            if let Some(other) = self.source[..i].iter().find(|s| s.url == source.url) {
                push(
                    &key("url"),
                    format!(
                        "is also the url of source `{}`: two sources on one database would read \
                         the same outbox twice",
                        other.name
                    ),
                );
            }
            if !is_identifier(&source.publication) {
                push(
                    &key("publication"),
                    format!(
                        "`{}` is not a valid name: {IDENTIFIER_RULE}",
                        source.publication
                    ),
                );
            }
            let outboxes = || {
                self.outbox
                    .iter()
                    .filter(|o| o.source.as_deref().is_none_or(|n| n == source.name))
            };
            if several && outboxes().next().is_none() {
                push(
                    &key("name"),
                    format!("no [[outbox]] has source = \"{}\"", source.name),
                );
            }
            if let Some(p) = source.protocol {
                if !(1..=2).contains(&p) {
                    push(
                        &key("protocol"),
                        format!("`{p}` is no pgoutput protocol walfold speaks: use 1 or 2"),
                    );
                }
                if p == 2 && outboxes().any(|o| o.message_prefix.is_some()) {
                    push(
                        &key("protocol"),
                        "2 cannot carry message outboxes: pgoutput 2 streams a transaction's \
                         messages under its top-level transaction, so a message in a savepoint \
                         rolled back after it streamed would become an event; remove \
                         the protocol key (message outboxes are read with 1) or set 1"
                            .into(),
                    );
                }
            }
        }
    }
}

impl OutboxConfig {
    /// The fields an event cannot do without, as config keys.
    pub const REQUIRED: [&'static str; 5] = [
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
    ];

    /// The event's fields, in order, as config keys.
    pub const KEYS: [&'static str; 8] = [
        "id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "version",
        "payload",
        "headers",
        "occurred_at",
    ];

    /// Its preset, when it names one that exists.
    pub fn preset(&self) -> Option<&'static crate::presets::Preset> {
        self.preset.as_deref().and_then(crate::presets::preset)
    }

    /// What the config sets for `key` (one of [`Self::KEYS`] but `id`, or `where`,
    /// `expand`), else its preset; `None`: neither.
    pub fn set(&self, key: &str) -> Option<&str> {
        let explicit = match key {
            "aggregate_type" => &self.aggregate_type,
            "aggregate_id" => &self.aggregate_id,
            "event_type" => &self.event_type,
            "version" => &self.version,
            "payload" => &self.payload,
            "headers" => &self.headers,
            "occurred_at" => &self.occurred_at,
            "where" => &self.r#where,
            "expand" => &self.expand,
            _ => &None,
        };
        explicit.as_deref().or_else(|| {
            self.preset()?
                .fields
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
        })
    }

    /// The parts of the producer's ID: set, else the preset's, else `id`.
    pub fn id_parts(&self) -> (Vec<&str>, bool) {
        match &self.id {
            Some(IdField::One(one)) => (vec![one.as_str()], true),
            Some(IdField::Composite(parts)) => (parts.iter().map(String::as_str).collect(), true),
            None => match self.preset() {
                Some(p) if !p.id.is_empty() => (p.id.to_vec(), true),
                _ => (vec![defaults::DEFAULT_ID], false),
            },
        }
    }

    /// Every field, resolved (set, else its preset's, else the default name), in
    /// [`Self::KEYS`] order, each part of a composite `id` apart, then `where` and
    /// `expand` when set.
    pub fn fields(&self) -> Vec<OutboxField<'_>> {
        let (parts, set) = self.id_parts();
        let composite = parts.len() > 1 || matches!(self.id, Some(IdField::Composite(_)));
        let mut fields: Vec<OutboxField<'_>> = parts
            .into_iter()
            .enumerate()
            .map(|(i, value)| OutboxField {
                key: "id",
                part: composite.then_some(i),
                value,
                set,
            })
            .collect();
        for key in &Self::KEYS[1..] {
            let (value, set) = match self.set(key) {
                Some(v) => (v, true),
                None => (Self::default_name(key), false),
            };
            fields.push(OutboxField {
                key,
                part: None,
                value,
                set,
            });
        }
        for key in ["where", "expand"] {
            if let Some(value) = self.set(key) {
                fields.push(OutboxField {
                    key,
                    part: None,
                    value,
                    set: true,
                });
            }
        }
        fields
    }

    /// The column (or JSON key) a field not set reads.
    pub fn default_name(key: &str) -> &'static str {
        match key {
            "id" => defaults::DEFAULT_ID,
            "aggregate_type" => defaults::DEFAULT_AGGREGATE_TYPE,
            "aggregate_id" => defaults::DEFAULT_AGGREGATE_ID,
            "event_type" => defaults::DEFAULT_EVENT_TYPE,
            "version" => defaults::DEFAULT_VERSION,
            "payload" => defaults::DEFAULT_PAYLOAD,
            "headers" => defaults::DEFAULT_HEADERS,
            "occurred_at" => defaults::DEFAULT_OCCURRED_AT,
            _ => "",
        }
    }

    /// A table outbox's table as a parsed name (valid after [`Config::validate`]); `None`
    /// for a message outbox.
    pub fn table_name(&self) -> Option<QualifiedName> {
        let table = self.table.as_ref()?;
        Some(
            QualifiedName::parse(table).unwrap_or_else(|_| QualifiedName {
                schema: "public".into(),
                name: table.clone(),
            }),
        )
    }

    /// What this outbox follows, for messages: `public.outbox` or `messages 'orders'`.
    pub fn describe(&self) -> String {
        match (self.table_name(), &self.message_prefix) {
            (Some(t), _) => t.to_string(),
            (None, Some(p)) => format!("messages '{p}'"),
            (None, None) => "an outbox without table or message_prefix".into(),
        }
    }
}

/// The subscriber name that stands for the rows rejected before any subscriber
/// (`walfold dead-letters list --subscriber ingest`): no projection may take it.
pub const INGEST_SUBSCRIBER: &str = "ingest";

/// The prefix walfold's own heartbeats use (non-transactional messages).
pub const HEARTBEAT_PREFIX: &str = "walfold.heartbeat";

/// A message prefix: 1-255 printable characters, not the heartbeats' own.
fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() || prefix.len() > 255 {
        return Err("must be 1-255 characters".into());
    }
    if prefix.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if prefix.trim() != prefix {
        return Err("must not start or end with spaces (prefixes are compared exactly)".into());
    }
    if prefix == HEARTBEAT_PREFIX {
        return Err(format!(
            "`{HEARTBEAT_PREFIX}` is walfold's own heartbeat prefix"
        ));
    }
    Ok(())
}

/// A source's or target's connection string, URL or key=value pairs: see `conninfo`.
fn check_url(push: &mut impl FnMut(&str, String), key: &str, url: &str) {
    for problem in crate::conninfo::problems(url) {
        push(key, problem);
    }
}

fn is_slot_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `source`: one `[source]` table or several `[[source]]` entries. Each entry is read
/// by `SourceConfig`'s own deserializer, so its errors keep their key.
fn one_or_many<'de, D>(d: D) -> Result<Vec<SourceConfig>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct OneOrMany;
    impl<'de> serde::de::Visitor<'de> for OneOrMany {
        type Value = Vec<SourceConfig>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a [source] table or [[source]] entries")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let one = SourceConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
            Ok(vec![one])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }
    }
    d.deserialize_any(OneOrMany)
}
