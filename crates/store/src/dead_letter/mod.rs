//! Dead letters: rows and events set aside with their reason, never dropped. Also the
//! parked aggregates whose later events wait behind a dead-lettered one (keyed by a hash
//! of the aggregate, so an ID of any length can be parked). Retries are in `retry`, a
//! strict projection's version gaps in `gap`.

mod gap;
mod retry;

use std::borrow::Cow;

use serde_json::Value;
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, GenericClient, Row, Statement};
use uuid::Uuid;
use walfold_event::json::{escape_nul, storable};
use walfold_event::{Aggregate, DeadLetter, DeadLetterStatus, Reason, RowOrigin};

use crate::error::StoreError;
use crate::jsonb;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

pub use gap::Gap;
pub use retry::{RetryItem, RetryRequest};

/// Records dead letter `$1`…`$15` (source `$16`, `default` when null); returns its ID.
/// Any conflict is on one of the ingest identities (a change, a backfilled row): that
/// row was recorded before. A row read both by the stream and by `walfold backfill` has
/// one identity of each kind: the same reason and raw row recorded under the other kind
/// is that row, recorded before.
const INSERT: &str =
    "insert into {schema}.dead_letter (subscriber_id, event_id, seq, aggregate_type, \
     aggregate_id, reason, error, raw, existing, attempts, source_lsn, change_lsn, \
     change_index, row_digest, status, source, change_element) \
     select $1::text, $2::uuid, $3::int8, $4::text, $5::text, $6::text, $7::text, \
     $8::jsonb, $9::jsonb, $10::int4, $11::pg_lsn, $12::pg_lsn, $13::int4, $14::uuid, \
     $15::text, coalesce($16::text, 'default'), $17::int4 \
     where not exists (select 1 from {schema}.dead_letter d where $1::text is null \
       and d.subscriber_id is null and d.reason = $6::text and d.raw = $8::jsonb \
       and d.source = coalesce($16::text, 'default') \
       and (($12::pg_lsn is not null and d.row_digest is not null) \
         or ($14::uuid is not null and d.change_lsn is not null))) \
     on conflict do nothing returning id";

/// Parks aggregate (`$2`, `$3`) for subscriber `$1` behind dead letter `$4`.
const PARK: &str =
    "insert into {schema}.parked_aggregate (subscriber_id, aggregate_type, aggregate_id, \
     dead_letter_id) values ($1, $2, $3, $4) on conflict do nothing";

/// Releases aggregate (`$2`, `$3`) of subscriber `$1`.
const UNPARK: &str = "delete from {schema}.parked_aggregate where subscriber_id = $1 \
     and aggregate_key = {schema}.aggregate_key($2, $3)";

/// Subscriber `$1`'s parked aggregates; `gap` when they wait for a missing version
/// (their letter's reason is `$2`, `version_gap`).
const PARKED: &str = "select p.aggregate_type, p.aggregate_id, d.reason = $2 as gap \
     from {schema}.parked_aggregate p join {schema}.dead_letter d on d.id = p.dead_letter_id \
     where p.subscriber_id = $1";

/// Subscriber `$1`'s aggregates parked behind a letter with status `$2` (discarded) and
/// a reason other than `$3` (version gap, which strict projections judge themselves),
/// with no letter of the aggregate left in a status in `$4` (unresolved).
const DISCARDED_PARKS: &str = "select p.aggregate_type, p.aggregate_id \
     from {schema}.parked_aggregate p join {schema}.dead_letter d on d.id = p.dead_letter_id \
     where p.subscriber_id = $1 and d.status = $2 and d.reason <> $3 \
       and not exists (select 1 from {schema}.dead_letter o \
                       where o.subscriber_id = p.subscriber_id \
                         and o.aggregate_type = p.aggregate_type \
                         and o.aggregate_id = p.aggregate_id and o.status = any($4))";

/// Subscriber `$1`'s dead letters with a status in `$2`.
const COUNT: &str = "select count(*) as letters from {schema}.dead_letter \
     where subscriber_id = $1 and status = any($2)";

/// Dead letters newest first, at most `$3`: every one when `$1`, else those with status
/// `$4` (open); of subscriber `$2` when not null (`ingest`: those rejected at ingest).
const LIST: &str =
    "select id, subscriber_id, event_id, seq, aggregate_type, aggregate_id, reason, \
     error, attempts, status, \
     extract(epoch from first_failed_at)::float8 as first_failed_at_unix, \
     extract(epoch from last_failed_at)::float8 as last_failed_at_unix, \
     raw, existing, resolution, source from {schema}.dead_letter \
     where ($1 or status = $4) \
       and ($2::text is null or subscriber_id = $2 \
            or ($2 = 'ingest' and subscriber_id is null)) \
     order by id desc limit $3";

/// Sets dead letter `$1` to status `$3` (discarded) with resolution `$2`, if its status
/// is `$4` (open).
const DISCARD: &str = "update {schema}.dead_letter set status = $3, resolution = $2, \
     resolved_at = now() where id = $1 and status = $4";

/// Prepared statements for dead letters and parking.
#[derive(Clone)]
pub struct DeadLetters {
    schema: Schema,
    insert: Statement,
    park: Statement,
    /// The source whose ingest rejections these statements record (`None`: a
    /// projector's, which name their subscriber instead).
    source: Option<String>,
}

impl DeadLetters {
    pub async fn prepare(client: &Client, schema: &Schema) -> Result<Self, StoreError> {
        Self::prepare_for(client, schema, None).await
    }

    /// For an appender: its rejections are identified within `source`'s database.
    pub async fn prepare_for(
        client: &Client,
        schema: &Schema,
        source: Option<&str>,
    ) -> Result<Self, StoreError> {
        let insert = client
            .prepare(&schema.sql(INSERT))
            .await
            .map_err(StoreError::db("preparing dead-letter insert"))?;
        let park = client
            .prepare(&schema.sql(PARK))
            .await
            .map_err(StoreError::db("preparing park"))?;
        Ok(DeadLetters {
            schema: schema.clone(),
            insert,
            park,
            source: source.map(str::to_owned),
        })
    }

    /// Records `dl` (in the caller's transaction) and returns its ID; `None` when this
    /// ingest rejection was already recorded (a replay of the same WAL).
    pub async fn record(
        &self,
        tx: &impl GenericClient,
        dl: &DeadLetter,
    ) -> Result<Option<i64>, StoreError> {
        let lsn: Option<PgLsn> = dl.source_lsn.map(Into::into);
        let (change_lsn, change_index, digest): (Option<PgLsn>, Option<i32>, Option<Uuid>) =
            match dl.origin {
                Some(RowOrigin::Wal { lsn, index, .. }) => (Some(lsn.into()), Some(index), None),
                Some(RowOrigin::Backfill { digest }) => (None, None, Some(digest)),
                None => (None, None, None),
            };
        let element: i32 = match dl.origin {
            Some(RowOrigin::Wal { element, .. }) => element,
            _ => 0,
        };
        // A dead letter records what could not be stored elsewhere: its own insert must
        // not fail on the same content (guarantee 7). Text without NUL, JSON as jsonb
        // stores it (`json::storable`), deterministically, so a replay still compares equal.
        fn text(t: &Option<String>) -> Option<Cow<'_, str>> {
            t.as_deref().map(escape_nul)
        }
        fn json(v: &Option<Value>) -> Option<Cow<'_, Value>> {
            v.as_ref().map(storable)
        }
        let (raw, existing) = (json(&dl.raw), json(&dl.existing));
        let row = tx
            .query_opt(
                &self.insert,
                &[
                    &text(&dl.subscriber_id),
                    &dl.event_id,
                    &dl.seq,
                    &text(&dl.aggregate_type),
                    &text(&dl.aggregate_id),
                    &dl.reason,
                    &escape_nul(&dl.error),
                    &raw.as_deref(),
                    &existing.as_deref(),
                    &dl.attempts,
                    &lsn,
                    &change_lsn,
                    &change_index,
                    &digest,
                    &dl.reason.initial_status(dl.seq.is_some()),
                    &self.source,
                    &element,
                ],
            )
            .await
            .map_err(StoreError::db("recording a dead letter"))?;
        Ok(row.map(|r| r.of("dead_letter").col("id")).transpose()?)
    }

    /// Parks an aggregate for a subscriber (in the caller's transaction).
    pub(crate) async fn park(
        &self,
        tx: &impl GenericClient,
        subscriber: &str,
        aggregate: &Aggregate,
        dead_letter_id: i64,
    ) -> Result<(), StoreError> {
        tx.execute(
            &self.park,
            &[&subscriber, &aggregate.kind, &aggregate.id, &dead_letter_id],
        )
        .await
        .map_err(StoreError::db("parking an aggregate"))?;
        Ok(())
    }

    /// Releases a parked aggregate (in the transaction that applied its last waiting event).
    pub(crate) async fn unpark(
        tx: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
        aggregate: &Aggregate,
    ) -> Result<(), StoreError> {
        tx.execute(
            &schema.sql(UNPARK),
            &[&subscriber, &aggregate.kind, &aggregate.id],
        )
        .await
        .map_err(StoreError::db("releasing a parked aggregate"))?;
        Ok(())
    }

    /// The aggregates parked for `subscriber`, each with whether it waits for a missing
    /// version rather than behind a failure.
    pub(crate) async fn parked(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
    ) -> Result<Vec<(Aggregate, bool)>, StoreError> {
        let rows = client
            .query(&schema.sql(PARKED), &[&subscriber, &Reason::VersionGap])
            .await
            .map_err(StoreError::db("loading parked aggregates"))?;
        rows.iter()
            .map(|r| {
                let r = r.of("parked_aggregate");
                Ok((
                    Aggregate {
                        kind: r.col("aggregate_type")?,
                        id: r.col("aggregate_id")?,
                    },
                    r.col("gap")?,
                ))
            })
            .collect()
    }
}

impl DeadLetters {
    /// How many of `subscriber`'s dead letters are open or retrying: what a rebuild's
    /// switch-over waits for.
    pub async fn open_count(
        client: &impl GenericClient,
        schema: &Schema,
        subscriber: &str,
    ) -> Result<i64, StoreError> {
        Ok(client
            .query_one(
                &schema.sql(COUNT),
                &[&subscriber, &DeadLetterStatus::OPEN_OR_RETRYING],
            )
            .await
            .map_err(StoreError::db("counting a subscriber's dead letters"))?
            .of("dead_letter")
            .col("letters")?)
    }

    /// The aggregates of `subscriber` parked behind a dead letter an operator discarded,
    /// with nothing else of theirs waiting: nothing would ever release them, since
    /// there is nothing left to retry. Their projector releases them.
    pub(crate) async fn discarded_parks(
        client: &Client,
        schema: &Schema,
        subscriber: &str,
    ) -> Result<Vec<Aggregate>, StoreError> {
        let rows = client
            .query(
                &schema.sql(DISCARDED_PARKS),
                &[
                    &subscriber,
                    &DeadLetterStatus::Discarded,
                    &Reason::VersionGap,
                    &DeadLetterStatus::UNRESOLVED,
                ],
            )
            .await
            .map_err(StoreError::db(
                "reading parks behind discarded dead letters",
            ))?;
        rows.iter()
            .map(|r| {
                let r = r.of("parked_aggregate");
                Ok(Aggregate {
                    kind: r.col("aggregate_type")?,
                    id: r.col("aggregate_id")?,
                })
            })
            .collect()
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
    pub reason: Reason,
    pub error: String,
    pub attempts: i32,
    pub status: DeadLetterStatus,
    pub first_failed_at_unix: f64,
    pub last_failed_at_unix: f64,
    pub raw: Option<Value>,
    pub existing: Option<Value>,
    pub resolution: Option<String>,
    /// The source of an ingest rejection (`default` for a single source).
    pub source: String,
}

impl FromRow for DeadLetterEntry {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("dead_letter");
        Ok(DeadLetterEntry {
            id: r.col("id")?,
            subscriber_id: r.col("subscriber_id")?,
            event_id: r.col("event_id")?,
            seq: r.col("seq")?,
            aggregate_type: r.col("aggregate_type")?,
            aggregate_id: r.col("aggregate_id")?,
            reason: r.col("reason")?,
            error: r.col("error")?,
            attempts: r.col("attempts")?,
            status: r.col("status")?,
            first_failed_at_unix: r.col("first_failed_at_unix")?,
            last_failed_at_unix: r.col("last_failed_at_unix")?,
            raw: jsonb::value(r.col("raw")?),
            existing: jsonb::value(r.col("existing")?),
            resolution: r.col("resolution")?,
            source: r.col("source")?,
        })
    }
}

impl DeadLetters {
    /// Dead letters, newest first: open ones unless `all`; of one subscriber when given
    /// (`ingest` selects rows rejected before any subscriber).
    pub(crate) async fn list(
        client: &Client,
        schema: &Schema,
        subscriber: Option<&str>,
        all: bool,
        limit: i64,
    ) -> Result<Vec<DeadLetterEntry>, StoreError> {
        let rows = client
            .query(
                &schema.sql(LIST),
                &[&all, &subscriber, &limit, &DeadLetterStatus::Open],
            )
            .await
            .map_err(StoreError::db("listing dead letters"))?;
        Ok(DeadLetterEntry::from_rows(&rows)?)
    }

    /// Marks an open dead letter discarded with the operator's reason. Returns false when
    /// there is no open dead letter with that ID. A parked aggregate stays parked.
    pub(crate) async fn discard(
        client: &Client,
        schema: &Schema,
        id: i64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let n = client
            .execute(
                &schema.sql(DISCARD),
                &[
                    &id,
                    &reason,
                    &DeadLetterStatus::Discarded,
                    &DeadLetterStatus::Open,
                ],
            )
            .await
            .map_err(StoreError::db("discarding a dead letter"))?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use walfold_event::{DeadLetterStatus, GapReason, Reason};

    use crate::migrate::tests::{checked_values, constraint_values};

    #[test]
    fn the_check_constraints_allow_exactly_the_statuses_and_reasons_of_letters_and_gaps() {
        let mut statuses: Vec<&str> = DeadLetterStatus::ALL.iter().map(|s| s.as_str()).collect();
        statuses.sort();
        assert_eq!(checked_values("status"), statuses);
        let mut reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        reasons.sort();
        assert_eq!(constraint_values("dead_letter_reason_check"), reasons);
        let mut gaps: Vec<&str> = GapReason::ALL.iter().map(|r| r.as_str()).collect();
        gaps.sort();
        assert_eq!(constraint_values("slot_gap_reason_check"), gaps);
    }
}
