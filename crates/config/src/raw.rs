//! The file as written: the `[retention]` and `[[projection]]` keys as TOML spells them,
//! resolved into the shape's types when read; what cannot be resolved is kept for
//! [`Config::validate`](crate::Config::validate) to report.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use crate::defaults::{
    self, DEFAULT_DEDUP_RETENTION, DEFAULT_DROP_RETIRED_AFTER, DEFAULT_EVENT_LOG_RETENTION,
    DEFAULT_GAP_TIMEOUT,
};
use crate::duration::Retention;
use crate::error::Problem;
use crate::ident::{is_identifier, QualifiedName, IDENTIFIER_RULE};
use crate::model::{
    OnDefinitionChange, ProjectionConfig, ProjectionKind, RetentionConfig, SourceConfig,
    VersionMode,
};
use crate::template::Template;
/// `[retention]`, as written in the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetention {
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

/// `[[projection]]` as written in the file: flat keys, some of which belong to one kind
/// of projection only. Reading it resolves them into a [`ProjectionConfig`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProjection {
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
    /// [Retention](PROJECTIONS.md#retention-as-replay-policy)
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
    /// (every partition then resumes at the old layout's lowest position). Keep `1` for a
    /// statement that writes a row several aggregates share (a per-day total): the workers
    /// wait on that row and can deadlock — retried (a `projector failed, reconnecting`
    /// warning), never applied twice, but slower than one worker
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
    /// projections](PROJECTIONS.md#strict-sequence-projections)
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
    /// at start, when the projection's definition (its statement or columns, filters,
    /// version mode, first version, table; not names or tuning such as `batch_size`,
    /// `parallelism`, `max_attempts`; whitespace and SQL comments do not count) differs
    /// from the one its subscriber folded with: `refuse` stops with what differs and the
    /// fix; `rebuild` starts a blue/green rebuild under `SUBSCRIBER~DIGEST` by itself (the
    /// old definition serves until the switch-over; needs a table: `table`, or `sql` with
    /// `target`); `accept` takes the change as compatible, records who and when (`walfold
    /// status`, `walfold.definition_change`) and goes on ([Changing a
    /// projection](PROJECTIONS.md#changing-a-projection))
    ///
    /// Default: `"refuse"`
    #[serde(default)]
    on_definition_change: OnDefinitionChange,
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
            on_definition_change: raw.on_definition_change,
            unresolved,
        }
    }
}

/// A problem under `key`, relative to the projection's entry.
pub(crate) fn problem(key: &str, message: String) -> Problem {
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

/// `source`: one `[source]` table or several `[[source]]` entries. Each entry is read
/// by `SourceConfig`'s own deserializer, so its errors keep their key.
pub(crate) fn one_or_many<'de, D>(d: D) -> Result<Vec<SourceConfig>, D::Error>
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
