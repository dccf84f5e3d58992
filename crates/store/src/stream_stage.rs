//! Staging of streamed transactions (pgoutput protocol 2). The source sends a large
//! transaction in segments while it runs; its outbox rows wait here, keyed by the
//! top-level xid, the subtransaction and their order, until Stream Commit moves them
//! into the event log in one transaction (with the ingest position, under the same
//! duplicate and `id_conflict` rules as any append) or Stream Abort deletes them.
//!
//! Why staged rows never double: after any reconnect the server sends every
//! transaction that had not committed before the acknowledged position again, from its
//! first segment. A session therefore starts by deleting what an earlier one staged,
//! and within a session a transaction has one first segment.

use std::time::SystemTime;

use serde_json::{json, Value};
use tokio_postgres::types::PgLsn;
use uuid::Uuid;
use walfold_event::{
    partition_hash, DeadLetter, ErrorKind, JsonText, Lsn, NewEvent, Reason, RowOrigin,
};

use crate::error::StoreError;
use crate::event_log::{AppendOutcome, EventLog, IngestCounts};
use crate::jsonb;
use walfold_pg::RowExt;

/// One change of a streamed transaction, in stream order.
#[derive(Debug, Clone)]
pub struct StagedChange {
    /// The top-level transaction.
    pub xid: u32,
    /// The (sub)transaction that made the change.
    pub subxid: u32,
    /// Order within the transaction, from 0 at its first segment.
    pub ord: i64,
    pub row: StagedRow,
}

/// What a staged change becomes at commit.
// Events are nearly every row: boxing them would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum StagedRow {
    Event(NewEvent),
    /// A row that cannot be an event: a dead letter once its transaction commits.
    Rejected(Box<DeadLetter>),
}

/// What a streamed transaction's commit did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamOutcome {
    pub outcome: AppendOutcome,
    pub malformed: u64,
    /// Events the event log refused (dead-lettered), when moved one by one.
    pub refused: u64,
}

/// The commit of a streamed transaction.
#[derive(Debug, Clone, Copy)]
pub struct StreamCommit {
    pub xid: u32,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: Option<SystemTime>,
}

/// Deletes everything staged for slot `$1`.
const CLEAR: &str = "delete from {schema}.stream_stage where slot = $1";

/// Stages a batch of slot `$1`'s changes (arrays `$2`…`$18`).
const STAGE: &str =
    "insert into {schema}.stream_stage (slot, xid, subxid, ord, event_id, aggregate_type, \
             aggregate_id, event_type, version, payload, headers, occurred_at, change_lsn, \
             change_index, rejected, partition_hash, change_element, producer_id) \
             select $1, * from unnest($2::int8[], $3::int8[], $4::int8[], $5::uuid[], \
             $6::text[], $7::text[], $8::text[], $9::int8[], $10::jsonb[], $11::jsonb[], \
             $12::timestamptz[], $13::pg_lsn[], $14::int4[], $15::jsonb[], $16::int4[], \
             $17::int4[], $18::text[])";

/// [`STAGE`] for changes with payloads sent by COPY (see `large_payload`).
const STAGE_LARGE: &str =
    "insert into {schema}.stream_stage (slot, xid, subxid, ord, event_id, aggregate_type, \
             aggregate_id, event_type, version, payload, headers, occurred_at, change_lsn, \
             change_index, rejected, partition_hash, change_element, producer_id) \
             select $1, u.xid, u.subxid, u.ord, u.event_id, u.aggregate_type, u.aggregate_id, \
             u.event_type, u.version, {payload}, u.headers, u.occurred_at, u.change_lsn, \
             u.change_index, u.rejected, u.partition_hash, u.change_element, u.producer_id \
             from unnest($2::int8[], $3::int8[], $4::int8[], $5::uuid[], \
             $6::text[], $7::text[], $8::text[], $9::int8[], $10::jsonb[], $11::jsonb[], \
             $12::timestamptz[], $13::pg_lsn[], $14::int4[], $15::jsonb[], $16::int4[], \
             $17::int4[], $18::text[]) \
             with ordinality as u(xid, subxid, ord, event_id, aggregate_type, aggregate_id, \
             event_type, version, payload, headers, occurred_at, change_lsn, change_index, \
             rejected, partition_hash, change_element, producer_id, n)";

/// Deletes what slot `$1` staged for transaction `$2`.
const DISCARD: &str = "delete from {schema}.stream_stage where slot = $1 and xid = $2";

/// Deletes what slot `$1` staged for subtransaction `$3` of `$2`.
const DISCARD_SUBTRANSACTION: &str =
    "delete from {schema}.stream_stage where slot = $1 and xid = $2 and subxid = $3";

/// A page (`$4` rows after `ord` `$3`) of what slot `$1` staged for transaction `$2`:
/// its rejected rows (`$5` true) or its events.
const READ_STAGED: &str =
    "select ord, event_id, aggregate_type, aggregate_id, event_type, version, payload, \
             headers, occurred_at, change_lsn, change_index, change_element, producer_id, \
             rejected from {schema}.stream_stage \
             where slot = $1 and xid = $2 and ord > $3 and (rejected is not null) = $5 \
             order by ord limit $4";

/// Moves every event slot `$1` staged for transaction `$2` into the log after seq `$3`,
/// with commit LSN `$4`, commit time `$5` and source `$6` (claim seqs as in the append);
/// or none, when one of them meets a retired identity with other content (the pages
/// then sort it out as any append does).
const MOVE_ALL: &str =
    "insert into {schema}.event_log (seq, event_id, aggregate_type, aggregate_id, \
             event_type, version, payload, headers, occurred_at, partition_hash, source_lsn, \
             committed_at, source, bytes, producer_id, claim_seq) \
             select $3 + row_number() over (order by ord), s.event_id, aggregate_type, \
             aggregate_id, event_type, version, payload, headers, occurred_at, partition_hash, \
             $4, $5, $6::text, octet_length(payload::text), producer_id, r.claim_seq \
             from {schema}.stream_stage s \
             left join {schema}.retired_identity r on r.event_id = s.event_id \
             where s.slot = $1 and s.xid = $2 and s.rejected is null \
             and not exists (select from {schema}.stream_stage c \
               join {schema}.retired_identity d on d.event_id = c.event_id \
               where c.slot = $1 and c.xid = $2 and c.rejected is null \
               and d.digest <> {schema}.identity_digest(c.event_type, c.aggregate_type, \
                 c.aggregate_id, c.version, c.payload))";

/// Whether an event `MOVE_ALL` put in the log after seq `$1` (up to `$2`) meets an
/// identity retired meanwhile with other content. `MOVE_ALL` reads `retired_identity`
/// in its snapshot, taken before its insert waited on the unique index for a prune that
/// was deleting the same ID (and retiring it): that prune's identity is visible only to
/// a later statement. Then the move is undone and the pages judge it (an `id_conflict`).
const RETIRED_MEANWHILE_WITH_OTHER_CONTENT: &str =
    "select exists (select from {schema}.event_log l \
     join {schema}.retired_identity r on r.event_id = l.event_id \
     where l.seq > $1 and l.seq <= $2 and l.claim_seq is null \
     and r.digest <> {schema}.identity_digest(l.event_type, l.aggregate_type, \
       l.aggregate_id, l.version, l.payload)) as conflict";

/// Gives the events `MOVE_ALL` put in the log after seq `$1` (up to `$2`) their claim
/// seqs from identities retired meanwhile (see [`RETIRED_MEANWHILE_WITH_OTHER_CONTENT`]):
/// without it, the ID would be claimed on its new seq and applied again.
const CLAIM_SEQS_RETIRED_MEANWHILE: &str =
    "update {schema}.event_log l set claim_seq = r.claim_seq \
     from {schema}.retired_identity r \
     where l.seq > $1 and l.seq <= $2 and l.claim_seq is null and r.event_id = l.event_id";

impl EventLog {
    /// Deletes everything staged for this slot (a new session: the server sends every
    /// unfinished transaction again). Returns the number of rows deleted.
    pub async fn clear_staged(&mut self) -> Result<u64, StoreError> {
        let parts = self.parts();
        let tx = parts
            .client
            .transaction()
            .await
            .map_err(StoreError::db("clearing staged changes"))?;
        let n = tx
            .execute(&parts.schema.sql(CLEAR), &[&parts.slot])
            .await
            .map_err(StoreError::db("clearing staged changes"))?;
        parts.ending.check_fence(&tx).await?;
        tx.commit()
            .await
            .map_err(StoreError::db("clearing staged changes"))?;
        Ok(n)
    }

    /// Stages `changes` in one transaction.
    pub async fn stage(&mut self, changes: &[StagedChange]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let parts = self.parts();
        let sql = parts.schema.sql(STAGE);
        let n = changes.len();
        let mut xids = Vec::with_capacity(n);
        let mut subxids = Vec::with_capacity(n);
        let mut ords = Vec::with_capacity(n);
        let mut ids: Vec<Option<Uuid>> = Vec::with_capacity(n);
        let mut agg_types: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut agg_ids: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut types: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut versions: Vec<Option<i64>> = Vec::with_capacity(n);
        let mut payloads: Vec<Option<&JsonText>> = Vec::with_capacity(n);
        let mut headers: Vec<Option<&JsonText>> = Vec::with_capacity(n);
        let mut occurred: Vec<Option<SystemTime>> = Vec::with_capacity(n);
        let mut lsns: Vec<Option<PgLsn>> = Vec::with_capacity(n);
        let mut indexes: Vec<Option<i32>> = Vec::with_capacity(n);
        let mut elements: Vec<Option<i32>> = Vec::with_capacity(n);
        let mut producers: Vec<Option<&str>> = Vec::with_capacity(n);
        let mut rejected: Vec<Option<Value>> = Vec::with_capacity(n);
        let mut hashes: Vec<Option<i32>> = Vec::with_capacity(n);
        for c in changes {
            xids.push(i64::from(c.xid));
            subxids.push(i64::from(c.subxid));
            ords.push(c.ord);
            let origin = match &c.row {
                StagedRow::Event(e) => e.origin,
                StagedRow::Rejected(d) => d.origin,
            };
            let (lsn, index, element) = match origin {
                Some(RowOrigin::Wal {
                    lsn,
                    index,
                    element,
                }) => (Some(lsn.into()), Some(index), Some(element)),
                _ => (None, None, None),
            };
            lsns.push(lsn);
            indexes.push(index);
            elements.push(element);
            match &c.row {
                StagedRow::Event(e) => {
                    ids.push(Some(e.id));
                    producers.push(e.producer_id.as_deref());
                    agg_types.push(Some(&e.aggregate_type));
                    agg_ids.push(Some(&e.aggregate_id));
                    types.push(Some(&e.event_type));
                    versions.push(e.version);
                    payloads.push(Some(&e.payload));
                    headers.push(e.headers.as_ref());
                    occurred.push(e.occurred_at);
                    rejected.push(None);
                    hashes.push(Some(partition_hash(&e.aggregate_type, &e.aggregate_id)));
                }
                StagedRow::Rejected(d) => {
                    ids.push(None);
                    producers.push(None);
                    agg_types.push(None);
                    agg_ids.push(None);
                    types.push(None);
                    versions.push(None);
                    payloads.push(None);
                    headers.push(None);
                    occurred.push(None);
                    hashes.push(None);
                    // As the dead letter it becomes: storable whatever the row held.
                    let staged = json!({
                        "reason": d.reason.as_str(),
                        "event_id": d.event_id,
                        "aggregate_type": d.aggregate_type,
                        "aggregate_id": d.aggregate_id,
                        "error": d.error,
                        "raw": d.raw,
                    });
                    rejected.push(Some(walfold_event::json::storable(&staged).into_owned()));
                }
            }
        }
        let tx = parts
            .client
            .transaction()
            .await
            .map_err(StoreError::db("staging streamed changes"))?;
        let large = crate::large_payload::upload(&tx, &payloads).await?;
        let sql = match large {
            None => sql,
            Some(_) => parts.schema.sql(
                &STAGE_LARGE.replace(
                    "{payload}",
                    &crate::large_payload::PAYLOAD
                        .replace("{payload}", "u.payload")
                        .replace("{n}", "u.n"),
                ),
            ),
        };
        let payloads = large.as_ref().unwrap_or(&payloads);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 18] = [
            &parts.slot,
            &xids,
            &subxids,
            &ords,
            &ids,
            &agg_types,
            &agg_ids,
            &types,
            &versions,
            payloads,
            &headers,
            &occurred,
            &lsns,
            &indexes,
            &rejected,
            &hashes,
            &elements,
            &producers,
        ];
        let insert = async {
            tx.execute(&sql, &params)
                .await
                .map_err(StoreError::db("staging streamed changes"))
        };
        futures::try_join!(insert, parts.ending.check_fence(&tx))?;
        tx.commit()
            .await
            .map_err(StoreError::db("staging streamed changes"))
    }

    /// Deletes what is staged for `xid` (the whole transaction) or, with `subxid`, for
    /// that subtransaction only.
    pub async fn discard_staged(
        &mut self,
        xid: u32,
        subxid: Option<u32>,
    ) -> Result<u64, StoreError> {
        let parts = self.parts();
        let tx = parts
            .client
            .transaction()
            .await
            .map_err(StoreError::db("discarding staged changes"))?;
        let xid = i64::from(xid);
        let n = match subxid {
            None => {
                tx.execute(&parts.schema.sql(DISCARD), &[&parts.slot, &xid])
                    .await
            }
            Some(sub) => {
                tx.execute(
                    &parts.schema.sql(DISCARD_SUBTRANSACTION),
                    &[&parts.slot, &xid, &i64::from(sub)],
                )
                .await
            }
        }
        .map_err(StoreError::db("discarding staged changes"))?;
        parts.ending.check_fence(&tx).await?;
        tx.commit()
            .await
            .map_err(StoreError::db("discarding staged changes"))?;
        Ok(n)
    }

    /// Moves everything staged for the committed transaction into the event log, in
    /// order, `page` rows at a time, in one transaction that also deletes the staged
    /// rows and moves the ingest position to the commit's end. With `one_by_one`, each
    /// event is written in its own savepoint and one the log refuses (a value it cannot
    /// store) is dead-lettered instead.
    pub async fn commit_staged(
        &mut self,
        commit: StreamCommit,
        page: usize,
        one_by_one: bool,
    ) -> Result<StreamOutcome, StoreError> {
        let parts = self.parts();
        let select = parts.schema.sql(READ_STAGED);
        let move_all = parts.schema.sql(MOVE_ALL);
        let source_lsn: PgLsn = commit.commit_lsn.into();
        let turn = parts.order.turn().await?;
        let mut tx = parts
            .client
            .transaction()
            .await
            .map_err(StoreError::db("committing a streamed transaction"))?;
        let xid = i64::from(commit.xid);
        let limit = page.max(1) as i64;
        let mut head = turn.head();
        let mut result = StreamOutcome::default();
        // Rejected rows first, then the events. A dead letter's insert is speculative
        // (`on conflict do nothing`): done while this transaction is still small, it
        // cannot make the source spill it (see the event insert in `event_log`).
        let mut after = -1i64;
        let mut rejected = true;
        loop {
            let rows = tx
                .query(&select, &[&parts.slot, &xid, &after, &limit, &rejected])
                .await
                .map_err(StoreError::db("reading staged changes"))?;
            let Some(last) = rows.last() else {
                if !rejected {
                    break;
                }
                rejected = false;
                after = -1;
                if one_by_one {
                    continue;
                }
                // Every event in one statement, in order, unless an ID is already in
                // the log or repeats in the transaction (a replay, a producer retry):
                // then the unique index refuses it, and the pages below sort the
                // duplicates from the conflicts as any append does.
                let sp = tx
                    .savepoint("walfold_move")
                    .await
                    .map_err(StoreError::db("committing a streamed transaction"))?;
                let moved = sp
                    .execute(
                        &move_all,
                        &[
                            &parts.slot,
                            &xid,
                            &head,
                            &source_lsn,
                            &commit.commit_time,
                            &parts.writer.source(),
                        ],
                    )
                    .await;
                match moved {
                    // Nothing moved: none staged, or one meets a retired identity with
                    // other content (see MOVE_ALL); the pages sort them out.
                    Ok(0) => {
                        sp.rollback()
                            .await
                            .map_err(StoreError::db("committing a streamed transaction"))?;
                        continue;
                    }
                    Ok(n) => {
                        let moved_to = head + n as i64;
                        let conflict: bool = sp
                            .query_one(
                                &parts.schema.sql(RETIRED_MEANWHILE_WITH_OTHER_CONTENT),
                                &[&head, &moved_to],
                            )
                            .await
                            .map_err(StoreError::db("moving staged events"))?
                            .of("event_log")
                            .col("conflict")?;
                        if conflict {
                            sp.rollback()
                                .await
                                .map_err(StoreError::db("committing a streamed transaction"))?;
                            continue;
                        }
                        sp.commit()
                            .await
                            .map_err(StoreError::db("committing a streamed transaction"))?;
                        tx.execute(
                            &parts.schema.sql(CLAIM_SEQS_RETIRED_MEANWHILE),
                            &[&head, &moved_to],
                        )
                        .await
                        .map_err(StoreError::db("moving staged events"))?;
                        parts
                            .writer
                            .confirm_phantoms_appended(&tx, head, moved_to)
                            .await?;
                        result.outcome.appended += n;
                        head = moved_to;
                        break;
                    }
                    Err(e) if walfold_event::is_unique_violation(walfold_pg::sqlstate(&e)) => {
                        sp.rollback()
                            .await
                            .map_err(StoreError::db("committing a streamed transaction"))?;
                        continue;
                    }
                    Err(e) => return Err(StoreError::db("moving staged events")(e)),
                }
            };
            after = last.of("stream_stage").col("ord")?;
            let mut events = Vec::with_capacity(rows.len());
            let mut dead = Vec::new();
            for row in &rows {
                match staged_row(row, commit)? {
                    StagedRow::Event(e) => events.push(e),
                    StagedRow::Rejected(d) => dead.push(*d),
                }
            }
            result.malformed += dead.len() as u64;
            if !one_by_one {
                let (o, next) = parts.writer.write(&tx, head, &events, &dead).await?;
                add(&mut result.outcome, o);
                head = next;
                continue;
            }
            for event in &events {
                let sp = tx
                    .savepoint("walfold_event")
                    .await
                    .map_err(StoreError::db("committing a streamed transaction"))?;
                match parts
                    .writer
                    .write(&sp, head, std::slice::from_ref(event), &[])
                    .await
                {
                    Ok((o, next)) => {
                        sp.commit()
                            .await
                            .map_err(StoreError::db("committing a streamed transaction"))?;
                        add(&mut result.outcome, o);
                        head = next;
                    }
                    Err(e) if e.kind() == ErrorKind::Data => {
                        sp.rollback()
                            .await
                            .map_err(StoreError::db("committing a streamed transaction"))?;
                        tracing::warn!(event_id = %event.id, error = %e, "event refused by the event log, dead-lettered");
                        dead.push(DeadLetter::refused(event, &e.to_string()));
                        result.refused += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            parts.writer.write(&tx, head, &[], &dead).await?;
        }
        tx.execute(&parts.schema.sql(DISCARD), &[&parts.slot, &xid])
            .await
            .map_err(StoreError::db("deleting staged changes"))?;
        let counts = IngestCounts {
            malformed: result.malformed + result.refused,
            ignored_changes: 0,
        };
        parts
            .ending
            .commit(tx, Some(commit.end_lsn), result.outcome, counts)
            .await?;
        turn.advance(head);
        *parts.head = head;
        Ok(result)
    }
}

fn add(total: &mut AppendOutcome, o: AppendOutcome) {
    total.appended += o.appended;
    total.duplicates += o.duplicates;
    total.id_conflicts += o.id_conflicts;
}

/// A staged row as it enters the log: with its transaction's commit LSN and time.
fn staged_row(row: &tokio_postgres::Row, commit: StreamCommit) -> Result<StagedRow, StoreError> {
    let row = row.of("stream_stage");
    let lsn: Option<PgLsn> = row.col("change_lsn")?;
    let index: Option<i32> = row.col("change_index")?;
    let element: Option<i32> = row.col("change_element")?;
    let origin = match (lsn, index) {
        (Some(lsn), Some(index)) => Some(RowOrigin::Wal {
            lsn: lsn.into(),
            index,
            element: element.unwrap_or(0),
        }),
        _ => None,
    };
    if let Some(rejected) = jsonb::value(row.col("rejected")?) {
        let text = |k: &str| rejected.get(k).and_then(Value::as_str).map(str::to_owned);
        return Ok(StagedRow::Rejected(Box::new(DeadLetter {
            subscriber_id: None,
            event_id: text("event_id").and_then(|s| Uuid::try_parse(&s).ok()),
            seq: None,
            aggregate_type: text("aggregate_type"),
            aggregate_id: text("aggregate_id"),
            // Rows staged before the reason was kept were all malformed.
            reason: text("reason")
                .and_then(|r| r.parse().ok())
                .unwrap_or(Reason::Malformed),
            error: text("error").unwrap_or_default(),
            raw: rejected.get("raw").cloned().filter(|v| !v.is_null()),
            existing: None,
            attempts: 1,
            source_lsn: Some(commit.commit_lsn),
            origin,
        })));
    }
    Ok(StagedRow::Event(NewEvent {
        id: row.col("event_id")?,
        producer_id: row.col("producer_id")?,
        aggregate_type: row.col("aggregate_type")?,
        aggregate_id: row.col("aggregate_id")?,
        event_type: row.col("event_type")?,
        version: row.col("version")?,
        payload: row.col("payload")?,
        headers: row.col("headers")?,
        occurred_at: row.col("occurred_at")?,
        source_lsn: commit.commit_lsn,
        origin,
        committed_at: commit.commit_time,
    }))
}
