//! Dead letters: rows and events set aside with their reason, never dropped. Also the
//! parked aggregates whose later events wait behind a dead-lettered one (keyed by a hash
//! of the aggregate, so an ID of any length can be parked).

use serde_json::Value;
use tokio_postgres::types::PgLsn;
use tokio_postgres::{Client, GenericClient, Statement};
use uuid::Uuid;
use walfold_event::{DeadLetter, DeadLetterStatus, Reason, RowOrigin};

use crate::error::StoreError;
use crate::rebuild::RebuildState;
use walfold_config::quote_ident;

/// Prepared statements for dead letters and parking.
#[derive(Clone)]
pub struct DeadLetters {
    insert: Statement,
    park: Statement,
    /// The source whose ingest rejections these statements record (`None`: a
    /// projector's, which name their subscriber instead).
    source: Option<String>,
}

impl DeadLetters {
    pub async fn prepare(client: &Client, schema: &str) -> Result<Self, StoreError> {
        Self::prepare_for(client, schema, None).await
    }

    /// For an appender: its rejections are identified within `source`'s database.
    pub async fn prepare_for(
        client: &Client,
        schema: &str,
        source: Option<&str>,
    ) -> Result<Self, StoreError> {
        let s = quote_ident(schema);
        let insert = client
            .prepare(&format!(
                // Any conflict is on one of the ingest identities (a change, a backfilled
                // row): that row was recorded before. A row read both by the stream and
                // by `walfold backfill` has one identity of each kind: the same reason and
                // raw row recorded under the other kind is that row, recorded before.
                "insert into {s}.dead_letter (subscriber_id, event_id, seq, aggregate_type, \
                 aggregate_id, reason, error, raw, existing, attempts, source_lsn, change_lsn, \
                 change_index, row_digest, status, source) \
                 select $1::text, $2::uuid, $3::int8, $4::text, $5::text, $6::text, $7::text, \
                 $8::jsonb, $9::jsonb, $10::int4, $11::pg_lsn, $12::pg_lsn, $13::int4, $14::uuid, \
                 $15::text, coalesce($16::text, 'default') \
                 where not exists (select 1 from {s}.dead_letter d where $1::text is null \
                   and d.subscriber_id is null and d.reason = $6::text and d.raw = $8::jsonb \
                   and d.source = coalesce($16::text, 'default') \
                   and (($12::pg_lsn is not null and d.row_digest is not null) \
                     or ($14::uuid is not null and d.change_lsn is not null))) \
                 on conflict do nothing returning id"
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
        Ok(DeadLetters {
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
                Some(RowOrigin::Wal { lsn, index }) => (Some(lsn.into()), Some(index), None),
                Some(RowOrigin::Backfill { digest }) => (None, None, Some(digest)),
                None => (None, None, None),
            };
        let row = tx
            .query_opt(
                &self.insert,
                &[
                    &dl.subscriber_id,
                    &dl.event_id,
                    &dl.seq,
                    &dl.aggregate_type,
                    &dl.aggregate_id,
                    &dl.reason,
                    &dl.error,
                    &dl.raw,
                    &dl.existing,
                    &dl.attempts,
                    &lsn,
                    &change_lsn,
                    &change_index,
                    &digest,
                    &dl.reason.initial_status(dl.seq.is_some()),
                    &self.source,
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

    /// The aggregates parked for `subscriber`, as (aggregate_type, aggregate_id, whether
    /// they wait for a missing version rather than behind a failure).
    pub async fn parked(
        client: &Client,
        schema: &str,
        subscriber: &str,
    ) -> Result<Vec<(String, String, bool)>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select p.aggregate_type, p.aggregate_id, d.reason = $2 \
                     from {s}.parked_aggregate p join {s}.dead_letter d on d.id = p.dead_letter_id \
                     where p.subscriber_id = $1",
                    s = quote_ident(schema)
                ),
                &[&subscriber, &Reason::VersionGap],
            )
            .await
            .map_err(StoreError::db("loading parked aggregates"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
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
                     extract(epoch from last_failed_at)::float8, raw, existing, resolution, \
                     source from {}.dead_letter \
                     where ($1 or status = $4) \
                       and ($2::text is null or subscriber_id = $2 \
                            or ($2 = 'ingest' and subscriber_id is null)) \
                     order by id desc limit $3",
                    quote_ident(schema)
                ),
                &[&all, &subscriber, &limit, &DeadLetterStatus::Open],
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
                source: r.get(15),
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
                    "update {}.dead_letter set status = $3, resolution = $2, \
                     resolved_at = now() where id = $1 and status = $4",
                    quote_ident(schema)
                ),
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

impl DeadLetters {
    /// Marks dead letters `retrying`; the running projector of their subscriber applies
    /// them through the normal claim and guard, in order per aggregate, and un-parks the
    /// aggregate when all succeeded. Returns how many were marked.
    pub async fn request_retry(
        client: &Client,
        schema: &str,
        request: RetryRequest<'_>,
    ) -> Result<u64, StoreError> {
        let s = quote_ident(schema);
        match request {
            RetryRequest::One(id) => {
                let row = client
                    .query_opt(
                        &format!(
                            "select subscriber_id, aggregate_type, aggregate_id, status, seq, \
                             reason = $2 and seq is null \
                             from {s}.dead_letter where id = $1"
                        ),
                        &[&id, &Reason::VersionGap],
                    )
                    .await
                    .map_err(StoreError::db("reading a dead letter"))?
                    .ok_or_else(|| StoreError::Refused(format!("no dead letter with id {id}")))?;
                let (subscriber, kind, aggregate, status, seq): (
                    Option<String>,
                    Option<String>,
                    Option<String>,
                    DeadLetterStatus,
                    Option<i64>,
                ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
                let gap: bool = row.get(5);
                if let (true, Some(_), DeadLetterStatus::Open) = (gap, &subscriber, status) {
                    // A version gap: its projector checks it again (and reopens it if the
                    // versions are still missing).
                    return client
                        .execute(
                            &format!("update {s}.dead_letter set status = $2 where id = $1"),
                            &[&id, &DeadLetterStatus::Retrying],
                        )
                        .await
                        .map_err(StoreError::db("requesting a retry"));
                }
                let (Some(subscriber), Some(kind), Some(aggregate), Some(_)) =
                    (subscriber, kind, aggregate, seq)
                else {
                    return Err(StoreError::Refused(format!(
                        "dead letter {id} was rejected at ingest and never became an event: \
                         fix the producer and write a new outbox row, then discard this one"
                    )));
                };
                if status != DeadLetterStatus::Open {
                    return Err(StoreError::Refused(format!(
                        "dead letter {id} is {status}, not open"
                    )));
                }
                client
                    .execute(
                        &format!(
                            "update {s}.dead_letter set status = $4 \
                             where subscriber_id = $1 and aggregate_type = $2 \
                             and aggregate_id = $3 and status = $5 and seq is not null"
                        ),
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
                    &format!(
                        "update {s}.dead_letter set status = $2 \
                         where subscriber_id is not null \
                         and (seq is not null or reason = $5) \
                         and ($1::text is null or subscriber_id = $1) and status = $3 \
                         and subscriber_id in (select subscriber_id from {s}.projection union \
                           select subscriber_id from {s}.rebuild where state = $4)"
                    ),
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
    pub async fn retry_aggregates(
        client: &Client,
        schema: &str,
        subscriber: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select distinct aggregate_type, aggregate_id from {}.dead_letter \
                     where subscriber_id = $1 and status = $2 and seq is not null",
                    quote_ident(schema)
                ),
                &[&subscriber, &DeadLetterStatus::Retrying],
            )
            .await
            .map_err(StoreError::db("reading retry requests"))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// The next `limit` dead letters of an aggregate to retry, after `after_seq`: every
    /// open or retrying one, in log order (the aggregate's whole chain goes through).
    pub async fn retry_page(
        client: &Client,
        schema: &str,
        subscriber: &str,
        aggregate: (&str, &str),
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<RetryItem>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select id, seq, aggregate_type, aggregate_id from {}.dead_letter \
                     where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
                       and status = any($6) and seq > $4 \
                     order by seq, id limit $5",
                    quote_ident(schema)
                ),
                &[
                    &subscriber,
                    &aggregate.0,
                    &aggregate.1,
                    &after_seq,
                    &limit,
                    &DeadLetterStatus::OPEN_OR_RETRYING,
                ],
            )
            .await
            .map_err(StoreError::db("reading dead letters to retry"))?;
        Ok(rows
            .iter()
            .map(|r| RetryItem {
                id: r.get(0),
                seq: r.get(1),
                aggregate_type: r.get(2),
                aggregate_id: r.get(3),
            })
            .collect())
    }

    /// Records that a retried dead letter went through (in the transaction that applied it).
    pub async fn retried(
        tx: &impl GenericClient,
        schema: &str,
        id: i64,
        outcome: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &format!(
                "update {}.dead_letter set status = $3, resolution = $2, \
                 resolved_at = now(), attempts = attempts + 1 where id = $1",
                quote_ident(schema)
            ),
            &[&id, &outcome, &DeadLetterStatus::Retried],
        )
        .await
        .map_err(StoreError::db("resolving a retried dead letter"))?;
        Ok(())
    }

    /// A retry failed again at dead letter `head`: it gets the new error, and the
    /// aggregate's chain is open again (the aggregate stays parked).
    pub async fn retry_failed(
        client: &impl GenericClient,
        schema: &str,
        subscriber: &str,
        aggregate: (&str, &str),
        head: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        let s = quote_ident(schema);
        client
            .execute(
                &format!(
                    "update {s}.dead_letter set status = $6, \
                     error = case when id = $4 then $5 else error end, \
                     attempts = attempts + (id = $4)::int, \
                     last_failed_at = case when id = $4 then now() else last_failed_at end \
                     where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
                       and status = $7"
                ),
                &[
                    &subscriber,
                    &aggregate.0,
                    &aggregate.1,
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

    /// Releases a parked aggregate (in the transaction that applied its last waiting event).
    pub async fn unpark(
        tx: &impl GenericClient,
        schema: &str,
        subscriber: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &format!(
                "delete from {s}.parked_aggregate where subscriber_id = $1 \
                 and aggregate_key = {s}.aggregate_key($2, $3)",
                s = quote_ident(schema)
            ),
            &[&subscriber, &aggregate_type, &aggregate_id],
        )
        .await
        .map_err(StoreError::db("releasing a parked aggregate"))?;
        Ok(())
    }
}

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

impl DeadLetters {
    /// The events of `aggregates` (as (type, id)) waiting for a missing version for
    /// `subscriber`, in log order.
    pub async fn waiting(
        tx: &impl GenericClient,
        schema: &str,
        subscriber: &str,
        aggregates: &[(String, String)],
    ) -> Result<Vec<RetryItem>, StoreError> {
        if aggregates.is_empty() {
            return Ok(Vec::new());
        }
        let (types, ids): (Vec<&str>, Vec<&str>) = aggregates
            .iter()
            .map(|(t, i)| (t.as_str(), i.as_str()))
            .unzip();
        let rows = tx
            .query(
                &format!(
                    "select d.id, d.seq, d.aggregate_type, d.aggregate_id from {}.dead_letter d \
                     join unnest($2::text[], $3::text[]) as a(t, i) \
                       on d.aggregate_type = a.t and d.aggregate_id = a.i \
                     where d.subscriber_id = $1 and d.reason = $5 \
                       and d.status = $4 and d.seq is not null \
                     order by d.seq, d.id",
                    quote_ident(schema)
                ),
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
        Ok(rows
            .iter()
            .map(|r| RetryItem {
                id: r.get(0),
                seq: r.get(1),
                aggregate_type: r.get(2),
                aggregate_id: r.get(3),
            })
            .collect())
    }

    /// Deletes the letters of waiting events that went through, in the caller's
    /// transaction (after any park pointing at them moved).
    pub async fn forget_waiting(
        tx: &impl GenericClient,
        schema: &str,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        tx.execute(
            &format!(
                "delete from {}.dead_letter where id = any($1) and status = $2",
                quote_ident(schema)
            ),
            &[&ids, &DeadLetterStatus::Waiting],
        )
        .await
        .map_err(StoreError::db("clearing waiting events"))?;
        Ok(())
    }

    /// Points a gap's park at its first waiting event, unless it points at the gap's own
    /// letter (an open gap); the gap's age counts from then (a later version is missing
    /// now).
    pub async fn repark_waiting(
        tx: &impl GenericClient,
        schema: &str,
        subscriber: &str,
        aggregate: &(String, String),
        letter: i64,
    ) -> Result<(), StoreError> {
        tx.execute(
            &format!(
                "update {s}.parked_aggregate p set dead_letter_id = $4, parked_at = now() \
                 where p.dead_letter_id <> $4 and p.subscriber_id = $1 and p.aggregate_key = {s}.aggregate_key($2, $3) \
                   and exists (select 1 from {s}.dead_letter d where d.id = p.dead_letter_id \
                               and d.status = $5)",
                s = quote_ident(schema)
            ),
            &[
                &subscriber,
                &aggregate.0,
                &aggregate.1,
                &letter,
                &DeadLetterStatus::Waiting,
            ],
        )
        .await
        .map_err(StoreError::db("parking"))?;
        Ok(())
    }

    /// The gaps of `subscriber`'s strict projection.
    pub async fn gaps(
        client: &Client,
        schema: &str,
        subscriber: &str,
    ) -> Result<Vec<Gap>, StoreError> {
        let rows = client
            .query(
                &format!(
                    "select p.aggregate_type, p.aggregate_id, d.id, d.status, \
                     extract(epoch from p.parked_at)::float8 \
                     from {s}.parked_aggregate p join {s}.dead_letter d on d.id = p.dead_letter_id \
                     where p.subscriber_id = $1 and d.reason = $2",
                    s = quote_ident(schema)
                ),
                &[&subscriber, &Reason::VersionGap],
            )
            .await
            .map_err(StoreError::db("reading version gaps"))?;
        Ok(rows
            .iter()
            .map(|r| Gap {
                aggregate_type: r.get(0),
                aggregate_id: r.get(1),
                letter: r.get(2),
                status: r.get(3),
                since_unix: r.get(4),
            })
            .collect())
    }

    /// A gap outlived its timeout: records it as an open dead letter (no event: the
    /// versions are missing) and points the park at it, in the caller's transaction.
    pub async fn open_gap(
        &self,
        tx: &impl GenericClient,
        schema: &str,
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
            &format!(
                "update {s}.parked_aggregate set dead_letter_id = $3 where subscriber_id = $1 \
                 and aggregate_key = {s}.aggregate_key($2, $4)",
                s = quote_ident(schema)
            ),
            &[&subscriber, &gap.aggregate_type, &id, &gap.aggregate_id],
        )
        .await
        .map_err(StoreError::db("recording a version gap"))?;
        Ok(())
    }

    /// Resolves the open gap letter of an aggregate whose missing versions arrived.
    pub async fn resolve_gap(
        tx: &impl GenericClient,
        schema: &str,
        subscriber: &str,
        aggregate: &(String, String),
        resolution: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &format!(
                // A gap an operator discarded stays discarded, with their reason kept.
                "update {}.dead_letter set \
                 status = case when status = $5 then status else $6 end, \
                 resolution = case when status = $5 \
                   then concat_ws('; ', resolution, $4::text) else $4::text end, \
                 resolved_at = now() \
                 where subscriber_id = $1 and aggregate_type = $2 and aggregate_id = $3 \
                   and reason = $8 and seq is null \
                   and status = any($7)",
                quote_ident(schema)
            ),
            &[
                &subscriber,
                &aggregate.0,
                &aggregate.1,
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
    pub async fn gap_still_open(
        tx: &impl GenericClient,
        schema: &str,
        letter: i64,
        error: &str,
    ) -> Result<(), StoreError> {
        tx.execute(
            &format!(
                "update {}.dead_letter set status = $3, error = $2, attempts = attempts + 1, \
                 last_failed_at = now() where id = $1 and status = $4",
                quote_ident(schema)
            ),
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

#[cfg(test)]
mod tests {
    use walfold_event::{DeadLetterStatus, Reason};

    use crate::migrate::tests::checked_values;

    #[test]
    fn the_check_constraints_allow_exactly_the_statuses_and_reasons() {
        let mut statuses: Vec<&str> = DeadLetterStatus::ALL.iter().map(|s| s.as_str()).collect();
        statuses.sort();
        assert_eq!(checked_values("status"), statuses);
        let mut reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        reasons.sort();
        assert_eq!(checked_values("reason"), reasons);
    }
}
