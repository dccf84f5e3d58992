//! Read your own writes: the tables `wait_for` reads beside the log and the checkpoints
//! (`wait_scope`: what each subscriber folds; `source_wal`: each source's WAL position as
//! last read there), and the call of `wait_for` itself, for the HTTP `/wait`. The rule
//! (when a projection has folded up to a source position) is the SQL function's alone
//! (`migrations/20261208200100_read_your_writes.sql`): the SQL caller and the HTTP one get
//! the same answer from the same place.

use std::time::{Duration, SystemTime};

use tokio_postgres::types::PgLsn;
use tokio_postgres::GenericClient;
use uuid::Uuid;
use walfold_event::Lsn;
use walfold_pg::RowExt;

use crate::error::StoreError;
use crate::event_log::Filter;
use crate::schema::Schema;

/// Advisory-lock class a waiter holds shared (keyed by `hashtext(source)`) while it waits
/// for ingest to read a source further (`'walW'`; the SQL function spells it too).
pub const WAITER_LOCK: i32 = 0x7761_6c57;

/// Whether a waiter holds the lock: the try of the exclusive lock fails (when it
/// succeeds it is let go at once, with the statement's transaction).
const WAITERS: &str = "select not pg_try_advisory_xact_lock($1::int4, hashtext($2)) as waiting";

/// Records what subscriber `$1` folds: its partitions' filters.
const RECORD_SCOPE: &str = "insert into {schema}.wait_scope as s \
     (subscriber_id, event_types, aggregate_types, sources) values ($1, $2, $3, $4) \
     on conflict (subscriber_id) do update set event_types = excluded.event_types, \
     aggregate_types = excluded.aggregate_types, sources = excluded.sources, \
     updated_at = now() \
     where (s.event_types, s.aggregate_types, s.sources) is distinct from \
       (excluded.event_types, excluded.aggregate_types, excluded.sources)";

/// Records source `$1`'s WAL position `$2`, read on the source after `$3`.
const RECORD_WAL: &str = "insert into {schema}.source_wal as w (source, lsn, read_at) \
     values ($1, $2, $3) on conflict (source) do update \
     set lsn = excluded.lsn, read_at = excluded.read_at";

/// The target's clock now (taken before the source is read).
const NOW: &str = "select clock_timestamp() as now";

/// The source's WAL position: written on a primary, replayed on a standby.
pub const SOURCE_WAL: &str = "select case when pg_is_in_recovery() \
     then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end as lsn";

/// The wait itself.
const WAIT_FOR: &str = "select status, reason, subscriber_id, event_id, waited_ms \
     from {schema}.wait_for($1, $2, make_interval(secs => $3), $4, $5, $6)";

/// Records what `subscriber` folds (its read filter; the partition is not part of it).
pub async fn record_scope(
    client: &impl GenericClient,
    schema: &Schema,
    subscriber: &str,
    filter: &Filter,
) -> Result<(), StoreError> {
    client
        .execute(
            &schema.sql(RECORD_SCOPE),
            &[
                &subscriber,
                &filter.event_types,
                &filter.aggregate_types,
                &filter.sources,
            ],
        )
        .await
        .map_err(StoreError::db("recording what a subscriber folds"))?;
    Ok(())
}

/// The target's clock now: a source position read after it is at least as new.
pub async fn target_now(client: &impl GenericClient) -> Result<SystemTime, StoreError> {
    Ok(client
        .query_one(NOW, &[])
        .await
        .map_err(StoreError::db("reading the target's clock"))?
        .of("clock_timestamp")
        .col("now")?)
}

/// Records `source`'s WAL position `lsn`, read there after `read_at` (the target's clock).
pub async fn record_source_wal(
    client: &impl GenericClient,
    schema: &Schema,
    source: &str,
    lsn: Lsn,
    read_at: SystemTime,
) -> Result<(), StoreError> {
    let lsn: PgLsn = lsn.into();
    client
        .execute(&schema.sql(RECORD_WAL), &[&source, &lsn, &read_at])
        .await
        .map_err(StoreError::db("recording the source's WAL position"))?;
    Ok(())
}

/// Whether a `wait_for` waits for ingest to read `source` further right now: then the
/// appender records a position-only advance at once instead of every 10 s. One
/// statement, no lock kept, no WAL.
pub async fn ingest_awaited(client: &impl GenericClient, source: &str) -> Result<bool, StoreError> {
    Ok(client
        .query_one(WAITERS, &[&WAITER_LOCK, &source])
        .await
        .map_err(StoreError::db("looking for waiters"))?
        .of("pg_locks")
        .col("waiting")?)
}

/// What a wait asks.
#[derive(Debug, Clone)]
pub struct WaitRequest {
    pub projection: String,
    pub lsn: Lsn,
    pub timeout: Duration,
    /// The source the position is of; `None`: the only one.
    pub source: Option<String>,
    /// The aggregate read, to narrow the dead-letter and park check to it.
    pub aggregate: Option<(String, String)>,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// Every event up to the position is in the read model.
    Folded,
    /// It was not, within the timeout.
    Timeout,
    /// A partition that still has an event up to the position is paused.
    Paused,
    /// An event up to the position waits behind its parked aggregate.
    Parked,
    /// An event up to the position is an open dead letter.
    DeadLetter,
}

impl WaitStatus {
    fn parse(s: &str) -> Option<WaitStatus> {
        Some(match s {
            "folded" => WaitStatus::Folded,
            "timeout" => WaitStatus::Timeout,
            "paused" => WaitStatus::Paused,
            "parked" => WaitStatus::Parked,
            "dead_letter" => WaitStatus::DeadLetter,
            _ => return None,
        })
    }

    /// As the SQL function spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitStatus::Folded => "folded",
            WaitStatus::Timeout => "timeout",
            WaitStatus::Paused => "paused",
            WaitStatus::Parked => "parked",
            WaitStatus::DeadLetter => "dead_letter",
        }
    }
}

/// The answer of a wait.
#[derive(Debug, Clone)]
pub struct WaitAnswer {
    pub status: WaitStatus,
    /// Why it is not folded (or what it still waited for at the timeout).
    pub reason: Option<String>,
    /// The subscriber serving the projection at the answer.
    pub subscriber: String,
    /// The event a dead letter or park concerns.
    pub event_id: Option<Uuid>,
    pub waited_ms: f64,
}

/// Waits through `wait_for` (on a connection to the main target; it holds the connection
/// for the wait). An unknown projection or source, or a position from the future, is an
/// error of the statement ([`StoreError::Db`], SQLSTATE 42704 or 22023).
pub async fn wait_for(
    client: &impl GenericClient,
    schema: &Schema,
    request: &WaitRequest,
) -> Result<WaitAnswer, StoreError> {
    let lsn: PgLsn = request.lsn.into();
    let (aggregate_type, aggregate_id) = match &request.aggregate {
        Some((t, id)) => (Some(t.as_str()), Some(id.as_str())),
        None => (None, None),
    };
    let row = client
        .query_one(
            &schema.sql(WAIT_FOR),
            &[
                &request.projection,
                &lsn,
                &request.timeout.as_secs_f64(),
                &request.source,
                &aggregate_type,
                &aggregate_id,
            ],
        )
        .await
        .map_err(StoreError::db("waiting for a projection"))?;
    let r = row.of("wait_for");
    let status: String = r.col("status")?;
    Ok(WaitAnswer {
        status: WaitStatus::parse(&status).ok_or_else(|| StoreError::MigrationHistory {
            schema: schema.name().to_owned(),
            reason: format!(
                "wait_for answered {status:?}, which this release does not know: run the release that migrated the schema"
            ),
        })?,
        reason: r.col("reason")?,
        subscriber: r.col("subscriber_id")?,
        event_id: r.col("event_id")?,
        waited_ms: r.col("waited_ms")?,
    })
}
