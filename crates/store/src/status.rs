//! What `walfold status` reports: slot lag, event-log head, each subscriber's position,
//! lag and counters, dead letters; and the same read for the metrics scrape.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::types::PgLsn;
use tokio_postgres::Client;

use walfold_event::{DeadLetterStatus, Lsn};
use walfold_telemetry::metrics::{
    DatabaseReading, DefinitionReading, Folded, Lag, RebuildReading, SlotReading, SourceReading,
    SubscriberReading,
};

use crate::error::StoreError;
use crate::rebuild::RebuildState;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

/// Slot `$1` on the source: whether it streams, how far it confirmed, what it retains.
const SLOT: &str = "select active, confirmed_flush_lsn, \
     (pg_current_wal_lsn() - restart_lsn)::int8 as retained_bytes, \
     (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 as lag_bytes, wal_status \
     from pg_replication_slots where slot_name = $1";

/// Slot `$1`'s ingest position and counters.
const INGEST: &str = "select lsn, appended, duplicates, id_conflicts, malformed, ignored_changes, \
     extract(epoch from updated_at)::float8 as updated_at_unix, \
     extract(epoch from paused_since)::float8 as paused_since_unix, pause_error, stopped \
     from {schema}.ingest_position where slot = $1";

/// How many gaps slot `$1` has recorded, how many are not filled, and its open phantoms.
const SLOT_GAPS: &str = "select \
     (select count(*) from {schema}.slot_gap where slot = $1) as gaps, \
     (select count(*) from {schema}.slot_gap where slot = $1 and filled_at is null) as open_gaps, \
     (select count(*) from {schema}.phantom_event where slot = $1 and accepted_at is null) as phantoms, \
     (select max(scanned) from {schema}.slot_gap where slot = $1 and to_lsn is not null \
       and backfilled is null) as backfill_scanned";

/// Each subscriber's checkpoints summed, with its parked aggregates and first pause.
const SUBSCRIBERS: &str = "select c.subscriber_id, max(c.partitions) as partitions, \
     case when count(*) < max(c.partitions) then 0 else min(c.position) end as position, \
     sum(c.applied)::int8 as applied, \
     sum(c.duplicates)::int8 as duplicates, sum(c.stale)::int8 as stale, \
     sum(c.dead_lettered)::int8 as dead_lettered, \
     max(c.last_committed_at) as last_committed_at, \
     (select count(*) from {schema}.parked_aggregate p where p.subscriber_id = c.subscriber_id) as parked, \
     (select count(*) from {schema}.projection_pause z where z.subscriber_id = c.subscriber_id) as paused, \
     (select array[z.sqlstate, z.error, extract(epoch from z.since)::text] \
      from {schema}.projection_pause z where z.subscriber_id = c.subscriber_id \
      order by z.since limit 1) as first_pause, \
     case when exists (select 1 from {schema}.projection p where p.subscriber_id = c.subscriber_id) \
          then 'live' \
          when exists (select 1 from {schema}.rebuild r where r.subscriber_id = c.subscriber_id \
                       and r.state in ('running', 'aborting')) then 'rebuilding' \
          when exists (select 1 from {schema}.rebuild r where r.previous_subscriber = c.subscriber_id \
                       and r.state = 'switched') then 'retired' \
          else 'unused' end as serves, \
     (select p.name from {schema}.projection p where p.subscriber_id = c.subscriber_id \
      union select r.projection from {schema}.rebuild r where r.subscriber_id = c.subscriber_id \
      limit 1) as projection \
     from {schema}.checkpoint c group by c.subscriber_id order by c.subscriber_id";

/// When the first event after seq `$1` was committed (or appended).
const OLDEST_AFTER: &str =
    "select coalesce(committed_at, appended_at) as at from {schema}.event_log \
     where seq > $1 order by seq limit 1";

/// Per source: how far ingest has read it, and the commit position and time of its last
/// event at or before seq `$1` (a subscriber's lowest position).
const FOLDED: &str = "select i.source, max(i.lsn)::text as ingested, \
     (select l.source_lsn::text from {schema}.event_log l where l.source = i.source \
       and l.seq <= $1 order by l.seq desc limit 1) as last_lsn, \
     (select coalesce(l.committed_at, l.appended_at) from {schema}.event_log l \
       where l.source = i.source and l.seq <= $1 order by l.seq desc limit 1) as last_at \
     from {schema}.ingest_position i group by i.source order by i.source";

/// How many dead letters are in status `$1`.
const DEAD_LETTERS: &str = "select count(*) as letters from {schema}.dead_letter where status = $1";

/// Estimated claim rows in schema `$1` (reltuples is -1 until the first analyze; the
/// live count is kept from the start).
const CLAIM_ROWS: &str =
    "select greatest(c.reltuples::int8, coalesce(t.n_live_tup, 0), 0) as claims from pg_class c \
     join pg_namespace n on n.oid = c.relnamespace \
     left join pg_stat_all_tables t on t.relid = c.oid \
     where n.nspname = $1 and c.relname = 'processed_message'";

#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Every source: its slot and ingest position.
    pub sources: Vec<SourceStatus>,
    /// The first source's slot and ingest position (the only source's, usually).
    pub slot: Option<SlotStatus>,
    pub ingest: Option<IngestStatus>,
    pub event_log_head: i64,
    pub subscribers: Vec<SubscriberStatus>,
    pub dead_letters_open: i64,
    pub processed_message_rows: i64,
    pub rebuilds: Vec<RebuildStatus>,
    /// WAL ranges skipped by recreating a lost slot (`on_slot_lost = "recreate"`).
    pub slot_gaps: i64,
    /// Of them, those no backfill filled: events committed in them may be missing.
    pub slot_gaps_open: i64,
    /// Events read from an old primary past a failover's fork that the new one does
    /// not have, not accepted.
    pub phantoms: i64,
    /// Subscribers with paused partitions.
    pub paused: i64,
    /// The extra targets (`[targets.NAME]`) and whether they could be read; their
    /// subscribers, rebuilds and dead letters are in the lists above.
    pub targets: Vec<TargetReach>,
    /// The instances registered on the main target, oldest first.
    pub instances: Vec<InstanceStatus>,
    /// The instance that leads, if one does.
    pub leader: Option<uuid::Uuid>,
    /// The backend pid of an instance of an older release (before leases) that leads
    /// on the main target: it appends, but applies nothing on this schema, and the
    /// instances of this release run nothing beside it.
    pub older_release_leader_pid: Option<i32>,
    /// Every work unit (projection partition) and who owns it, on every target read.
    pub units: Vec<UnitStatus>,
}

/// An instance as `walfold status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceStatus {
    pub id: uuid::Uuid,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub started_at_unix: f64,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_s: f64,
    /// Whether any session of it is connected to the main target.
    pub connected: bool,
    /// The projections it may run (`None`: every one it knows).
    pub runs: Option<Vec<String>>,
    pub leads: bool,
}

/// A work unit as `walfold status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct UnitStatus {
    pub target: String,
    pub subscriber: String,
    pub partition: u32,
    pub projection: String,
    pub rebuild: bool,
    pub owner: Option<uuid::Uuid>,
    /// Taken back by the leader for a change of plan.
    pub held: bool,
}

/// Whether an extra target answered `walfold status`.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReach {
    pub name: String,
    pub reachable: bool,
    /// Why not, when it could not be read.
    pub error: Option<String>,
}

/// One target's part of the status: its subscribers, rebuilds and dead letters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetStatus {
    pub subscribers: Vec<SubscriberStatus>,
    pub units: Vec<UnitStatus>,
    pub rebuilds: Vec<RebuildStatus>,
    pub dead_letters_open: i64,
    pub processed_message_rows: i64,
}

impl Status {
    /// Adds an extra target's part (read with [`target_status`]).
    pub fn add(&mut self, part: TargetStatus) {
        self.paused += part
            .subscribers
            .iter()
            .filter(|s| s.paused.is_some())
            .count() as i64;
        self.subscribers.extend(part.subscribers);
        self.units.extend(part.units);
        self.rebuilds.extend(part.rebuilds);
        self.dead_letters_open += part.dead_letters_open;
        self.processed_message_rows += part.processed_message_rows;
    }
}

fn pause_status(partitions: i64, first: Option<Vec<Option<String>>>) -> Option<PauseStatus> {
    let first = first?;
    let field = |i: usize| first.get(i).cloned().flatten();
    (partitions > 0).then(|| PauseStatus {
        partitions,
        sqlstate: field(0),
        error: field(1).unwrap_or_default(),
        since_unix: field(2).and_then(|t| t.parse().ok()).unwrap_or(0.0),
    })
}

/// A rebuild in progress (or switched, with its retired table kept).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RebuildStatus {
    /// `main`, or the extra target the projection lives on.
    pub target: String,
    pub projection: String,
    pub subscriber: String,
    pub state: RebuildState,
    /// Events the new subscriber has gone through (applied, stale, duplicates, dead):
    /// those of its `event_types`, `aggregate_types` and `sources` only.
    pub replayed: i64,
    /// Positions of the log its slowest partition has read past, from the log's first
    /// event: every event, its filter's or not (the replay's progress).
    pub read: i64,
    /// Positions of the log between its slowest partition and the head, counted like
    /// `read` (`read + remaining` is the log's span).
    pub remaining: i64,
    /// Positions of the log read per second since the rebuild started.
    pub rate_per_s: f64,
    /// `remaining / rate`, while replaying.
    pub eta_s: Option<f64>,
    pub retired_table: String,
    /// The new subscriber's open (or retrying) dead letters: a caught-up rebuild waits
    /// for them to be retried or discarded.
    pub open_dead_letters: i64,
    /// Why its last switch-over failed (the daemon tries again), and when.
    pub switch_error: Option<String>,
    pub switch_failed_at_unix: Option<f64>,
    /// Started by itself for a changed definition (`on_definition_change = "rebuild"`).
    pub for_changed_definition: bool,
}

/// What a subscriber folds with, as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct DefinitionStatus {
    /// The SHA-256 of the normalised definition, in hex.
    pub digest: String,
    /// A Rust projection's own version (`Projection::definition_version`).
    pub version: Option<u32>,
    /// `first`, `rebuild` or `accepted`.
    pub origin: crate::definition::DefinitionOrigin,
    pub recorded_at_unix: f64,
    /// `accepted`: who (OS user, host, instance) and the digest it replaced.
    pub accepted_by: Option<String>,
    pub previous_digest: Option<String>,
}

/// One source: its slot on the source server, its ingest position in the target.
#[derive(Debug, Clone, Serialize)]
pub struct SourceStatus {
    pub name: String,
    pub slot_name: String,
    /// `None` when the slot is missing or the source could not be asked (`error`).
    pub slot: Option<SlotStatus>,
    pub ingest: Option<IngestStatus>,
    /// Why the source could not be asked.
    pub error: Option<String>,
    /// WAL ranges this source skipped by recreating its lost slot.
    pub slot_gaps: i64,
    /// Of them, those no backfill filled.
    pub slot_gaps_open: i64,
    /// Open phantoms of this source's slot.
    pub phantoms: i64,
    /// Rows a gap backfill that is running has read so far.
    pub gap_backfill_scanned: Option<i64>,
}

/// A source to report on: its name, slot, and its database if it could be reached.
pub struct SourceProbe<'a> {
    pub name: &'a str,
    pub slot: &'a str,
    pub client: Result<&'a Client, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SlotStatus {
    pub name: String,
    pub active: bool,
    pub confirmed_flush_lsn: Option<String>,
    /// WAL the server keeps for the slot (current WAL position − restart_lsn).
    pub retained_bytes: Option<i64>,
    /// WAL not yet confirmed (current WAL position − confirmed_flush_lsn).
    pub lag_bytes: Option<i64>,
    pub wal_status: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct IngestStatus {
    pub lsn: String,
    pub appended: i64,
    pub duplicates: i64,
    pub id_conflicts: i64,
    pub malformed: i64,
    pub ignored_changes: i64,
    pub updated_at_unix: Option<f64>,
    /// Set while ingest waits out an error of the target's environment (a revoked
    /// grant, disk full): it resumes by itself once that is fixed.
    pub paused: Option<IngestPause>,
}

/// Why ingest through a slot is paused, and since when.
#[derive(Debug, Clone, Serialize)]
pub struct IngestPause {
    pub since_unix: f64,
    pub error: String,
    /// Stopped on a definite error (the other sources go on): it does not resume by
    /// itself, but after the fix and a restart.
    pub stopped: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SubscriberStatus {
    pub subscriber: String,
    /// `main`, or the extra target (`[targets.NAME]`) holding its state.
    pub target: String,
    pub partitions: i32,
    /// Lowest position over the partitions.
    pub position: i64,
    /// Events in the log after the lowest position (an upper bound: filtered events count).
    pub lag_events: i64,
    /// While behind: the age of the oldest event after the lowest position (its source
    /// commit time, or when it was appended). An upper bound, like `lag_events`.
    pub lag_seconds: Option<f64>,
    pub applied: i64,
    pub duplicates: i64,
    pub stale: i64,
    pub dead_lettered: i64,
    pub parked_aggregates: i64,
    /// Set while partitions are paused by an error of the environment (a revoked grant,
    /// a dropped column, disk full): nothing is dead-lettered for it, and the partitions
    /// resume by themselves once it is fixed.
    pub paused: Option<PauseStatus>,
    /// `live` (serves a projection's table), `rebuilding` (replays into a shadow table),
    /// `retired` (served the table a rebuild switched away from; reads nothing more, its
    /// lag only grows until the rebuild is finished) or `unused` (no projection names it).
    pub serves: String,
    /// The projection it serves or rebuilds, as the registry records it (a projection
    /// removed from the config keeps its row: the CLI shows its subscriber as unused).
    pub projection: Option<String>,
    /// Per source, the position it has folded up to (read your own writes).
    pub folded: Vec<FoldedStatus>,
    /// The definition it folds with (`None`: not recorded yet).
    pub definition: Option<DefinitionStatus>,
}

/// How far a subscriber has folded one source: every event the source committed at or
/// before `lsn` is applied (or set aside) by each of its partitions.
#[derive(Debug, Clone, Serialize)]
pub struct FoldedStatus {
    pub source: String,
    /// Caught up: as far as ingest has read the source; behind: the commit of the last
    /// event its slowest partition has passed.
    pub lsn: String,
    /// How old the newest folded event's commit is (none folded yet: `None`).
    pub newest_commit_age_s: Option<f64>,
}

/// Why a subscriber's partitions are paused.
#[derive(Debug, Clone, Serialize)]
pub struct PauseStatus {
    pub partitions: i64,
    pub sqlstate: Option<String>,
    pub error: String,
    pub since_unix: f64,
}

/// Collects the status of a single source. `source` is the source database (for the
/// slot), `target` the database holding `schema`.
pub async fn status(
    source: &Client,
    target: &Client,
    schema: &Schema,
    slot: &str,
) -> Result<Status, StoreError> {
    let probe = SourceProbe {
        name: "default",
        slot,
        client: Ok(source),
    };
    status_of(target, schema, &[probe]).await
}

async fn read_slot(source: &Client, slot: &str) -> Result<Option<SlotStatus>, StoreError> {
    let slot_row = source
        .query_opt(SLOT, &[&slot])
        .await
        .map_err(StoreError::db("reading the slot"))?;
    slot_row
        .map(|r| {
            let r = r.of("pg_replication_slots");
            Ok(SlotStatus {
                name: slot.to_owned(),
                active: r.col("active")?,
                confirmed_flush_lsn: r
                    .col::<Option<PgLsn>>("confirmed_flush_lsn")?
                    .map(|l| Lsn::from(l).to_string()),
                retained_bytes: r.col("retained_bytes")?,
                lag_bytes: r.col("lag_bytes")?,
                wal_status: r.col("wal_status")?,
            })
        })
        .transpose()
}

impl FromRow for IngestStatus {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("ingest_position");
        Ok(IngestStatus {
            lsn: Lsn::from(r.col::<PgLsn>("lsn")?).to_string(),
            appended: r.col("appended")?,
            duplicates: r.col("duplicates")?,
            id_conflicts: r.col("id_conflicts")?,
            malformed: r.col("malformed")?,
            ignored_changes: r.col("ignored_changes")?,
            updated_at_unix: r.col("updated_at_unix")?,
            paused: match (
                r.col::<Option<f64>>("paused_since_unix")?,
                r.col::<Option<String>>("pause_error")?,
            ) {
                (Some(since_unix), Some(error)) => Some(IngestPause {
                    since_unix,
                    error,
                    stopped: r.col("stopped")?,
                }),
                _ => None,
            },
        })
    }
}

/// How long the slot of a source is asked for: a source that does not answer is
/// reported unreachable (and its gauges unknown), never a stall of the whole status.
pub const SOURCE_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// One source's slot (asked of the source) and ingest position (read from the target).
async fn source_status(
    target: &Client,
    schema: &Schema,
    probe: &SourceProbe<'_>,
) -> Result<SourceStatus, StoreError> {
    let (slot, error) = match &probe.client {
        Ok(source) => {
            match tokio::time::timeout(SOURCE_READ_TIMEOUT, read_slot(source, probe.slot)).await {
                Ok(Ok(slot)) => (slot, None),
                Ok(Err(e)) => (None, Some(e.to_string())),
                Err(_) => (
                    None,
                    Some(format!(
                        "did not answer within {} s",
                        SOURCE_READ_TIMEOUT.as_secs()
                    )),
                ),
            }
        }
        Err(e) => (None, Some(e.clone())),
    };
    let slot_name = probe.slot;
    let ingest = target
        .query_opt(&schema.sql(INGEST), &[&slot_name])
        .await
        .map_err(StoreError::db("reading the ingest position"))?
        .map(|r| IngestStatus::from_row(&r))
        .transpose()?;
    let gaps = target
        .query_one(&schema.sql(SLOT_GAPS), &[&slot_name])
        .await
        .map_err(StoreError::db("counting slot gaps"))?;
    let gaps = gaps.of("slot_gap");
    let (slot_gaps, slot_gaps_open, phantoms): (i64, i64, i64) = (
        gaps.col("gaps")?,
        gaps.col("open_gaps")?,
        gaps.col("phantoms")?,
    );
    let gap_backfill_scanned = gaps.col("backfill_scanned")?;
    Ok(SourceStatus {
        name: probe.name.to_owned(),
        slot_name: slot_name.to_owned(),
        slot,
        ingest,
        error,
        slot_gaps,
        slot_gaps_open,
        phantoms,
        gap_backfill_scanned,
    })
}

/// Collects the status of every source in `sources` and of the main target holding
/// `schema` (add the extra targets' parts with [`Status::add`]).
pub async fn status_of(
    target: &Client,
    schema: &Schema,
    sources: &[SourceProbe<'_>],
) -> Result<Status, StoreError> {
    // At once: each source that does not answer costs SOURCE_READ_TIMEOUT, not one each.
    let per_source: Vec<SourceStatus> = futures::future::try_join_all(
        sources
            .iter()
            .map(|probe| source_status(target, schema, probe)),
    )
    .await?;
    let part = target_status(target, schema, target, schema, "main").await?;
    let head = crate::log_order::head(target, schema).await?;
    let first = per_source.first();
    let mut status = Status {
        paused: 0,
        slot_gaps: per_source.iter().map(|p| p.slot_gaps).sum(),
        slot_gaps_open: per_source.iter().map(|p| p.slot_gaps_open).sum(),
        phantoms: per_source.iter().map(|p| p.phantoms).sum(),
        rebuilds: Vec::new(),
        slot: first.and_then(|p| p.slot.clone()),
        ingest: first.and_then(|p| p.ingest.clone()),
        sources: per_source,
        event_log_head: head,
        subscribers: Vec::new(),
        dead_letters_open: 0,
        processed_message_rows: 0,
        targets: Vec::new(),
        instances: crate::instance::seen(target, schema)
            .await?
            .into_iter()
            .map(|i| InstanceStatus {
                id: i.id,
                host: i.host,
                pid: i.pid,
                version: i.version,
                started_at_unix: i.started_at,
                heartbeat_age_s: i.silence.as_secs_f64(),
                connected: i.connected,
                runs: i.runs,
                leads: i.leads,
            })
            .collect(),
        leader: crate::leader::leader_row(target, schema).await?.owner,
        older_release_leader_pid: crate::leader::older_release_leader(target, schema).await?,
        units: Vec::new(),
    };
    status.add(part);
    Ok(status)
}

/// The gauges that describe the database, for the metrics scrape; `extra` holds the
/// extra targets' parts of the status (their subscribers' lag, parked aggregates, dead
/// letters). Lag is read for the `active` (target, subscriber) pairs only (those serving
/// a projection there now).
pub async fn metrics_reading(
    sources: &[SourceProbe<'_>],
    target: &Client,
    schema: &Schema,
    extra: Vec<TargetStatus>,
    active: &[(String, String)],
) -> Result<DatabaseReading, StoreError> {
    let mut s = status_of(target, schema, sources).await?;
    for part in extra {
        s.add(part);
    }
    let subscribers = s
        .subscribers
        .iter()
        .map(|sub| SubscriberReading {
            subscriber: sub.subscriber.clone(),
            lag: active
                .iter()
                .any(|(t, s)| *t == sub.target && *s == sub.subscriber)
                .then(|| Lag {
                    events: sub.lag_events,
                    seconds: sub.lag_seconds.unwrap_or(0.0),
                }),
            parked_aggregates: sub.parked_aggregates,
            folded: match &sub.projection {
                Some(projection)
                    if active
                        .iter()
                        .any(|(t, s)| *t == sub.target && *s == sub.subscriber) =>
                {
                    sub.folded
                        .iter()
                        .map(|f| Folded {
                            projection: projection.clone(),
                            source: f.source.clone(),
                            lsn: f.lsn.parse::<Lsn>().map_or(0, |l| l.0),
                            newest_commit_age_s: f.newest_commit_age_s,
                        })
                        .collect()
                }
                _ => Vec::new(),
            },
            definition: match (&sub.projection, &sub.definition) {
                (Some(projection), Some(d)) if matches!(&sub.serves[..], "live" | "rebuilding") => {
                    Some(DefinitionReading {
                        projection: projection.clone(),
                        digest: walfold_config::short_digest(&d.digest).to_owned(),
                        version: d.version,
                    })
                }
                _ => None,
            },
        })
        .collect();
    let rebuilding_for_definition = s
        .rebuilds
        .iter()
        .filter(|r| r.for_changed_definition && r.state == RebuildState::Running)
        .map(|r| r.projection.clone())
        .collect();
    let sources = s
        .sources
        .iter()
        .map(|source| SourceReading {
            name: source.name.clone(),
            slot_gaps: source.slot_gaps,
            slot_gaps_open: source.slot_gaps_open,
            phantoms: source.phantoms,
            slot: source.error.is_none().then(|| {
                let slot = source.slot.as_ref();
                SlotReading {
                    active: slot.is_some_and(|s| s.active),
                    retained_bytes: slot.and_then(|s| s.retained_bytes).unwrap_or(0),
                    lag_bytes: slot.and_then(|s| s.lag_bytes).unwrap_or(0),
                    confirmed_flush_lsn: slot
                        .and_then(|s| s.confirmed_flush_lsn.as_deref())
                        .and_then(|l| l.parse::<Lsn>().ok())
                        .map_or(0, |l| l.0 as i64),
                }
            }),
        })
        .collect();
    Ok(DatabaseReading {
        subscribers,
        sources,
        dead_letters_open: s.dead_letters_open,
        processed_message_rows: s.processed_message_rows,
        rebuilding_for_definition,
        rebuilds: s
            .rebuilds
            .iter()
            .map(|r| RebuildReading {
                projection: r.projection.clone(),
                subscriber: r.subscriber.clone(),
                read: r.read,
                remaining: if r.state == RebuildState::Running {
                    r.remaining
                } else {
                    0
                },
            })
            .collect(),
    })
}

/// The planner's estimate of the event log's rows, for the metrics scrape.
pub async fn event_log_estimate(target: &Client, schema: &Schema) -> Result<i64, StoreError> {
    Ok(target
        .query_one(EVENT_LOG_ESTIMATE, &[&schema.sql("{schema}.event_log")])
        .await
        .map_err(StoreError::db("estimating event_log"))?
        .of("pg_class")
        .col("rows")?)
}

/// The planner's row estimate of table `$1` (a name for `to_regclass`, bound as a value).
const EVENT_LOG_ESTIMATE: &str =
    "select greatest(reltuples, 0)::int8 as rows from pg_class where oid = to_regclass($1)";

/// The part of the status a target holds: `target` is the database holding `schema`
/// (the subscribers' state), `log` the one holding the event log in `log_schema` (the
/// same for the main target); `name` says which target it is.
pub async fn target_status(
    log: &Client,
    log_schema: &Schema,
    target: &Client,
    schema: &Schema,
    name: &str,
) -> Result<TargetStatus, StoreError> {
    let head = crate::log_order::head(log, log_schema).await?;
    // A partition without a checkpoint row has read nothing (it may still be
    // connecting): its subscriber's position is 0, never the others' minimum.
    let rows = target
        .query(&schema.sql(SUBSCRIBERS), &[])
        .await
        .map_err(StoreError::db("reading checkpoints"))?;
    let now = SystemTime::now();
    let oldest_after = log_schema.sql(OLDEST_AFTER);
    let mut subscribers: Vec<SubscriberStatus> = Vec::with_capacity(rows.len());
    for r in &rows {
        let r = r.of("checkpoint");
        let position: i64 = r.col("position")?;
        let lag_seconds = if head > position {
            log.query_opt(&oldest_after, &[&position])
                .await
                .map_err(StoreError::db("reading the oldest unapplied event"))?
                .map(|row| row.of("event_log").col::<Option<SystemTime>>("at"))
                .transpose()?
                .flatten()
                .map(|t| now.duration_since(t).map_or(0.0, |d| d.as_secs_f64()))
        } else {
            None
        };
        let mut folded = Vec::new();
        for f in log
            .query(&log_schema.sql(FOLDED), &[&position])
            .await
            .map_err(StoreError::db("reading how far subscribers have folded"))?
        {
            let f = f.of("event_log");
            let last_lsn: Option<String> = f.col("last_lsn")?;
            let last_at: Option<SystemTime> = f.col("last_at")?;
            folded.push(FoldedStatus {
                source: f.col("source")?,
                lsn: if position >= head {
                    f.col("ingested")?
                } else {
                    last_lsn.unwrap_or_else(|| "0/0".into())
                },
                newest_commit_age_s: last_at
                    .map(|t| now.duration_since(t).map_or(0.0, |d| d.as_secs_f64())),
            });
        }
        subscribers.push(SubscriberStatus {
            subscriber: r.col("subscriber_id")?,
            target: name.to_owned(),
            partitions: r.col("partitions")?,
            position,
            lag_events: (head - position).max(0),
            lag_seconds,
            applied: r.col("applied")?,
            duplicates: r.col("duplicates")?,
            stale: r.col("stale")?,
            dead_lettered: r.col("dead_lettered")?,
            parked_aggregates: r.col("parked")?,
            paused: pause_status(r.col("paused")?, r.col("first_pause")?),
            serves: r.col("serves")?,
            projection: r.col("projection")?,
            folded,
            definition: None,
        });
    }
    for d in crate::definition::all(target, schema).await? {
        if let Some(sub) = subscribers
            .iter_mut()
            .find(|s| s.subscriber == d.subscriber)
        {
            sub.definition = Some(DefinitionStatus {
                version: match &d.parts {
                    Some(walfold_config::FoldDefinition {
                        kind: walfold_config::FoldKind::Rust { version, .. },
                        ..
                    }) => Some(*version),
                    _ => None,
                },
                digest: d.digest,
                origin: d.origin,
                recorded_at_unix: d.recorded_at_unix,
                accepted_by: d.accepted_by,
                previous_digest: d.previous_digest,
            });
        }
    }
    let dead_letters_open: i64 = target
        .query_one(&schema.sql(DEAD_LETTERS), &[&DeadLetterStatus::Open])
        .await
        .map_err(StoreError::db("counting dead letters"))?
        .of("dead_letter")
        .col("letters")?;
    let processed_message_rows: i64 = target
        .query_one(CLAIM_ROWS, &[&schema.name()])
        .await
        .map_err(StoreError::db("estimating processed_message"))?
        .of("pg_class")
        .col("claims")?;
    let units = crate::work_unit::units(target, schema)
        .await?
        .into_iter()
        .map(|u| UnitStatus {
            target: name.to_owned(),
            subscriber: u.key.subscriber,
            partition: u.key.partition,
            projection: u.projection,
            rebuild: u.rebuild,
            owner: u.owner,
            held: u.held,
        })
        .collect();
    let mut rebuilds = Vec::new();
    let now_unix = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let open = crate::rebuild::open(target, schema).await?;
    // Progress is counted in positions of the log (read, remaining), never claims against
    // positions: a filtered projection claims a few of the events it reads past.
    let start = match open.is_empty() {
        true => 0,
        false => crate::log_order::start(log, log_schema).await?,
    };
    for r in open {
        let sub = subscribers.iter().find(|s| s.subscriber == r.subscriber);
        let replayed = sub.map_or(0, |s| s.applied + s.duplicates + s.stale + s.dead_lettered);
        let from = sub
            .map_or(start, |s| s.position.max(start))
            .min(head.max(start));
        let (read, remaining) = (from - start, head.max(start) - from);
        // While replaying; after the switch the subscriber is the live one.
        let elapsed = now_unix - r.requested_at_unix;
        let rate_per_s = if r.state == RebuildState::Running && elapsed > 0.0 {
            read as f64 / elapsed
        } else {
            0.0
        };
        let open_dead_letters =
            crate::dead_letter::DeadLetters::open_count(target, schema, &r.subscriber).await?;
        let for_changed_definition = crate::definition::changes(target, schema, &r.subscriber)
            .await?
            .iter()
            .any(|c| c.action == crate::definition::ChangeAction::Rebuild);
        rebuilds.push(RebuildStatus {
            target: name.to_owned(),
            open_dead_letters,
            switch_error: r.switch_error,
            switch_failed_at_unix: r.switch_failed_at_unix,
            for_changed_definition,
            eta_s: (r.state == RebuildState::Running && rate_per_s > 0.0)
                .then(|| remaining as f64 / rate_per_s),
            projection: r.projection,
            subscriber: r.subscriber,
            state: r.state,
            replayed,
            read,
            remaining,
            rate_per_s,
            retired_table: r.retired,
        });
    }
    Ok(TargetStatus {
        subscribers,
        units,
        rebuilds,
        dead_letters_open,
        processed_message_rows,
    })
}

/// The server's clock, as `walfold status --watch` heads its screen with it.
pub async fn server_time(client: &Client) -> Result<String, StoreError> {
    Ok(client
        .query_one(
            "select to_char(now() at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS \"UTC\"')",
            &[],
        )
        .await
        .map_err(StoreError::db("reading the server's time"))?
        .of("the server's time")
        .col(0)?)
}
