//! Phantoms as an operator sees them (`walfold phantoms list|accept`): each with its
//! event, the failover it came from, and the subscribers that claimed it (the read
//! models it reached). Accepting one says the event is right after all (the application
//! deleted its outbox row, or it came from a message outbox): reads of the log include
//! it again, and status, doctor and the metric stop counting it.

use serde::Serialize;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::RowExt;

/// Phantoms, oldest first, at most `$3`: every one when `$1`, else the open ones; of
/// slot `$2` when not null. With each its event and its failover.
const LIST: &str = "select p.event_id, p.seq, p.slot, \
     extract(epoch from p.detected_at)::float8 as detected_at_unix, \
     extract(epoch from p.accepted_at)::float8 as accepted_at_unix, p.accept_reason, \
     e.source, e.event_type, e.aggregate_type, e.aggregate_id, e.source_lsn::text as source_lsn, \
     f.fork_lsn::text as fork_lsn, f.from_timeline, f.to_timeline, \
     coalesce(e.claim_seq, r.claim_seq, p.seq) as claim_seq \
     from {schema}.phantom_event p \
     join {schema}.source_failover f on f.id = p.failover_id \
     left join {schema}.event_log e on e.event_id = p.event_id \
     left join {schema}.retired_identity r on e.event_id is null and r.event_id = p.event_id \
     where ($1 or p.accepted_at is null) and ($2::text is null or p.slot = $2) \
     order by p.seq limit $3";

/// The subscribers that claimed each of the events `$1` (IDs) with claim seqs `$2`.
/// Claims are indexed by `(subscriber_id, seq)` only (see `claim`), so each subscriber
/// is looked up on its own: the subscribers are found by skipping through that index,
/// one probe each, and never by reading every claim. A claim made before the seq key
/// is found by its ID, through the index those claims keep.
const CLAIMED: &str = "with recursive subscriber as ( \
       (select subscriber_id as id from {schema}.processed_message \
        order by subscriber_id limit 1) \
       union all \
       select (select m.subscriber_id from {schema}.processed_message m \
               where m.subscriber_id > s.id order by m.subscriber_id limit 1) \
       from subscriber s where s.id is not null) \
     select c.message_id, c.subscriber_id from subscriber s cross join lateral ( \
       select message_id, subscriber_id from {schema}.processed_message \
       where subscriber_id = s.id and seq = any($2) and message_id = any($1) \
       union all \
       select message_id, subscriber_id from {schema}.processed_message \
       where subscriber_id = s.id and seq is null and message_id = any($1)) c \
     order by c.subscriber_id";

/// Accepts open phantoms with reason `$3`: the IDs `$1`, or (when `$1` is null) every
/// one of slot `$2` (any slot when null).
const ACCEPT: &str = "update {schema}.phantom_event set accepted_at = now(), accept_reason = $3 \
     where accepted_at is null \
       and (($1::uuid[] is not null and event_id = any($1::uuid[])) \
         or ($1::uuid[] is null and ($2::text is null or slot = $2)))";

/// A phantom, for `walfold phantoms list`.
#[derive(Debug, Clone, Serialize)]
pub struct PhantomEntry {
    pub event_id: Uuid,
    pub seq: i64,
    pub slot: String,
    pub source: Option<String>,
    pub event_type: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// Where the old primary had it.
    pub source_lsn: Option<String>,
    /// The failover's fork: the event was read past it.
    pub fork_lsn: String,
    pub from_timeline: i64,
    pub to_timeline: i64,
    pub detected_at_unix: f64,
    pub accepted_at_unix: Option<f64>,
    pub accept_reason: Option<String>,
    /// The seq its claims carry (see `claim`).
    #[serde(skip)]
    pub claim_seq: i64,
    /// Subscribers that claimed it, on the target listed (the read models it reached;
    /// claims pruned by retention are not seen).
    pub reached: Vec<String>,
}

/// What to accept.
#[derive(Debug, Clone, Copy)]
pub enum Accept<'a> {
    /// These phantoms.
    Ids(&'a [Uuid]),
    /// Every open phantom (of this slot, when given).
    All(Option<&'a str>),
}

/// Phantoms, oldest first (open ones unless `all`), with the subscribers of this target
/// that claimed them.
pub async fn list_phantoms(
    client: &Client,
    schema: &Schema,
    slot: Option<&str>,
    all: bool,
    limit: i64,
) -> Result<Vec<PhantomEntry>, StoreError> {
    let rows = client
        .query(&schema.sql(LIST), &[&all, &slot, &limit])
        .await
        .map_err(StoreError::db("listing phantoms"))?;
    let mut out = rows
        .iter()
        .map(|row| {
            let r = row.of("phantom_event");
            Ok(PhantomEntry {
                event_id: r.col("event_id")?,
                seq: r.col("seq")?,
                slot: r.col("slot")?,
                source: r.col("source")?,
                event_type: r.col("event_type")?,
                aggregate_type: r.col("aggregate_type")?,
                aggregate_id: r.col("aggregate_id")?,
                source_lsn: r.col("source_lsn")?,
                fork_lsn: r.col("fork_lsn")?,
                from_timeline: r.col("from_timeline")?,
                to_timeline: r.col("to_timeline")?,
                detected_at_unix: r.col("detected_at_unix")?,
                accepted_at_unix: r.col("accepted_at_unix")?,
                accept_reason: r.col("accept_reason")?,
                claim_seq: r.col("claim_seq")?,
                reached: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let events: Vec<(Uuid, i64)> = out.iter().map(|p| (p.event_id, p.claim_seq)).collect();
    for (id, subscriber) in claimed(client, schema, &events).await? {
        if let Some(p) = out.iter_mut().find(|p| p.event_id == id) {
            p.reached.push(subscriber);
        }
    }
    Ok(out)
}

/// The subscribers of this target that claimed each of `events` (event ID, claim seq):
/// (event ID, subscriber).
pub async fn claimed(
    client: &Client,
    schema: &Schema,
    events: &[(Uuid, i64)],
) -> Result<Vec<(Uuid, String)>, StoreError> {
    let (ids, seqs): (Vec<Uuid>, Vec<i64>) = events.iter().copied().unzip();
    let rows = client
        .query(&schema.sql(CLAIMED), &[&ids, &seqs])
        .await
        .map_err(StoreError::db("reading the claims of phantoms"))?;
    rows.iter()
        .map(|row| {
            let r = row.of("processed_message");
            Ok((r.col("message_id")?, r.col("subscriber_id")?))
        })
        .collect()
}

/// Accepts open phantoms with `reason`; how many.
pub async fn accept_phantoms(
    client: &Client,
    schema: &Schema,
    what: Accept<'_>,
    reason: &str,
) -> Result<u64, StoreError> {
    let (ids, slot): (Option<Vec<Uuid>>, Option<&str>) = match what {
        Accept::Ids(ids) => (Some(ids.to_vec()), None),
        Accept::All(slot) => (None, slot),
    };
    client
        .execute(&schema.sql(ACCEPT), &[&ids, &slot, &reason])
        .await
        .map_err(StoreError::db("accepting phantoms"))
}
