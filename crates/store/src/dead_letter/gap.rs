//! A strict projection's version gaps: events that arrived ahead of a missing version
//! wait as `waiting` dead letters behind a park; a gap that outlives its timeout becomes
//! an open dead letter of its own (no event: the versions are missing).

use tokio_postgres::{Client, GenericClient, Row};
use walfold_event::{Aggregate, DeadLetter, DeadLetterStatus, Reason};

use super::retry::RetryItem;
use super::DeadLetters;
use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

/// Subscriber `$1`'s events of the aggregates (`$2[i]`, `$3[i]`) with status `$4`
/// (waiting) and reason `$5` (version gap), in log order.
const WAITING: &str = "select d.id, d.seq, d.aggregate_type, d.aggregate_id \
     from {schema}.dead_letter d \
     join unnest($2::text[], $3::text[]) as a(t, i) \
       on d.aggregate_type = a.t and d.aggregate_id = a.i \
     where d.subscriber_id = $1 and d.reason = $5 \
       and d.status = $4 and d.seq is not null \
     order by d.seq, d.id";

/// Deletes the letters `$1` that still have status `$2` (waiting).
const FORGET_WAITING: &str = "delete from {schema}.dead_letter where id = any($1) and status = $2";

/// Points subscriber `$1`'s park of aggregate (`$2`, `$3`) at letter `$4`, if it points
/// at a letter with status `$5` (waiting).
const REPARK: &str =
    "update {schema}.parked_aggregate p set dead_letter_id = $4, parked_at = now() \
     where p.dead_letter_id <> $4 and p.subscriber_id = $1 \
       and p.aggregate_key = {schema}.aggregate_key($2, $3) \
       and exists (select 1 from {schema}.dead_letter d where d.id = p.dead_letter_id \
                   and d.status = $5)";

/// Subscriber `$1`'s parks whose letter has reason `$2` (version gap).
const GAPS: &str = "select p.aggregate_type, p.aggregate_id, d.id, d.status, \
     extract(epoch from p.parked_at)::float8 as since_unix \
     from {schema}.parked_aggregate p join {schema}.dead_letter d on d.id = p.dead_letter_id \
     where p.subscriber_id = $1 and d.reason = $2";

/// Points subscriber `$1`'s park of aggregate (`$2`, `$4`) at letter `$3`.
const POINT_PARK: &str = "update {schema}.parked_aggregate set dead_letter_id = $3 \
     where subscriber_id = $1 and aggregate_key = {schema}.aggregate_key($2, $4)";

/// Resolves subscriber `$1`'s gap letters (reason `$8`, no event) of aggregate (`$2`,
/// `$3`) with a status in `$7`, with resolution `$4`: status `$6` (retried), except that
/// a letter with status `$5` (discarded) stays so, with the operator's reason kept.
const RESOLVE_GAP: &str = "update {schema}.dead_letter set \
     status = case when status = $5 then status else $6 end, \
     resolution = case when status = $5 \
       then concat_ws('; ', resolution, $4::text) else $4::text end, \
     resolved_at = now() \
     where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
       and reason = $8 and seq is null \
       and status = any($7)";

/// Gap letter `$1` in status `$4` (retrying) is open again (`$3`) with error `$2`.
const STILL_OPEN: &str = "update {schema}.dead_letter set status = $3, error = $2, \
     attempts = attempts + 1, last_failed_at = now() where id = $1 and status = $4";

/// A strict projection's gap: an aggregate whose events wait for a missing version.
#[derive(Debug, Clone, PartialEq)]
pub struct Gap {
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// The dead letter its park points at: the first waiting event's, or the gap's own
    /// once it outlived `gap_timeout`.
    pub letter: i64,
    /// That letter's status (`Waiting`, or `Open`, `Retrying`, `Discarded` for the gap's).
    pub status: DeadLetterStatus,
    /// When the gap opened.
    pub since_unix: f64,
}

impl Gap {
    /// The aggregate that waits.
    pub fn aggregate(&self) -> Aggregate {
        Aggregate::new(&self.aggregate_type, &self.aggregate_id)
    }
}

impl FromRow for Gap {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("parked_aggregate");
        Ok(Gap {
            aggregate_type: r.col("aggregate_type")?,
            aggregate_id: r.col("aggregate_id")?,
            letter: r.col("id")?,
            status: r.col("status")?,
            since_unix: r.col("since_unix")?,
        })
    }
}

impl DeadLetters {
    /// The events of `aggregates` (as (type, id)) waiting for a missing version for
    /// `subscriber`, in log order.
    pub(crate) async fn waiting(
        tx: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
        aggregates: &[Aggregate],
    ) -> Result<Vec<RetryItem>, StoreError> {
        if aggregates.is_empty() {
            return Ok(Vec::new());
        }
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates
            .iter()
            .map(|a| (a.kind.as_str(), a.id.as_str()))
            .unzip();
        let rows = tx
            .query(
                &schema.sql(WAITING),
                &[
                    &subscriber,
                    &types,
                    &ids,
                    &DeadLetterStatus::Waiting,
                    &Reason::VersionGap,
                ],
            )
            .await
            .map_err(StoreError::db("reading waiting events"))?;
        Ok(RetryItem::from_rows(&rows)?)
    }

    /// Deletes the letters of waiting events that went through, in the caller's
    /// transaction (after any park pointing at them moved).
    pub(crate) async fn forget_waiting(
        tx: &impl GenericClient,
        schema: &Schema,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        tx.execute(
            &schema.sql(FORGET_WAITING),
            &[&ids, &DeadLetterStatus::Waiting],
        )
        .await
        .map_err(StoreError::db("clearing waiting events"))?;
        Ok(())
    }

    /// Points a gap's park at its first waiting event, unless it points at the gap's own
    /// letter (an open gap); the gap's age counts from then (a later version is missing
    /// now).
    pub(crate) async fn repark_waiting(
        tx: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
        aggregate: &Aggregate,
        letter: i64,
    ) -> Result<(), StoreError> {
        tx.execute(
            &schema.sql(REPARK),
            &[
                &subscriber,
                &aggregate.kind,
                &aggregate.id,
                &letter,
                &DeadLetterStatus::Waiting,
            ],
        )
        .await
        .map_err(StoreError::db("parking"))?;
        Ok(())
    }

    /// The gaps of `subscriber`'s strict projection.
    pub(crate) async fn gaps(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
    ) -> Result<Vec<Gap>, StoreError> {
        let rows = client
            .query(&schema.sql(GAPS), &[&subscriber, &Reason::VersionGap])
            .await
            .map_err(StoreError::db("reading version gaps"))?;
        Ok(Gap::from_rows(&rows)?)
    }

    /// A gap outlived its timeout: records it as an open dead letter (no event: the
    /// versions are missing) and points the park at it, in the caller's transaction.
    pub(crate) async fn open_gap(
        &self,
        tx: &impl GenericClient,
        subscriber: &str,
        gap: &Gap,
        error: &str,
    ) -> Result<(), StoreError> {
        let letter = DeadLetter {
            subscriber_id: Some(subscriber.to_owned()),
            event_id: None,
            seq: None,
            aggregate_type: Some(gap.aggregate_type.clone()),
            aggregate_id: Some(gap.aggregate_id.clone()),
            reason: Reason::VersionGap,
            error: error.to_owned(),
            raw: None,
            existing: None,
            attempts: 0,
            source_lsn: None,
            origin: None,
        };
        let id = self.record(tx, &letter).await?;
        tx.execute(
            &self.schema.sql(POINT_PARK),
            &[&subscriber, &gap.aggregate_type, &id, &gap.aggregate_id],
        )
        .await
        .map_err(StoreError::db("recording a version gap"))?;
        Ok(())
    }

    /// Resolves the open gap letter of an aggregate whose missing versions arrived.
    pub(crate) async fn resolve_gap(
        tx: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
        aggregate: &Aggregate,
        resolution: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &schema.sql(RESOLVE_GAP),
            &[
                &subscriber,
                &aggregate.kind,
                &aggregate.id,
                &resolution,
                &DeadLetterStatus::Discarded,
                &DeadLetterStatus::Retried,
                &[
                    DeadLetterStatus::Open,
                    DeadLetterStatus::Retrying,
                    DeadLetterStatus::Discarded,
                ]
                .as_slice(),
                &Reason::VersionGap,
            ],
        )
        .await
        .map_err(StoreError::db("resolving a version gap"))?;
        Ok(())
    }

    /// A retried gap whose versions are still missing is open again.
    pub(crate) async fn gap_still_open(
        tx: &impl GenericClient,
        schema: &Schema,
        letter: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &schema.sql(STILL_OPEN),
            &[
                &letter,
                &error,
                &DeadLetterStatus::Open,
                &DeadLetterStatus::Retrying,
            ],
        )
        .await
        .map_err(StoreError::db("reopening a version gap"))?;
        Ok(())
    }
}
