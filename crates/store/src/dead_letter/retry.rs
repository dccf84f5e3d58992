//! Retries of dead letters: an operator marks them `retrying`; the running projector of
//! their subscriber applies them through the normal claim and guard, in order per
//! aggregate, and records how each went.

use tokio_postgres::{Client, GenericClient, Row};
use walfold_event::{Aggregate, DeadLetterStatus, Reason};

use super::DeadLetters;
use crate::error::StoreError;
use crate::rebuild::RebuildState;
use crate::refusal::Refusal;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

/// Dead letter `$1` as a retry request reads it; `gap` when it is a version gap's own
/// letter (reason `$2`, no event).
const READ_ONE: &str = "select subscriber_id, aggregate_type, aggregate_id, status, seq, \
     reason = $2 and seq is null as gap \
     from {schema}.dead_letter where id = $1";

/// Sets dead letter `$1` to status `$2` (retrying).
const MARK_ONE: &str = "update {schema}.dead_letter set status = $2 where id = $1";

/// Sets the events of subscriber `$1`'s aggregate (`$2`, `$3`) with status `$5` (open)
/// to `$4` (retrying).
const MARK_CHAIN: &str = "update {schema}.dead_letter set status = $4 \
     where subscriber_id = $1 and aggregate_type = $2 \
     and aggregate_id = $3 and status = $5 and seq is not null";

/// Sets every dead letter with status `$3` (open) of a subscriber (`$1`, or any when
/// null) to `$2` (retrying): events, and gaps (reason `$5`), of subscribers something
/// runs (a projection's, or a rebuild's in state `$4`, running).
const MARK_ALL: &str = "update {schema}.dead_letter set status = $2 \
     where subscriber_id is not null \
     and (seq is not null or reason = $5) \
     and ($1::text is null or subscriber_id = $1) and status = $3 \
     and subscriber_id in (select subscriber_id from {schema}.projection union \
       select subscriber_id from {schema}.rebuild where state = $4)";

/// The aggregates of subscriber `$1` with events in status `$2` (retrying).
const RETRY_AGGREGATES: &str = "select distinct aggregate_type, aggregate_id \
     from {schema}.dead_letter \
     where subscriber_id = $1 and status = $2 and seq is not null";

/// At most `$5` events of subscriber `$1`'s aggregate (`$2`, `$3`) after seq `$4` with a
/// status in `$6`, in log order.
const RETRY_PAGE: &str = "select id, seq, aggregate_type, aggregate_id from {schema}.dead_letter \
     where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
       and status = any($6) and seq > $4 \
     order by seq, id limit $5";

/// Dead letter `$1` went through: status `$3` (retried), resolution `$2`.
const RETRIED: &str = "update {schema}.dead_letter set status = $3, resolution = $2, \
     resolved_at = now(), attempts = attempts + 1 where id = $1";

/// A retry of subscriber `$1`'s aggregate (`$2`, `$3`) failed at letter `$4` with error
/// `$5`: the chain in status `$7` (retrying) goes back to `$6` (open).
const RETRY_FAILED: &str = "update {schema}.dead_letter set status = $6, \
     error = case when id = $4 then $5 else error end, \
     attempts = attempts + (id = $4)::int, \
     last_failed_at = case when id = $4 then now() else last_failed_at end \
     where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
       and status = $7";

/// Which dead letters to send through their subscriber again.
#[derive(Debug, Clone)]
pub enum RetryRequest<'a> {
    /// This one, with the rest of its aggregate's chain (the events parked behind it).
    One(i64),
    /// Every open one of subscribers (of this one when given).
    All(Option<&'a str>),
}

/// An event waiting to be retried by its subscriber's projector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryItem {
    pub id: i64,
    pub seq: i64,
    pub aggregate_type: String,
    pub aggregate_id: String,
}

impl RetryItem {
    /// The aggregate of its event.
    pub fn aggregate(&self) -> Aggregate {
        Aggregate::new(&self.aggregate_type, &self.aggregate_id)
    }
}

impl FromRow for RetryItem {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("dead_letter");
        Ok(RetryItem {
            id: r.col("id")?,
            seq: r.col("seq")?,
            aggregate_type: r.col("aggregate_type")?,
            aggregate_id: r.col("aggregate_id")?,
        })
    }
}

/// A dead letter as a retry request reads it.
struct Requested {
    subscriber: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    status: DeadLetterStatus,
    seq: Option<i64>,
    gap: bool,
}

impl FromRow for Requested {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("dead_letter");
        Ok(Requested {
            subscriber: r.col("subscriber_id")?,
            aggregate_type: r.col("aggregate_type")?,
            aggregate_id: r.col("aggregate_id")?,
            status: r.col("status")?,
            seq: r.col("seq")?,
            gap: r.col("gap")?,
        })
    }
}

impl DeadLetters {
    /// Marks dead letters `retrying`; the running projector of their subscriber applies
    /// them through the normal claim and guard, in order per aggregate, and un-parks the
    /// aggregate when all succeeded. Returns how many were marked.
    pub(crate) async fn request_retry(
        client: &Client,
        schema: &Schema,
        request: RetryRequest<'_>,
    ) -> Result<u64, StoreError> {
        match request {
            RetryRequest::One(id) => {
                let row = client
                    .query_opt(&schema.sql(READ_ONE), &[&id, &Reason::VersionGap])
                    .await
                    .map_err(StoreError::db("reading a dead letter"))?
                    .ok_or_else(|| StoreError::from(Refusal::NoDeadLetter { id }))?;
                let letter = Requested::from_row(&row)?;
                if let (true, Some(_), DeadLetterStatus::Open) =
                    (letter.gap, &letter.subscriber, letter.status)
                {
                    // A version gap: its projector checks it again (and reopens it if the
                    // versions are still missing).
                    return client
                        .execute(&schema.sql(MARK_ONE), &[&id, &DeadLetterStatus::Retrying])
                        .await
                        .map_err(StoreError::db("requesting a retry"));
                }
                let (Some(subscriber), Some(kind), Some(aggregate), Some(_)) = (
                    letter.subscriber,
                    letter.aggregate_type,
                    letter.aggregate_id,
                    letter.seq,
                ) else {
                    return Err(Refusal::RejectedAtIngest { id }.into());
                };
                if letter.status != DeadLetterStatus::Open {
                    return Err(Refusal::LetterNotOpen {
                        id,
                        status: letter.status,
                    }
                    .into());
                }
                client
                    .execute(
                        &schema.sql(MARK_CHAIN),
                        &[
                            &subscriber,
                            &kind,
                            &aggregate,
                            &DeadLetterStatus::Retrying,
                            &DeadLetterStatus::Open,
                        ],
                    )
                    .await
                    .map_err(StoreError::db("requesting a retry"))
            }
            RetryRequest::All(subscriber) => client
                .execute(
                    &schema.sql(MARK_ALL),
                    &[
                        &subscriber,
                        &DeadLetterStatus::Retrying,
                        &DeadLetterStatus::Open,
                        &RebuildState::Running,
                        &Reason::VersionGap,
                    ],
                )
                .await
                .map_err(StoreError::db("requesting retries")),
        }
    }

    /// The aggregates of `subscriber` with a retry requested (`walfold dead-letters
    /// retry`), as (aggregate_type, aggregate_id).
    pub(crate) async fn retry_aggregates(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
    ) -> Result<Vec<Aggregate>, StoreError> {
        let rows = client
            .query(
                &schema.sql(RETRY_AGGREGATES),
                &[&subscriber, &DeadLetterStatus::Retrying],
            )
            .await
            .map_err(StoreError::db("reading retry requests"))?;
        rows.iter()
            .map(|r| {
                let r = r.of("dead_letter");
                Ok(Aggregate {
                    kind: r.col("aggregate_type")?,
                    id: r.col("aggregate_id")?,
                })
            })
            .collect()
    }

    /// The next `limit` dead letters of an aggregate to retry, after `after_seq`: every
    /// open or retrying one, in log order (the aggregate's whole chain goes through).
    pub(crate) async fn retry_page(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
        aggregate: &Aggregate,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<RetryItem>, StoreError> {
        let rows = client
            .query(
                &schema.sql(RETRY_PAGE),
                &[
                    &subscriber,
                    &aggregate.kind,
                    &aggregate.id,
                    &after_seq,
                    &limit,
                    &DeadLetterStatus::OPEN_OR_RETRYING,
                ],
            )
            .await
            .map_err(StoreError::db("reading dead letters to retry"))?;
        Ok(RetryItem::from_rows(&rows)?)
    }

    /// Records that a retried dead letter went through (in the transaction that applied it).
    pub(crate) async fn retried(
        tx: &impl GenericClient,
        schema: &Schema,
        id: i64,
        outcome: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &schema.sql(RETRIED),
            &[&id, &outcome, &DeadLetterStatus::Retried],
        )
        .await
        .map_err(StoreError::db("resolving a retried dead letter"))?;
        Ok(())
    }

    /// A retry failed again at dead letter `head`: it gets the new error, and the
    /// aggregate's chain is open again (the aggregate stays parked).
    pub(crate) async fn retry_failed(
        client: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
        aggregate: &Aggregate,
        head: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        client
            .execute(
                &schema.sql(RETRY_FAILED),
                &[
                    &subscriber,
                    &aggregate.kind,
                    &aggregate.id,
                    &head,
                    &error,
                    &DeadLetterStatus::Open,
                    &DeadLetterStatus::Retrying,
                ],
            )
            .await
            .map_err(StoreError::db("recording a failed retry"))?;
        Ok(())
    }
}
