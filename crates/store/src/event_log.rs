//! The event log: every outbox event once, in source commit order. One appender writes
//! it, a batch per transaction, together with the ingest position (the end LSN of the
//! last source transaction whose events are all in the log). The slot is acknowledged
//! only up to that position, and only after the transaction commits.

use std::collections::HashSet;
use std::time::SystemTime;

use serde_json::Value;
use tokio_postgres::types::{PgLsn, Type};
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;
use walfold_event::{
    partition_hash, DeadLetter, Event, GapReason, JsonText, Lsn, NewEvent, Reason,
};

use crate::dead_letter::DeadLetters;
use crate::error::StoreError;
use crate::jsonb::Jsonb;
use crate::log_order::{LogOrder, Turn};
use crate::schema::Schema;
use walfold_pg::RowExt;
use walfold_pg::SERVER_KEEPALIVES;

/// What one append did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    pub appended: u64,
    /// Same ID, same content: already in the log.
    pub duplicates: u64,
    /// Same ID, different content: quarantined as `id_conflict`.
    pub id_conflicts: u64,
}

/// Ingest counters that travel with an append.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestCounts {
    pub malformed: u64,
    /// Updates, deletes and truncates of outbox tables (not events).
    pub ignored_changes: u64,
}

/// An appender's handle on the event log: one per slot, all of a schema in one process
/// (the appender lock of [`LogOrder`]).
pub struct EventLog {
    client: Client,
    schema: Schema,
    slot: String,
    /// The log's head as of this appender's last turn.
    head: i64,
    order: std::sync::Arc<LogOrder>,
    /// The `[[source]]` whose events this handle appends.
    source: String,
    insert: Statement,
    /// The insert of a batch with payloads sent by COPY (not prepared: it names a
    /// temporary table that exists only once one was sent).
    insert_large: String,
    compare: Statement,
    position: Statement,
    read_position: Statement,
    dead_letters: DeadLetters,
    /// The leader's fence, checked in every append (the daemon's appender); `None` for a
    /// backfill, which runs only while no daemon appends (the appender lock).
    fence: Option<crate::leader::PreparedFence>,
    /// Whether this slot may have open phantoms (see [`CONFIRM_PHANTOMS`]): read at open,
    /// set when a failover's check records some.
    phantoms_open: std::sync::atomic::AtomicBool,
    /// Whether this handle appends what this process streams from the slot (see
    /// [`EventLog::streams`]).
    streams: bool,
}

/// Accepts slot `$1`'s open phantoms among the events `$2` (IDs) that its source has just
/// delivered again (appended, or a duplicate of the same content; `$3` the reason):
/// the new primary holds them after all. An application that retries a commit whose
/// acknowledgement the failover lost writes the same event again, after the failover's
/// check; left open, the phantom would keep that event out of every rebuild. Returns
/// the IDs accepted.
const CONFIRM_PHANTOMS: &str = "update {schema}.phantom_event set accepted_at = now(), \
     accept_reason = $3 where slot = $1 and event_id = any($2) and accepted_at is null \
     returning event_id";

/// The reason recorded on a phantom its source delivered again.
const DELIVERED_AGAIN: &str =
    "delivered again by its source after the failover: the new primary holds it";

/// [`CONFIRM_PHANTOMS`] for the events appended after seq `$2` up to `$4`.
const CONFIRM_PHANTOMS_APPENDED: &str = "update {schema}.phantom_event p \
     set accepted_at = now(), accept_reason = $3 from {schema}.event_log e \
     where p.slot = $1 and p.accepted_at is null and e.event_id = p.event_id \
       and e.seq > $2 and e.seq <= $4 \
     returning p.event_id";

/// Whether slot `$1` has open phantoms.
const PHANTOMS_OPEN: &str = "select exists (select from {schema}.phantom_event \
     where slot = $1 and accepted_at is null) as open";

/// Creates slot `$1`'s ingest position (source `$2`) at 0/0, unless it exists.
const CREATE_POSITION: &str =
    "insert into {schema}.ingest_position (slot, lsn, source) values ($1, '0/0', $2) \
     on conflict do nothing";

/// Slot `$1`'s recorded source, set to `$2` in the same statement.
const RENAME_SOURCE: &str =
    "with old as (select source from {schema}.ingest_position where slot = $1), \
     upd as (update {schema}.ingest_position set source = $2 \
       where slot = $1 and source <> $2) \
     select source from old";

/// Inserts a batch's events (arrays `$1`…`$12`, `$14` and `$15`, source `$13`) whose IDs
/// are not in the log yet; returns the inserted IDs. An ID pruning retired keeps its
/// first delivery's claim seq (see `claim`), and is inserted only with the content it
/// was retired with (its digest; [`COMPARE`] reports the others as conflicts).
const INSERT_EVENTS: &str =
    "insert into {schema}.event_log (seq, event_id, aggregate_type, aggregate_id, \
                 event_type, version, payload, headers, occurred_at, partition_hash, \
                 source_lsn, committed_at, bytes, producer_id, source, claim_seq) \
                 select u.seq, u.event_id, u.aggregate_type, u.aggregate_id, u.event_type, \
                 u.version, u.payload, u.headers, u.occurred_at, u.partition_hash, \
                 u.source_lsn, u.committed_at, u.bytes, u.producer_id, $13::text, r.claim_seq \
                 from (select distinct on (u.event_id) u.* from unnest($1::int8[], \
                 $2::uuid[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::jsonb[], \
                 $8::jsonb[], $9::timestamptz[], $10::int4[], $11::pg_lsn[], \
                 $12::timestamptz[], $14::int4[], $15::text[]) as u(seq, event_id, \
                 aggregate_type, aggregate_id, event_type, version, payload, headers, \
                 occurred_at, partition_hash, source_lsn, committed_at, bytes, producer_id) \
                 order by u.event_id, u.seq) u \
                 left join {schema}.retired_identity r on r.event_id = u.event_id \
                 where not exists (select from {schema}.event_log e where e.event_id = u.event_id) \
                 and (r.digest is null or r.digest = {schema}.identity_digest(u.event_type, \
                   u.aggregate_type, u.aggregate_id, u.version, u.payload)) \
                 returning event_id";

/// [`INSERT_EVENTS`] for a batch with payloads sent by COPY (see `large_payload`).
const INSERT_EVENTS_LARGE: &str = "insert into {schema}.event_log (seq, event_id, aggregate_type, \
                 aggregate_id, event_type, version, payload, headers, occurred_at, partition_hash, \
                 source_lsn, committed_at, bytes, producer_id, source, claim_seq) \
                 select u.seq, u.event_id, u.aggregate_type, u.aggregate_id, u.event_type, \
                 u.version, {payload}, u.headers, u.occurred_at, u.partition_hash, u.source_lsn, \
                 u.committed_at, u.bytes, u.producer_id, $13::text, r.claim_seq \
                 from (select distinct on (u.event_id) u.* from unnest($1::int8[], \
                 $2::uuid[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::jsonb[], \
                 $8::jsonb[], $9::timestamptz[], $10::int4[], $11::pg_lsn[], \
                 $12::timestamptz[], $14::int4[], $15::text[]) with ordinality as u(seq, event_id, \
                 aggregate_type, aggregate_id, event_type, version, payload, headers, \
                 occurred_at, partition_hash, source_lsn, committed_at, bytes, producer_id, n) \
                 order by u.event_id, u.seq) u \
                 left join {schema}.retired_identity r on r.event_id = u.event_id \
                 where not exists (select from {schema}.event_log e where e.event_id = u.event_id) \
                 and (r.digest is null or r.digest = {schema}.identity_digest(u.event_type, \
                   u.aggregate_type, u.aggregate_id, u.version, {payload})) \
                 returning event_id";

/// Compares a batch's repeated IDs (arrays `$1`…`$6`) with what the log holds, by the
/// event's position in the batch (`ord`, from 1); and with what an identity pruning
/// retired was (its digest), where the log no longer holds the event.
const COMPARE: &str = "with i as (select * from unnest($1::uuid[], $2::text[], $3::text[], \
                 $4::text[], $5::int8[], $6::jsonb[]) with ordinality \
                 as i(event_id, event_type, aggregate_type, aggregate_id, version, payload, ord)) \
                 select i.ord, (e.event_type = i.event_type and \
                 e.aggregate_type = i.aggregate_type and e.aggregate_id = i.aggregate_id and \
                 e.version is not distinct from i.version and e.payload = i.payload) as same, \
                 jsonb_build_object('seq', e.seq, 'event_id', e.event_id, \
                 'aggregate_type', e.aggregate_type, 'aggregate_id', e.aggregate_id, \
                 'event_type', e.event_type, 'version', e.version, 'payload', e.payload, \
                 'headers', e.headers) as existing \
                 from i join {schema}.event_log e on e.event_id = i.event_id \
                 union all \
                 select i.ord, false, jsonb_build_object('event_id', r.event_id, \
                 'claim_seq', r.claim_seq, 'retired_at', r.retired_at, 'pruned', true) \
                 from i join {schema}.retired_identity r on r.event_id = i.event_id \
                 where r.digest <> {schema}.identity_digest(i.event_type, i.aggregate_type, \
                   i.aggregate_id, i.version, i.payload) \
                 and not exists (select from {schema}.event_log e where e.event_id = i.event_id)";

/// Moves slot `$1`'s ingest position to `$2` (never back) and adds the counts `$3`…`$7`;
/// `$8`: whether the write vouches for the acknowledgements from here on, which it does
/// only when it moves the position too (see [`EventLog::streams`]).
const UPDATE_POSITION: &str = "update {schema}.ingest_position set lsn = greatest(lsn, $2), \
                 appended = appended + $3, duplicates = duplicates + $4, \
                 id_conflicts = id_conflicts + $5, malformed = malformed + $6, \
                 ignored_changes = ignored_changes + $7, updated_at = now(), \
                 paused_since = null, pause_error = null, stopped = false, acks_recorded = acks_recorded or ($8 and $2 > '0/0'::pg_lsn) \
                 where slot = $1";

/// Slot `$1`'s ingest position.
const READ_POSITION: &str = "select lsn from {schema}.ingest_position where slot = $1";

/// Records that slot `$1` is read through publication `$2`.
const RECORD_PUBLICATION: &str =
    "update {schema}.ingest_position set publication = $2 where slot = $1";

/// The other slots (than `$2`) that source `$1` ingested through.
const OTHER_SLOTS: &str = "select slot, lsn from {schema}.ingest_position \
     where source = $1 and slot <> $2 and lsn > '0/0' order by slot";

/// Opens slot `$1`'s gap (reason `$2`) from `$3`, unless one is open.
const OPEN_GAP: &str =
    "insert into {schema}.slot_gap (slot, reason, from_lsn) values ($1, $2, $3) \
     on conflict (slot) where to_lsn is null do nothing";

/// Closes slot `$1`'s open gap at `$2`; returns its start.
const CLOSE_GAP: &str =
    "update {schema}.slot_gap set to_lsn = $2 where slot = $1 and to_lsn is null \
     returning from_lsn";

/// Moves slot `$1`'s ingest position to `$2`, the start of a new slot (back, after a
/// failover to a server that was behind; on, past a recorded gap).
const MOVE_POSITION: &str = "update {schema}.ingest_position set lsn = $2 where slot = $1";

impl EventLog {
    /// Opens the log for appending `slot`'s events (of the source named `source`) on its own connection, in turns
    /// taken from `order` (shared by every slot appending to this schema).
    pub async fn open(
        client: Client,
        schema: &Schema,
        slot: &str,
        source: &str,
        order: std::sync::Arc<LogOrder>,
    ) -> Result<Self, StoreError> {
        // The slot is acknowledged after this connection's commits: they must be durable
        // whatever the server's or role's default.
        client
            .batch_execute(&format!("set synchronous_commit = on; {SERVER_KEEPALIVES}"))
            .await
            .map_err(StoreError::db("configuring the appender session"))?;
        let turn = order.turn().await?;
        let head = turn.head();
        turn.advance_none();
        client
            .execute(&schema.sql(CREATE_POSITION), &[&slot, &source])
            .await
            .map_err(StoreError::db("creating the ingest position"))?;
        // A slot whose source was renamed: say what the events before carry.
        let recorded: String = client
            .query_one(&schema.sql(RENAME_SOURCE), &[&slot, &source])
            .await
            .map_err(StoreError::db("reading the ingest position's source"))?
            .of("ingest_position")
            .col("source")?;
        if recorded != source {
            tracing::warn!(slot, was = %recorded, now = %source, "this slot's source was renamed: events appended before carry the old name (list both in a projection's `sources` to keep them)");
        }
        let prepare = |statement: &'static str, what: &'static str| {
            let (client, sql) = (&client, schema.sql(statement));
            async move {
                client
                    .prepare(&sql)
                    .await
                    .map_err(StoreError::db(format!("preparing {what}")))
            }
        };
        // Not `on conflict do nothing`: that is a speculative insertion, and a source
        // that decodes this database (the target is often the source) cannot stream a
        // transaction while one is half done, so it spills a large append to disk. One
        // appender holds the lock, so nobody else inserts between the check and the row.
        let insert = prepare(INSERT_EVENTS, "the event insert").await?;
        let compare = prepare(COMPARE, "the duplicate comparison").await?;
        let position = prepare(UPDATE_POSITION, "the ingest position update").await?;
        let read_position = prepare(READ_POSITION, "the ingest position read").await?;
        let dead_letters = DeadLetters::prepare_for(&client, schema, Some(source)).await?;
        let phantoms_open: bool = client
            .query_one(&schema.sql(PHANTOMS_OPEN), &[&slot])
            .await
            .map_err(StoreError::db("reading the slot's open phantoms"))?
            .of("phantom_event")
            .col("open")?;
        Ok(EventLog {
            read_position,
            client,
            schema: schema.clone(),
            slot: slot.to_owned(),
            head,
            order,
            source: source.to_owned(),
            insert,
            insert_large: insert_large_sql(schema),
            compare,
            position,
            dead_letters,
            fence: None,
            phantoms_open: phantoms_open.into(),
            streams: false,
        })
    }

    /// Marks this handle as the one appending what this process streams from the slot:
    /// its position writes set `acks_recorded`, which makes a slot found past the
    /// recorded position at the next start a gap.
    ///
    /// Why only these writes. `acks_recorded` says that every acknowledgement the slot
    /// received since was of a position recorded first, so that a slot past the recorded
    /// position was moved by something else. A release before acknowledgements followed
    /// the recorded position acknowledged keepalives without writing, and its final
    /// standby status on SIGTERM can pass what it recorded. A write made before this
    /// process streams (a start's gap backfill, `walfold backfill`, a slot's first
    /// position) comes while such an instance may still hold the slot, or after its
    /// final acknowledgement, which nothing recorded: vouching then turns that
    /// acknowledgement into a false gap. Once this process streams, the slot is its own:
    /// any other walsender on it has ended, so its last acknowledgement is in the past,
    /// and every position this handle writes from here on is at least where the stream
    /// started (the slot's confirmed position, whoever moved it): a write that moves no
    /// position (a batch before its end marker) vouches for nothing, since a crash right
    /// after it would leave the older acknowledgement past the recorded position. An older release can never
    /// stream from it again (the schema refuses its leadership). The cost: a slot moved
    /// by someone else between this release's first stream and its first write (at most
    /// a keepalive's 10 s, once, on the first start after an upgrade) is not detected;
    /// from the first write on, every one is.
    pub fn streams(&mut self) {
        self.streams = true;
    }

    /// Notes that this slot has open phantoms: from now on each append accepts those its
    /// source delivers again ([`CONFIRM_PHANTOMS`]).
    pub(crate) fn note_phantoms(&self) {
        self.phantoms_open
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Other slots this appender's source ingested through: (slot, position).
    pub async fn other_slots(&self) -> Result<Vec<(String, Lsn)>, StoreError> {
        let rows = self
            .client
            .query(&self.schema.sql(OTHER_SLOTS), &[&self.source, &self.slot])
            .await
            .map_err(StoreError::db("reading the source's other slots"))?;
        rows.iter()
            .map(|r| {
                let r = r.of("ingest_position");
                Ok((r.col("slot")?, r.col::<PgLsn>("lsn")?.into()))
            })
            .collect()
    }

    /// Every append from now on proves in its transaction that this instance leads.
    pub async fn fence_with(&mut self, fence: &crate::leader::Fence) -> Result<(), StoreError> {
        self.fence = Some(fence.prepare(&self.client).await?);
        Ok(())
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Runs one statement in a transaction that proves leadership (when this log is
    /// fenced): a small write beside the appends, on the appender's own connection.
    pub(crate) async fn fenced_execute(
        &mut self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<u64, StoreError> {
        let tx = self
            .client
            .transaction()
            .await
            .map_err(StoreError::db(context))?;
        if let Some(fence) = &self.fence {
            fence.check(&tx).await?;
        }
        let n = tx
            .execute(sql, params)
            .await
            .map_err(StoreError::db(context))?;
        tx.commit().await.map_err(StoreError::db(context))?;
        Ok(n)
    }

    pub(crate) fn schema(&self) -> &Schema {
        &self.schema
    }

    pub(crate) fn slot(&self) -> &str {
        &self.slot
    }

    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The last appended sequence number.
    pub fn head(&self) -> i64 {
        self.head
    }

    /// Whether a `wait_for` waits for this source's ingest to move (see
    /// [`crate::wait::ingest_awaited`]); false when it cannot tell.
    pub async fn ingest_awaited(&self) -> bool {
        crate::wait::ingest_awaited(&self.client, &self.source)
            .await
            .unwrap_or(false)
    }

    /// The durable ingest position: every source transaction ending at or before it is
    /// in the log.
    pub async fn durable_lsn(&self) -> Result<Lsn, StoreError> {
        let row = self
            .client
            .query_one(&self.read_position, &[&self.slot])
            .await
            .map_err(StoreError::db("reading the ingest position"))?;
        Ok(row.of("ingest_position").col::<PgLsn>("lsn")?.into())
    }

    /// Whether every position acknowledged to the slot was recorded first (false until
    /// a version that does so wrote the position): then a slot past the recorded
    /// position was moved by something other than walfold.
    pub async fn acks_recorded(&self) -> Result<bool, StoreError> {
        Ok(self
            .client
            .query_one(
                &self
                    .schema
                    .sql("select acks_recorded from {schema}.ingest_position where slot = $1"),
                &[&self.slot],
            )
            .await
            .map_err(StoreError::db("reading the ingest position"))?
            .of("ingest_position")
            .col("acks_recorded")?)
    }

    /// The publication this slot was last read through (`None`: not recorded, as before
    /// walfold recorded it).
    pub async fn publication(&self) -> Result<Option<String>, StoreError> {
        crate::ingest_position::read_through(&self.client, &self.schema, &self.slot).await
    }

    /// Records that this slot is read through `publication` (the source checks passed).
    pub async fn record_publication(&self, publication: &str) -> Result<(), StoreError> {
        self.client
            .execute(
                &self.schema.sql(RECORD_PUBLICATION),
                &[&self.slot, &publication],
            )
            .await
            .map_err(StoreError::db("recording the slot's publication"))?;
        Ok(())
    }

    /// The publication's signature when walfold last recorded it, and the slot's
    /// confirmed position then (see the `publication_signature` migration).
    pub async fn publication_signature(&self) -> Result<Option<(String, Lsn)>, StoreError> {
        let row = self
            .client
            .query_one(
                &self.schema.sql(
                    "select publication_signature, publication_checked_at \
                     from {schema}.ingest_position where slot = $1",
                ),
                &[&self.slot],
            )
            .await
            .map_err(StoreError::db("reading the publication's signature"))?;
        let row = row.of("ingest_position");
        let signature: Option<String> = row.col("publication_signature")?;
        let at: Option<PgLsn> = row.col("publication_checked_at")?;
        Ok(signature.zip(at.map(Lsn::from)))
    }

    /// Records the publication's `signature` as of the slot's confirmed position `at`.
    pub async fn record_publication_signature(
        &self,
        signature: &str,
        at: Lsn,
    ) -> Result<(), StoreError> {
        let at: PgLsn = at.into();
        self.client
            .execute(
                &self.schema.sql(
                    "update {schema}.ingest_position set publication_signature = $2, \
                     publication_checked_at = $3 where slot = $1",
                ),
                &[&self.slot, &signature, &at],
            )
            .await
            .map_err(StoreError::db("recording the publication's signature"))?;
        Ok(())
    }

    /// Appends `events` (in commit order) and `dead` rows in one transaction and moves
    /// the ingest position to `through` (when given). Returns only after the commit.
    pub async fn append(
        &mut self,
        events: &[NewEvent],
        dead: &[DeadLetter],
        through: Option<Lsn>,
        counts: IngestCounts,
    ) -> Result<AppendOutcome, StoreError> {
        // Only a transaction that assigns seqs needs the turn.
        let turn = if events.is_empty() {
            None
        } else {
            Some(self.order.turn().await?)
        };
        let head = turn.as_ref().map_or(self.head, Turn::head);
        let tx = self
            .client
            .transaction()
            .await
            .map_err(StoreError::db("starting an append"))?;
        let writer = Writer {
            source: &self.source,
            insert: &self.insert,
            insert_large: &self.insert_large,
            compare: &self.compare,
            dead_letters: &self.dead_letters,
            phantoms: phantoms_slot(&self.phantoms_open, &self.slot),
            schema: &self.schema,
        };
        let (outcome, next_seq) = writer.write(&tx, head, events, dead).await?;
        let ending = Ending {
            position: &self.position,
            fence: self.fence.as_ref(),
            slot: &self.slot,
            vouches: self.streams,
        };
        ending.commit(tx, through, outcome, counts).await?;
        if let Some(turn) = turn {
            turn.advance(next_seq);
            self.head = next_seq;
        }
        Ok(outcome)
    }

    pub(crate) fn parts(&mut self) -> Parts<'_> {
        Parts {
            client: &mut self.client,
            writer: Writer {
                source: &self.source,
                insert: &self.insert,
                insert_large: &self.insert_large,
                compare: &self.compare,
                dead_letters: &self.dead_letters,
                phantoms: phantoms_slot(&self.phantoms_open, &self.slot),
                schema: &self.schema,
            },
            ending: Ending {
                position: &self.position,
                fence: self.fence.as_ref(),
                slot: &self.slot,
                vouches: self.streams,
            },
            schema: &self.schema,
            slot: &self.slot,
            head: &mut self.head,
            order: &self.order,
        }
    }
}

/// Logs the phantoms of `slot` a delivery accepted (`rows`: their IDs).
fn confirmed(slot: &str, rows: &[Row]) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids = rows
        .iter()
        .map(|r| r.of("phantom_event").col::<Uuid>("event_id"))
        .collect::<Result<Vec<_>, _>>()?;
    tracing::warn!(slot, accepted = ids.len(), first = ?&ids[..ids.len().min(10)], "phantoms delivered again by the new primary (a producer retried its commit): accepted, so reads of the log include them again");
    Ok(())
}

/// The slot whose open phantoms an append confirms, when it may have some.
fn phantoms_slot<'a>(open: &std::sync::atomic::AtomicBool, slot: &'a str) -> Option<&'a str> {
    open.load(std::sync::atomic::Ordering::Relaxed)
        .then_some(slot)
}

/// The event log's connection and statements, borrowed apart for a transaction that
/// writes in several steps (a streamed transaction's move from its staging rows).
pub(crate) struct Parts<'a> {
    pub(crate) client: &'a mut Client,
    pub(crate) writer: Writer<'a>,
    pub(crate) ending: Ending<'a>,
    pub(crate) schema: &'a Schema,
    pub(crate) slot: &'a str,
    pub(crate) head: &'a mut i64,
    pub(crate) order: &'a LogOrder,
}

/// Appends events with the duplicate and `id_conflict` rules, inside a transaction.
#[derive(Clone, Copy)]
pub(crate) struct Writer<'a> {
    /// The source whose events this appender writes.
    source: &'a str,
    insert: &'a Statement,
    insert_large: &'a str,
    compare: &'a Statement,
    dead_letters: &'a DeadLetters,
    /// The slot, when it may have open phantoms to confirm.
    phantoms: Option<&'a str>,
    schema: &'a Schema,
}

/// Ends an append: the ingest position, the leader fence, the commit.
#[derive(Clone, Copy)]
pub(crate) struct Ending<'a> {
    position: &'a Statement,
    fence: Option<&'a crate::leader::PreparedFence>,
    slot: &'a str,
    /// Whether the position write sets `acks_recorded` (see [`EventLog::streams`]).
    vouches: bool,
}

impl<'a> Writer<'a> {
    pub(crate) fn source(&self) -> &'a str {
        self.source
    }

    /// [`Self::confirm_phantoms`] for the events appended in `tx` after seq `from`, up to
    /// `to` (a streamed transaction's move).
    pub(crate) async fn confirm_phantoms_appended(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        from: i64,
        to: i64,
    ) -> Result<(), StoreError> {
        let Some(slot) = self.phantoms else {
            return Ok(());
        };
        let rows = tx
            .query(
                &self.schema.sql(CONFIRM_PHANTOMS_APPENDED),
                &[&slot, &from, &DELIVERED_AGAIN, &to],
            )
            .await
            .map_err(StoreError::db("accepting phantoms delivered again"))?;
        confirmed(slot, &rows)
    }

    /// Writes `events` after `head` and the `dead` rows; returns what happened and the
    /// new head. Nothing is committed.
    pub(crate) async fn write(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        head: i64,
        events: &[NewEvent],
        dead: &[DeadLetter],
    ) -> Result<(AppendOutcome, i64), StoreError> {
        // One insert; an ID already in the log (or earlier in this batch) is not inserted
        // and is compared below against what the log holds. Skipped rows leave gaps in
        // `seq`, which only orders events.
        let mut inserted: HashSet<Uuid> = if events.is_empty() {
            HashSet::new()
        } else {
            insert_rows(
                tx,
                (self.insert, self.insert_large),
                self.source,
                head,
                events,
            )
            .await?
            .iter()
            .map(|r| r.of("event_log").col("event_id"))
            .collect::<Result<_, _>>()?
        };
        let mut compare = Vec::new();
        let mut outcome = AppendOutcome::default();
        // What the source delivered and the log now holds as sent: appended, or a
        // duplicate of the same content.
        let mut delivered = Vec::new();
        for e in events {
            if inserted.remove(&e.id) {
                outcome.appended += 1;
                delivered.push(e.id);
            } else {
                compare.push(e);
            }
        }
        let mut quarantined = Vec::new();
        let mut next_seq = head + events.len() as i64;
        if !compare.is_empty() {
            // Tests: a prune deleting the repeated IDs between the two statements.
            walfold_telemetry::failpoint::delay("append_before_compare").await;
            let rows = compare_rows(tx, self.compare, &compare).await?;
            let mut matched = vec![false; compare.len()];
            for row in rows {
                let row = row.of("event_log");
                let ord: i64 = row.col("ord")?;
                let same: bool = row.col("same")?;
                let Some(i) = usize::try_from(ord - 1).ok().filter(|&i| i < compare.len()) else {
                    continue;
                };
                matched[i] = true;
                if same {
                    outcome.duplicates += 1;
                    delivered.push(compare[i].id);
                } else {
                    outcome.id_conflicts += 1;
                    let e = compare[i];
                    tracing::warn!(event_id = %e.id, aggregate_type = %e.aggregate_type, aggregate_id = %e.aggregate_id, source_lsn = %e.source_lsn, "event ID already in the log with different content: quarantined as id_conflict (dead letter)");
                    quarantined.push(id_conflict(e, row.col::<Jsonb>("existing")?.0));
                }
            }
            // An ID that conflicted on insert but is gone by the comparison was pruned in
            // between (past its retention): it is new again, as it would have been a
            // moment later. Appended now, so it is never neither appended nor counted.
            let pruned: Vec<NewEvent> = compare
                .iter()
                .zip(&matched)
                .filter(|(_, m)| !**m)
                .map(|(e, _)| (*e).clone())
                .collect();
            if !pruned.is_empty() {
                let again: HashSet<Uuid> = insert_rows(
                    tx,
                    (self.insert, self.insert_large),
                    self.source,
                    next_seq,
                    &pruned,
                )
                .await?
                .iter()
                .map(|r| r.of("event_log").col("event_id"))
                .collect::<Result<_, _>>()?;
                for e in &pruned {
                    if again.contains(&e.id) {
                        outcome.appended += 1;
                        delivered.push(e.id);
                    } else {
                        // Refused by the digest of the identity that prune retired.
                        outcome.id_conflicts += 1;
                        quarantined.push(id_conflict(
                            e,
                            serde_json::json!({ "event_id": e.id, "pruned": true }),
                        ));
                    }
                }
                next_seq += pruned.len() as i64;
            }
        }
        for dl in dead.iter().chain(&quarantined) {
            self.dead_letters.record(tx, dl).await?;
        }
        self.confirm_phantoms(tx, &delivered).await?;
        Ok((outcome, next_seq))
    }

    /// Accepts this slot's open phantoms among `delivered` ([`CONFIRM_PHANTOMS`]), when
    /// it may have some: a statement only after a failover left phantoms. The one place
    /// that confirms a phantom by its redelivery.
    pub(crate) async fn confirm_phantoms(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        delivered: &[Uuid],
    ) -> Result<(), StoreError> {
        let Some(slot) = self.phantoms else {
            return Ok(());
        };
        if delivered.is_empty() {
            return Ok(());
        }
        let rows = tx
            .query(
                &self.schema.sql(CONFIRM_PHANTOMS),
                &[&slot, &delivered, &DELIVERED_AGAIN],
            )
            .await
            .map_err(StoreError::db("accepting phantoms delivered again"))?;
        confirmed(slot, &rows)
    }
}

impl Ending<'_> {
    /// Moves the ingest position to `through` (when given) with the counters, proves
    /// leadership, and commits.
    pub(crate) async fn commit(
        &self,
        tx: tokio_postgres::Transaction<'_>,
        through: Option<Lsn>,
        outcome: AppendOutcome,
        counts: IngestCounts,
    ) -> Result<(), StoreError> {
        let lsn: PgLsn = through.unwrap_or(Lsn::ZERO).into();
        let (appended, duplicates, conflicts) = (
            outcome.appended as i64,
            outcome.duplicates as i64,
            outcome.id_conflicts as i64,
        );
        let (malformed, ignored) = (counts.malformed as i64, counts.ignored_changes as i64);
        let position = async {
            tx.execute(
                self.position,
                &[
                    &self.slot,
                    &lsn,
                    &appended,
                    &duplicates,
                    &conflicts,
                    &malformed,
                    &ignored,
                    &self.vouches,
                ],
            )
            .await
            .map_err(StoreError::db("moving the ingest position"))
        };
        // Sent together: one round trip.
        match self.fence {
            Some(fence) => {
                futures::try_join!(fence.check(&tx), position)?;
            }
            None => {
                position.await?;
            }
        }
        tx.commit()
            .await
            .map_err(StoreError::db("committing an append"))
    }

    /// Proves leadership inside `tx` (a write that moves no position).
    pub(crate) async fn check_fence(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), StoreError> {
        match self.fence {
            Some(fence) => fence.check(tx).await,
            None => Ok(()),
        }
    }
}

async fn insert_rows(
    tx: &tokio_postgres::Transaction<'_>,
    (insert, insert_large): (&Statement, &str),
    source: &str,
    head: i64,
    new: &[NewEvent],
) -> Result<Vec<Row>, StoreError> {
    let n = new.len();
    let seqs: Vec<i64> = (1..=n as i64).map(|i| head + i).collect();
    let ids: Vec<Uuid> = new.iter().map(|e| e.id).collect();
    let agg_types: Vec<&str> = new.iter().map(|e| e.aggregate_type.as_str()).collect();
    let agg_ids: Vec<&str> = new.iter().map(|e| e.aggregate_id.as_str()).collect();
    let types: Vec<&str> = new.iter().map(|e| e.event_type.as_str()).collect();
    let versions: Vec<Option<i64>> = new.iter().map(|e| e.version).collect();
    let payloads: Vec<Option<&JsonText>> = new.iter().map(|e| Some(&e.payload)).collect();
    let large = crate::large_payload::upload(tx, &payloads).await?;
    let bytes: Vec<i32> = new.iter().map(|e| payload_bytes(&e.payload)).collect();
    let headers: Vec<Option<&JsonText>> = new.iter().map(|e| e.headers.as_ref()).collect();
    let occurred: Vec<Option<SystemTime>> = new.iter().map(|e| e.occurred_at).collect();
    let hashes: Vec<i32> = new
        .iter()
        .map(|e| partition_hash(&e.aggregate_type, &e.aggregate_id))
        .collect();
    let lsns: Vec<PgLsn> = new.iter().map(|e| e.source_lsn.into()).collect();
    let committed: Vec<Option<SystemTime>> = new.iter().map(|e| e.committed_at).collect();
    let producers: Vec<Option<&str>> = new.iter().map(|e| e.producer_id.as_deref()).collect();
    let payloads = large.as_ref().unwrap_or(&payloads);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 15] = [
        &seqs, &ids, &agg_types, &agg_ids, &types, &versions, payloads, &headers, &occurred,
        &hashes, &lsns, &committed, &source, &bytes, &producers,
    ];
    match large {
        None => tx.query(insert, &params).await,
        Some(_) => tx.query(insert_large, &params).await,
    }
    .map_err(StoreError::db("appending events"))
}

/// [`INSERT_EVENTS_LARGE`] for `schema`.
fn insert_large_sql(schema: &Schema) -> String {
    schema.sql(
        &INSERT_EVENTS_LARGE.replace(
            "{payload}",
            &crate::large_payload::PAYLOAD
                .replace("{payload}", "u.payload")
                .replace("{n}", "u.n"),
        ),
    )
}

/// The `event_log.bytes` of a payload (a payload is at most 1 GB, as PostgreSQL's).
fn payload_bytes(payload: &JsonText) -> i32 {
    i32::try_from(payload.len()).unwrap_or(i32::MAX)
}

async fn compare_rows(
    tx: &tokio_postgres::Transaction<'_>,
    compare: &Statement,
    events: &[&NewEvent],
) -> Result<Vec<Row>, StoreError> {
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let agg_types: Vec<&str> = events.iter().map(|e| e.aggregate_type.as_str()).collect();
    let agg_ids: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    let versions: Vec<Option<i64>> = events.iter().map(|e| e.version).collect();
    let payloads: Vec<&JsonText> = events.iter().map(|e| &e.payload).collect();
    tx.query(
        compare,
        &[&ids, &types, &agg_types, &agg_ids, &versions, &payloads],
    )
    .await
    .map_err(StoreError::db("comparing repeated event IDs"))
}

/// The dead letter for an event ID already in the log with different content.
fn id_conflict(event: &NewEvent, existing: Value) -> DeadLetter {
    let error = if existing.get("pruned").is_some() {
        "event ID seen before with different content (its event was pruned; retired_identity keeps its digest)"
    } else {
        "event ID already in the log with different content"
    };
    DeadLetter {
        existing: Some(existing),
        ..DeadLetter::ingest(event, Reason::IdConflict, error.into())
    }
}

/// Slot gaps: WAL ranges a recreated slot skipped (`on_slot_lost = "recreate"`). A gap
/// is opened (its start recorded) before the new slot is created and closed with the
/// slot's start once it exists, so a crash in between leaves an open gap that the next
/// start closes: never a loss without a record.
impl EventLog {
    /// Records that the WAL after `from` is being skipped, unless a gap is open already
    /// (a retry after a crash).
    pub async fn open_gap(&self, from: Lsn, reason: GapReason) -> Result<(), StoreError> {
        let from: PgLsn = from.into();
        self.client
            .execute(&self.schema.sql(OPEN_GAP), &[&self.slot, &reason, &from])
            .await
            .map_err(StoreError::db("recording a slot gap"))?;
        Ok(())
    }

    /// Closes the open gap, if any, at the new slot's start `to`. When `to` is before the
    /// gap's start (a failover to a server that was behind), the ingest position moves
    /// back to `to` as well. Returns the closed gap's start.
    pub async fn close_gap(&mut self, to: Lsn) -> Result<Option<Lsn>, StoreError> {
        let to_pg: PgLsn = to.into();
        let tx = self
            .client
            .transaction()
            .await
            .map_err(StoreError::db("closing a slot gap"))?;
        let from = tx
            .query_opt(&self.schema.sql(CLOSE_GAP), &[&self.slot, &to_pg])
            .await
            .map_err(StoreError::db("closing a slot gap"))?
            .map(|r| r.of("slot_gap").col::<PgLsn>("from_lsn").map(Lsn::from))
            .transpose()?;
        // The new slot starts at `to`: the position goes there, back (a failover to a
        // server that was behind) or on past the gap (the gap records what it skipped),
        // so the slot is never found past the recorded position by walfold's own doing.
        if from.is_some() {
            tx.execute(&self.schema.sql(MOVE_POSITION), &[&self.slot, &to_pg])
                .await
                .map_err(StoreError::db("moving the ingest position to the new slot"))?;
        }
        tx.commit()
            .await
            .map_err(StoreError::db("closing a slot gap"))?;
        Ok(from)
    }
}

/// A page of the event log for one subscriber partition.
#[derive(Debug, Clone)]
pub struct Page {
    pub events: Vec<Event>,
    /// Where the partition has read up to: the last event's seq when cut short by the
    /// limit, else the end of the window read (at most the log head).
    pub position: i64,
    /// The page reached the log head (cut short neither by the limit nor the window).
    pub caught_up: bool,
    /// Its events' payloads, in bytes.
    pub bytes: usize,
}

/// Filters of a subscriber partition.
#[derive(Debug, Clone)]
pub struct Filter {
    pub partition: u32,
    pub partitions: u32,
    pub event_types: Option<Vec<String>>,
    pub aggregate_types: Option<Vec<String>>,
    pub sources: Option<Vec<String>>,
}

impl Filter {
    /// Whether `event` is one of this partition's: the mirror of the page read's
    /// predicate (`page_predicate`), for pages read once and shared (keep the two in step).
    pub fn matches(&self, event: &Event) -> bool {
        (self.partitions == 1
            || partition_hash(&event.aggregate_type, &event.aggregate_id) % self.partitions as i32
                == self.partition as i32)
            && self
                .event_types
                .as_ref()
                .is_none_or(|t| t.contains(&event.event_type))
            && self
                .aggregate_types
                .as_ref()
                .is_none_or(|t| t.contains(&event.aggregate_type))
            && self
                .sources
                .as_ref()
                .is_none_or(|t| t.contains(&event.source))
    }

    /// Whether every event passes (a read for this filter can be shared).
    pub fn is_everything(&self) -> bool {
        self.partitions == 1
            && self.event_types.is_none()
            && self.aggregate_types.is_none()
            && self.sources.is_none()
    }
}

/// The predicate of a page read on `l` (an `event_log` row): partition `$3` of `$2`,
/// filters `$4`, `$5`, `$7`, and no open phantom (an event of a failed-over source that
/// the new primary does not have: a rebuild leaves it out). [`Filter::matches`] is its
/// mirror for pages read once and shared (keep the two in step).
macro_rules! page_predicate {
    () => {
        "($2::int4 = 1 or l.partition_hash % $2::int4 = $3::int4) \
         and ($4::text[] is null or l.event_type = any($4::text[])) \
         and ($5::text[] is null or l.aggregate_type = any($5::text[])) \
         and ($7::text[] is null or l.source = any($7::text[])) \
         and not exists (select from {schema}.phantom_event f \
           where f.event_id = l.event_id and f.accepted_at is null)"
    };
}

/// Up to `$6` events after seq `$1` and at most `$8` that pass `page_predicate`, cut
/// once they hold `$9` bytes of payload (the first is always read), each row with the
/// head `h` and how many the cut left out (one row with null event columns when none
/// passes). An event appended before `bytes` was recorded counts as its stored size.
///
/// The cut is made over the candidates' seqs and sizes alone (`cut`: the last seq kept),
/// then the rows up to it are read whole: window functions over whole rows copied every
/// payload into their buffers (~40 % of the read's server time). Both scans are in one
/// statement, so one snapshot: the rows up to `cut.last` that pass are the ones kept.
const READ_PAGE: &str = concat!(
    "with head as (select coalesce(max(seq), 0) as h from {schema}.event_log), \
     cand as ( \
       select l.seq, coalesce(l.bytes, pg_column_size(l.payload)) as size \
       from {schema}.event_log l, head \
       where l.seq > $1 and l.seq <= $8 and l.seq <= head.h and ",
    page_predicate!(),
    " order by l.seq limit $6), \
     cut as ( \
       select count(*) as matched, \
         count(*) filter (where c.n = 1 or c.through <= $9) as kept, \
         max(c.seq) filter (where c.n = 1 or c.through <= $9) as last \
       from (select seq, sum(size) over (order by seq) as through, \
         row_number() over (order by seq) as n from cand) c) \
     select head.h, e.seq, e.claim_seq, e.event_id, e.aggregate_type, e.aggregate_id, \
       e.event_type, e.version, e.payload, e.headers, e.occurred_at, e.source_lsn, \
       e.committed_at, e.source, cut.matched - cut.kept as left_out \
     from head cross join cut left join lateral ( \
       select l.seq, coalesce(l.claim_seq, l.seq) as claim_seq, l.event_id, \
         l.aggregate_type, l.aggregate_id, l.event_type, l.version, l.payload, l.headers, \
         l.occurred_at, l.source_lsn, l.committed_at, l.source \
       from {schema}.event_log l \
       where l.seq > $1 and l.seq <= $8 and l.seq <= cut.last and ",
    page_predicate!(),
    " order by l.seq) e on true"
);

/// The events with the seqs `$1`, in seq order.
const READ_EVENTS: &str =
    "select seq, coalesce(claim_seq, seq) as claim_seq, event_id, aggregate_type, \
     aggregate_id, event_type, version, payload, headers, occurred_at, source_lsn, \
     committed_at, source from {schema}.event_log where seq = any($1) order by seq";

/// The page read of [`read_page`].
pub fn read_sql(schema: &Schema) -> String {
    schema.sql(READ_PAGE)
}

/// Seqs one read looks at, in pages of its limit per partition: the bound on its work.
const WINDOW_PAGES: i64 = 2;

/// Reads up to `limit` events after `after` for a partition (one statement, one snapshot),
/// among the next `limit × partitions × WINDOW_PAGES` seqs, and no more than `max_bytes`
/// of payload unless one event alone is larger.
///
/// `sql` is [`read_sql`], sent as an unnamed statement so every read is planned with its
/// parameters. The window bounds what a read costs whatever the planner believes: while
/// a backlog drains faster than autovacuum analyzes the log, the statistics put the
/// head far below the real one, and a read up to the head was planned as a bitmap scan
/// of everything after the position, sorted (~170 ms a read 130k events behind; the
/// good plan is an index range scan that stops at the limit). Parse, bind and execute
/// go in one round trip.
pub async fn read_page(
    client: &Client,
    sql: &str,
    after: i64,
    filter: &Filter,
    limit: i64,
    max_bytes: i64,
) -> Result<Page, StoreError> {
    let window = limit
        .saturating_mul(i64::from(filter.partitions.max(1)))
        .saturating_mul(WINDOW_PAGES);
    let end = after.saturating_add(window);
    let rows = client
        .query_typed(
            sql,
            &[
                (&after, Type::INT8),
                (&(filter.partitions as i32), Type::INT4),
                (&(filter.partition as i32), Type::INT4),
                (&filter.event_types, Type::TEXT_ARRAY),
                (&filter.aggregate_types, Type::TEXT_ARRAY),
                (&limit, Type::INT8),
                (&filter.sources, Type::TEXT_ARRAY),
                (&end, Type::INT8),
                (&max_bytes, Type::INT8),
            ],
        )
        .await
        .map_err(StoreError::db("reading the event log"))?;
    let head: i64 = rows
        .first()
        .map_or(Ok(after), |r| r.of("event_log").col("h"))?;
    let left_out: i64 = rows
        .first()
        .map_or(Ok(None), |r| {
            r.of("event_log").col::<Option<i64>>("left_out")
        })?
        .unwrap_or(0);
    let mut events = Vec::with_capacity(rows.len());
    let mut bytes = 0;
    // Each row's buffer goes as its event is made: a page of large payloads is not held
    // twice.
    for r in rows {
        if r.of("event_log").col::<Option<i64>>("seq")?.is_some() {
            let event = event_from_row(&r)?;
            bytes += event.payload.len();
            events.push(event);
        }
    }
    // Fewer than the limit and none left out for its size: every event of the window is
    // here, up to the head.
    let full = events.len() as i64 >= limit || left_out > 0;
    let caught_up = !full && end >= head;
    let position = if full {
        events.last().map_or(after, |e| e.seq)
    } else {
        head.min(end).max(after)
    };
    Ok(Page {
        events,
        position,
        caught_up,
        bytes,
    })
}

/// An event from a row holding the `event_log` columns, by name (in any order, beside
/// other columns).
fn event_from_row(row: &Row) -> Result<Event, StoreError> {
    let r = row.of("event_log");
    Ok(Event {
        seq: r.col("seq")?,
        claim_seq: r.col("claim_seq")?,
        id: r.col("event_id")?,
        aggregate_type: r.col("aggregate_type")?,
        aggregate_id: r.col("aggregate_id")?,
        event_type: r.col("event_type")?,
        version: r.col("version")?,
        payload: r.col("payload")?,
        headers: r.col("headers")?,
        occurred_at: r.col("occurred_at")?,
        source_lsn: r.col::<PgLsn>("source_lsn")?.into(),
        committed_at: r.col("committed_at")?,
        source: r.col("source")?,
    })
}

/// The events with these seqs, in seq order (those still in the log).
pub async fn read_events(
    client: &impl tokio_postgres::GenericClient,
    schema: &Schema,
    seqs: &[i64],
) -> Result<Vec<Event>, StoreError> {
    let rows = client
        .query(&schema.sql(READ_EVENTS), &[&seqs])
        .await
        .map_err(StoreError::db("reading events"))?;
    rows.iter().map(event_from_row).collect()
}

/// The distinct event types and aggregate types of the log's latest `limit` events, in
/// order; `None` without a log (`walfold doctor` compares projections' filters with them).
pub async fn latest_types(
    client: &Client,
    schema: &Schema,
    limit: i64,
) -> Result<Option<(Vec<String>, Vec<String>)>, StoreError> {
    if !log_exists(client, schema).await? {
        return Ok(None);
    }
    let row = client
        .query_one(
            &schema.sql(
                "with latest as (select event_type, aggregate_type from {schema}.event_log \
                 order by seq desc limit $1) \
                 select array(select distinct event_type from latest order by 1) as events, \
                 array(select distinct aggregate_type from latest order by 1) as aggregates",
            ),
            &[&limit],
        )
        .await
        .map_err(StoreError::db("reading the log's latest types"))?;
    let r = row.of("event_log");
    Ok(Some((r.col("events")?, r.col("aggregates")?)))
}

/// Events per second the log grew by, between its oldest kept event and its newest (two
/// index lookups); `None` without a log or with fewer than two events.
pub async fn event_rate(client: &Client, schema: &Schema) -> Result<Option<f64>, StoreError> {
    if !log_exists(client, schema).await? {
        return Ok(None);
    }
    let row = client
        .query_one(
            &schema.sql(
                "with b as (select min(seq) as lo, max(seq) as hi from {schema}.event_log) \
                 select (hi - lo)::float8 / nullif(extract(epoch from \
                   (select appended_at from {schema}.event_log where seq = hi) - \
                   (select appended_at from {schema}.event_log where seq = lo))::float8, 0) \
                 from b",
            ),
            &[],
        )
        .await
        .map_err(StoreError::db("reading the log's event rate"))?;
    Ok(row.of("event_log").col(0)?)
}

async fn log_exists(client: &Client, schema: &Schema) -> Result<bool, StoreError> {
    Ok(client
        .query_one(
            "select to_regclass($1) is not null",
            &[&schema.sql("{schema}.event_log")],
        )
        .await
        .map_err(StoreError::db("looking for the event log"))?
        .of("pg_class")
        .col(0)?)
}
