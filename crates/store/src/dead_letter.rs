//! Dead letters: rows and events set aside with their reason, never dropped. Also the
//! parked aggregates whose later events wait behind a dead-lettered one.

use serde_json::Value;
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, GenericClient, Statement};
use uuid::Uuid;

use crate::error::StoreError;
use crate::lsn::Lsn;
use crate::q;

/// Why something was set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An outbox row that cannot become an event (bad ID, missing column, bad version).
    Malformed,
    /// An event ID already in the log with different content.
    IdConflict,
    /// A projection kept failing on the event.
    ProjectionFailed,
    /// The event's aggregate is parked for the subscriber behind an earlier failure.
    AggregateParked,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::IdConflict => "id_conflict",
            Reason::ProjectionFailed => "projection_failed",
            Reason::AggregateParked => "aggregate_parked",
        }
    }
}

/// One dead-letter entry to record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// `None` for rows rejected at ingest.
    pub subscriber_id: Option<String>,
    pub event_id: Option<Uuid>,
    pub seq: Option<i64>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub reason: Reason,
    pub error: String,
    /// The raw outbox row or the event, as JSON.
    pub raw: Option<Value>,
    /// For `id_conflict`: the event already in the log.
    pub existing: Option<Value>,
    pub attempts: i32,
    pub source_lsn: Option<Lsn>,
    /// With `source_lsn`, identifies a row rejected at ingest across replays.
    pub source_ordinal: Option<i32>,
}

impl DeadLetter {
    /// An event set aside at ingest, identified by its place in the source WAL.
    pub(crate) fn ingest(event: &crate::event::NewEvent, reason: Reason, error: String) -> Self {
        DeadLetter {
            subscriber_id: None,
            event_id: Some(event.id),
            seq: None,
            aggregate_type: Some(event.aggregate_type.clone()),
            aggregate_id: Some(event.aggregate_id.clone()),
            reason,
            error,
            raw: Some(crate::event_log::event_json(event)),
            existing: None,
            attempts: 1,
            source_lsn: Some(event.source_lsn),
            source_ordinal: Some(event.source_ordinal),
        }
    }

    /// An event the event log refused (a value PostgreSQL cannot store).
    pub fn refused(event: &crate::event::NewEvent, error: &str) -> DeadLetter {
        Self::ingest(
            event,
            Reason::Malformed,
            format!("the event log refused the event: {error}"),
        )
    }
}

/// Prepared statements for dead letters and parking.
#[derive(Clone)]
pub struct DeadLetters {
    insert: Statement,
    park: Statement,
}

impl DeadLetters {
    pub async fn prepare(client: &Client, schema: &str) -> Result<Self, StoreError> {
        let s = q(schema);
        let insert = client
            .prepare(&format!(
                "insert into {s}.dead_letter (subscriber_id, event_id, seq, aggregate_type, \
                 aggregate_id, reason, error, raw, existing, attempts, source_lsn, source_ordinal) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                 on conflict (source_lsn, source_ordinal) \
                 where subscriber_id is null and source_ordinal is not null do nothing \
                 returning id"
            ))
            .await
            .map_err(StoreError::db("preparing dead-letter insert"))?;
        let park = client
            .prepare(&format!(
                "insert into {s}.parked_aggregate (subscriber_id, aggregate_type, aggregate_id, \
                 dead_letter_id) values ($1, $2, $3, $4) on conflict do nothing"
            ))
            .await
            .map_err(StoreError::db("preparing park"))?;
        Ok(DeadLetters { insert, park })
    }

    /// Records `dl` (in the caller's transaction) and returns its ID; `None` when this
    /// ingest rejection was already recorded (a replay of the same WAL).
    pub async fn record(
        &self,
        tx: &impl GenericClient,
        dl: &DeadLetter,
    ) -> Result<Option<i64>, StoreError> {
        let lsn: Option<PgLsn> = dl.source_lsn.map(Into::into);
        let row = tx
            .query_opt(
                &self.insert,
                &[
                    &dl.subscriber_id,
                    &dl.event_id,
                    &dl.seq,
                    &dl.aggregate_type,
                    &dl.aggregate_id,
                    &dl.reason.as_str(),
                    &dl.error,
                    &dl.raw,
                    &dl.existing,
                    &dl.attempts,
                    &lsn,
                    &dl.source_ordinal,
                ],
            )
            .await
            .map_err(StoreError::db("recording a dead letter"))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Parks an aggregate for a subscriber (in the caller's transaction).
    pub async fn park(
        &self,
        tx: &impl GenericClient,
        subscriber: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        dead_letter_id: i64,
    ) -> Result<(), StoreError> {
        tx.execute(
            &self.park,
            &[&subscriber, &aggregate_type, &aggregate_id, &dead_letter_id],
        )
        .await
        .map_err(StoreError::db("parking an aggregate"))?;
        Ok(())
    }

    /// The aggregates parked for `subscriber`, as (aggregate_type, aggregate_id).
    pub async fn parked(
        client: &Client,
        schema: &str,
        subscriber: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select aggregate_type, aggregate_id from {}.parked_aggregate \
                     where subscriber_id = $1",
                    q(schema)
                ),
                &[&subscriber],
            )
            .await
            .map_err(StoreError::db("loading parked aggregates"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// A dead letter as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadLetterEntry {
    pub id: i64,
    pub subscriber_id: Option<String>,
    pub event_id: Option<Uuid>,
    pub seq: Option<i64>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub reason: String,
    pub error: String,
    pub attempts: i32,
    pub status: String,
    pub first_failed_at_unix: f64,
    pub last_failed_at_unix: f64,
    pub raw: Option<Value>,
    pub existing: Option<Value>,
    pub resolution: Option<String>,
}

impl DeadLetters {
    /// Dead letters, newest first: open ones unless `all`; of one subscriber when given
    /// (`ingest` selects rows rejected before any subscriber).
    pub async fn list(
        client: &Client,
        schema: &str,
        subscriber: Option<&str>,
        all: bool,
        limit: i64,
    ) -> Result<Vec<DeadLetterEntry>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select id, subscriber_id, event_id, seq, aggregate_type, aggregate_id, reason, \
                     error, attempts, status, extract(epoch from first_failed_at)::float8, \
                     extract(epoch from last_failed_at)::float8, raw, existing, resolution \
                     from {}.dead_letter \
                     where ($1 or status = 'open') \
                       and ($2::text is null or subscriber_id = $2 \
                            or ($2 = 'ingest' and subscriber_id is null)) \
                     order by id desc limit $3",
                    q(schema)
                ),
                &[&all, &subscriber, &limit],
            )
            .await
            .map_err(StoreError::db("listing dead letters"))?;
        Ok(rows
            .iter()
            .map(|r| DeadLetterEntry {
                id: r.get(0),
                subscriber_id: r.get(1),
                event_id: r.get(2),
                seq: r.get(3),
                aggregate_type: r.get(4),
                aggregate_id: r.get(5),
                reason: r.get(6),
                error: r.get(7),
                attempts: r.get(8),
                status: r.get(9),
                first_failed_at_unix: r.get(10),
                last_failed_at_unix: r.get(11),
                raw: r.get(12),
                existing: r.get(13),
                resolution: r.get(14),
            })
            .collect())
    }

    /// Marks an open dead letter discarded with the operator's reason. Returns false when
    /// there is no open dead letter with that ID. A parked aggregate stays parked.
    pub async fn discard(
        client: &Client,
        schema: &str,
        id: i64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let n = client
            .execute(
                &format!(
                    "update {}.dead_letter set status = 'discarded', resolution = $2, \
                     resolved_at = now() where id = $1 and status = 'open'",
                    q(schema)
                ),
                &[&id, &reason],
            )
            .await
            .map_err(StoreError::db("discarding a dead letter"))?;
        Ok(n == 1)
    }
}
