//! What `walfold events` reads: the event log as an operator pages through it, each
//! event with its JSON line, and the trail an event left for one subscriber (its claim,
//! its dead letters, how far its partition read).

use std::time::Duration;

use serde_json::Value;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use crate::error::StoreError;
use crate::schema::Schema;
use walfold_pg::{FromRow, RowExt};

/// Up to `$6` events after seq `$1` that pass the filters (`null`: any): aggregate ID
/// `$2`, aggregate type `$3`, event type `$4`, committed (else appended) at or after `$5`,
/// source `$7`. Keyset pages over the primary key; the other filters have no index in
/// the log, so on a big log they scan it (once, page by page), like any ad-hoc query.
/// `at` is in the format of [`SINCE_AGO`] and [`SINCE_TIME`], which it is compared with.
const PAGE: &str =
    "select seq, coalesce(claim_seq, seq) as claim_seq, event_id, aggregate_type, aggregate_id, event_type, version, partition_hash, \
     to_char(coalesce(committed_at, appended_at) at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') as at, \
     json_build_object('seq', seq, 'event_id', event_id, 'producer_id', producer_id, \
       'aggregate_type', aggregate_type, \
       'aggregate_id', aggregate_id, 'event_type', event_type, 'version', version, \
       'payload', payload, 'headers', headers, 'occurred_at', occurred_at, \
       'committed_at', committed_at, 'appended_at', appended_at, 'source', source, \
       'source_lsn', source_lsn::text, \
       'phantom', exists (select from {schema}.phantom_event p \
         where p.event_id = event_log.event_id and p.accepted_at is null), \
       'accepted_phantom', (select coalesce(p.accept_reason, '') from {schema}.phantom_event p \
         where p.event_id = event_log.event_id and p.accepted_at is not null))::text as json \
     from {schema}.event_log \
     where seq > $1 \
       and ($2::text is null or aggregate_id = $2) \
       and ($3::text is null or aggregate_type = $3) \
       and ($4::text is null or event_type = $4) \
       and ($5::text is null or coalesce(committed_at, appended_at) >= $5::text::timestamptz) \
       and ($7::text is null or source = $7) \
     order by seq limit $6";

/// The server's time `$1` seconds ago, UTC.
const SINCE_AGO: &str = "select to_char((now() - make_interval(secs => $1)) at time zone 'UTC', \
     'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') as at";

/// Timestamp `$1` as the server reads it, UTC.
const SINCE_TIME: &str = "select to_char($1::text::timestamptz at time zone 'UTC', \
     'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') as at";

/// Whether this target holds state of subscriber `$1` or names it (a rebuild's new ID,
/// or the one a rebuild replaced).
const KNOWS: &str = "select exists (select 1 from {schema}.checkpoint where subscriber_id = $1) \
     or exists (select 1 from {schema}.projection where subscriber_id = $1) \
     or exists (select 1 from {schema}.rebuild where subscriber_id = $1 or previous_subscriber = $1) \
     as known";

/// Whether subscriber `$1` has a checkpoint or a claim.
const HAS_READ: &str =
    "select exists (select 1 from {schema}.checkpoint where subscriber_id = $1) \
     or exists (select 1 from {schema}.processed_message where subscriber_id = $1) as known";

/// Every subscriber with a checkpoint, by name.
const CHECKPOINTED: &str = "select distinct subscriber_id from {schema}.checkpoint order by 1";

/// The projection that subscriber `$1` rebuilds or served (a rebuild's), else serves
/// (the registry's).
const PROJECTION_OF: &str = "select projection from {schema}.rebuild \
     where subscriber_id = $1 or previous_subscriber = $1 \
     union all select name from {schema}.projection where subscriber_id = $1 \
     limit 1";

/// Subscriber `$1`'s claims on the events with IDs `$2` and claim seqs `$3`: by seq, or
/// (a claim made before claims had seqs) by ID. Two indexed reads.
const CLAIMS: &str = "select message_id, to_json(processed_at) as processed_at \
     from {schema}.processed_message where subscriber_id = $1 and seq = any($3) \
     union all select message_id, to_json(processed_at) as processed_at \
     from {schema}.processed_message \
     where subscriber_id = $1 and seq is null and message_id = any($2)";

/// Subscriber `$1`'s dead letters of the seqs `$2`, oldest first.
const DEAD_LETTERS: &str =
    "select seq, json_build_object('id', id, 'reason', reason, 'status', status, \
     'error', error, 'attempts', attempts, 'last_failed_at', last_failed_at) as letter \
     from {schema}.dead_letter where subscriber_id = $1 and seq = any($2) order by id";

/// Subscriber `$1`'s checkpoint rows.
const POSITIONS: &str = "select partition, partitions, position from {schema}.checkpoint \
     where subscriber_id = $1";

/// What a page read of the log filters on (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    pub aggregate_id: Option<String>,
    pub aggregate_type: Option<String>,
    pub event_type: Option<String>,
    /// Committed (else appended) at or after this time, as `timestamptz` text.
    pub since: Option<String>,
    pub source: Option<String>,
}

/// One event of the log as `walfold events` prints it.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    pub seq: i64,
    /// The seq its claims are on (its first delivery's, for an event delivered again
    /// after pruning; see the store's `claim.rs`).
    pub claim_seq: i64,
    pub event_id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub version: Option<i64>,
    pub partition_hash: i32,
    /// Commit (else append) time, UTC, in the format of [`log_time`] and
    /// [`log_time_ago`] (so the two compare as text).
    pub at: Option<String>,
    /// The event as a JSON object.
    pub json: String,
}

/// Up to `limit` events after seq `after` that pass `filter`, in seq order.
pub async fn log_page(
    client: &Client,
    schema: &Schema,
    after: i64,
    filter: &LogFilter,
    limit: i64,
) -> Result<Vec<LoggedEvent>, StoreError> {
    let rows = client
        .query_typed(
            &schema.sql(PAGE),
            &[
                (&after, Type::INT8),
                (&filter.aggregate_id, Type::TEXT),
                (&filter.aggregate_type, Type::TEXT),
                (&filter.event_type, Type::TEXT),
                (&filter.since, Type::TEXT),
                (&limit, Type::INT8),
                (&filter.source, Type::TEXT),
            ],
        )
        .await
        .map_err(StoreError::db("reading the event log"))?;
    Ok(LoggedEvent::from_rows(&rows)?)
}

impl FromRow for LoggedEvent {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("event_log");
        Ok(LoggedEvent {
            seq: r.col("seq")?,
            claim_seq: r.col("claim_seq")?,
            event_id: r.col("event_id")?,
            aggregate_type: r.col("aggregate_type")?,
            aggregate_id: r.col("aggregate_id")?,
            event_type: r.col("event_type")?,
            version: r.col("version")?,
            partition_hash: r.col("partition_hash")?,
            at: r.col("at")?,
            json: r.col("json")?,
        })
    }
}

/// The server's time `ago` before now, as [`LoggedEvent::at`] writes times.
pub async fn log_time_ago(client: &Client, ago: Duration) -> Result<String, StoreError> {
    Ok(client
        .query_one(SINCE_AGO, &[&ago.as_secs_f64()])
        .await
        .map_err(StoreError::db("reading the server's time"))?
        .of("the server's time")
        .col("at")?)
}

/// Timestamp `text` as the server reads it, as [`LoggedEvent::at`] writes times.
pub async fn log_time(client: &Client, text: &str) -> Result<String, StoreError> {
    Ok(client
        .query_one(SINCE_TIME, &[&text])
        .await
        .map_err(StoreError::db("reading a timestamp"))?
        .of("a timestamp")
        .col("at")?)
}

/// Whether this target holds `subscriber`'s state or names it in a rebuild.
pub async fn knows_subscriber(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .query_one(&schema.sql(KNOWS), &[&subscriber])
        .await
        .map_err(StoreError::db("looking for the subscriber"))?
        .of("checkpoint")
        .col("known")?)
}

/// Whether `subscriber` has read anything: a checkpoint or a claim.
pub async fn subscriber_has_read(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .query_one(&schema.sql(HAS_READ), &[&subscriber])
        .await
        .map_err(StoreError::db("looking for the subscriber"))?
        .of("checkpoint")
        .col("known")?)
}

/// The subscribers with a checkpoint, by name.
pub async fn checkpointed_subscribers(
    client: &Client,
    schema: &Schema,
) -> Result<Vec<String>, StoreError> {
    client
        .query(&schema.sql(CHECKPOINTED), &[])
        .await
        .map_err(StoreError::db("reading checkpoints"))?
        .iter()
        .map(|r| Ok(r.of("checkpoint").col("subscriber_id")?))
        .collect()
}

/// The projection `subscriber` rebuilds, served before a rebuild, or serves.
pub async fn projection_of(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_opt(&schema.sql(PROJECTION_OF), &[&subscriber])
        .await
        .map_err(StoreError::db(
            "reading rebuilds and the projection registry",
        ))?
        .map(|r| r.of("rebuild").col("projection"))
        .transpose()?)
}

/// What walfold recorded for one subscriber about some events.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub claims: Vec<Claim>,
    /// Oldest first: the last of a seq is its latest.
    pub dead_letters: Vec<DeadLetterAt>,
    /// Every checkpoint row of the subscriber.
    pub positions: Vec<PartitionPosition>,
}

/// A claim: the event went through the projection.
#[derive(Debug, Clone)]
pub struct Claim {
    pub event_id: Uuid,
    /// When, as JSON.
    pub processed_at: Value,
}

/// A dead letter of the event at `seq`.
#[derive(Debug, Clone)]
pub struct DeadLetterAt {
    pub seq: i64,
    /// Its ID, reason, status, error, attempts and last failure, as a JSON object.
    pub letter: Value,
}

/// How far one partition has read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPosition {
    pub partition: i32,
    pub partitions: i32,
    pub position: i64,
}

/// `subscriber`'s claims on the events `event_ids` (claim seqs `claim_seqs`), its dead
/// letters of `seqs`, and its checkpoints (indexed reads).
pub async fn recorded_for(
    client: &Client,
    schema: &Schema,
    subscriber: &str,
    event_ids: &[Uuid],
    claim_seqs: &[i64],
    seqs: &[i64],
) -> Result<Recorded, StoreError> {
    let claims = client
        .query(&schema.sql(CLAIMS), &[&subscriber, &event_ids, &claim_seqs])
        .await
        .map_err(StoreError::db("reading claims"))?;
    let dead_letters = client
        .query(&schema.sql(DEAD_LETTERS), &[&subscriber, &seqs])
        .await
        .map_err(StoreError::db("reading dead letters"))?;
    let positions = client
        .query(&schema.sql(POSITIONS), &[&subscriber])
        .await
        .map_err(StoreError::db("reading checkpoints"))?;
    Ok(Recorded {
        claims: Claim::from_rows(&claims)?,
        dead_letters: DeadLetterAt::from_rows(&dead_letters)?,
        positions: PartitionPosition::from_rows(&positions)?,
    })
}

impl FromRow for Claim {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("processed_message");
        Ok(Claim {
            event_id: r.col("message_id")?,
            processed_at: r.col("processed_at")?,
        })
    }
}

impl FromRow for DeadLetterAt {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("dead_letter");
        Ok(DeadLetterAt {
            seq: r.col("seq")?,
            letter: r.col("letter")?,
        })
    }
}

impl FromRow for PartitionPosition {
    fn from_row(row: &Row) -> Result<Self, walfold_pg::PgError> {
        let r = row.of("checkpoint");
        Ok(PartitionPosition {
            partition: r.col("partition")?,
            partitions: r.col("partitions")?,
            position: r.col("position")?,
        })
    }
}
